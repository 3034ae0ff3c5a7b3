"""The one override dialect of every command (train.py, eval.py, predict.py, scripts/export.py,
scripts/extract_features.py, scripts/compare_heads.py), documented once here:

    key.sub=value          anywhere on the line (after a list option such as --seeds 0 1 too)
    --key.sub value        the same, argparse-style (a dotted key after --)
    --key.sub=value

The value is parsed as a YAML 1.2 scalar (`optim.lr=1e-3` is a float, `train.ema=false` a bool,
`model.init_values=null` None, `train.mixed_precision=no` the string 'no'). A token that is the
value of an option taking one (`--runs-dir a=b`) is that option's value, not an override.
A command's typed flags (--head, --model, --img-size, ...) are set as `(key, value)` pairs, never
turned into text and parsed back. An unknown option that names a config key (`--seed 1`) is answered
with the key's override (`train.seed=1`). Standard library, PyYAML and the config schema only: it runs
before torch is imported.
"""
import re
import sys

import yaml

from common.errors import UserError

from .schema import schema_fields
from .yaml12 import safe_load, show_value

# a bare override: a (dotted) key, '=', a value, e.g. optim.epochs=1 (or name=run1)
BARE_OVERRIDE = re.compile(r"[A-Za-z_]\w*(\.\w+)*=")
# a --key.sub override: the dot tells it from the command's own --options
DASHED_KEY = re.compile(r"[A-Za-z_]\w*(\.\w+)+$")
DIALECT = "overrides look like key.sub=value or --key.sub VALUE"


def split_command_line(parser, argv):
    """(argv for `parser`, ['key.sub=value', ...]): the overrides taken out wherever they stand."""
    takes_value = {s for a in parser._actions if a.option_strings and a.nargs is None for s in a.option_strings}
    options, overrides, i = [], [], 0
    while i < len(argv):
        token = argv[i]
        is_value = i > 0 and argv[i - 1] in takes_value
        key = token[2:].split("=", 1)[0] if token.startswith("--") else None
        if is_value:
            options.append(token)
        elif key is not None and DASHED_KEY.match(key):
            if "=" in token:
                overrides.append(token[2:])
            elif i + 1 < len(argv):
                overrides.append(f"{key}={argv[i + 1]}")
                i += 1
            else:
                raise UserError(f"{token} needs a value (e.g. {token} VALUE)")
        elif BARE_OVERRIDE.match(token):
            overrides.append(token)
        else:
            options.append(token)
        i += 1
    return options, overrides


def parse_command_line(parser, argv, tool):
    """parser.parse_args with the overrides collected into args.overrides; anything neither an
    option nor an override is one line naming `tool` ('python eval.py') and the dialect."""
    options, overrides = split_command_line(parser, list(sys.argv[1:] if argv is None else argv))
    args, rest = parser.parse_known_args(options)
    if rest:
        hint = config_key_hint(rest)  # `--seed 1`: the config key train.seed, named with its override
        tail = f"{hint}; options are listed by {tool} --help" if hint else \
            f"options are listed by {tool} --help; {DIALECT} (anywhere on the line)"
        raise UserError(f"unexpected argument '{rest[0]}': {tail}")
    args.overrides = overrides
    return args


def config_key_hint(rest):
    """'train.seed is a config key, set as train.seed=1' when the unknown option rest[0] (`--seed 1`,
    `--seed=1`, `--batch-size 64`) names a config key; '' when no key's last part is its name."""
    flag, _, value = rest[0].partition("=")
    if not flag.startswith("--"):
        return ""
    if not value and len(rest) > 1 and not rest[1].startswith("-"):
        value = rest[1]
    name = flag[2:].replace("-", "_")
    keys = [key for key in schema_fields() if key.rsplit(".", 1)[-1] == name]
    if not keys:
        return ""
    value = value or "VALUE"
    if len(keys) == 1:
        return f"{keys[0]} is a config key, set as {keys[0]}={value}"
    return f"config keys {', '.join(keys)} are set as KEY=VALUE (e.g. {keys[-1]}={value})"


def parse_override(text):
    """'optim.lr=1e-3' -> (['optim', 'lr'], 0.001): the value is parsed as a YAML scalar."""
    text = text[2:] if text.startswith("--") else text
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"override {show_value(text)} must look like key.sub=value (e.g. optim.lr=1e-3)")
    try:
        value = safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # not valid YAML: keep it as a plain string, the type check decides
    return key.strip().split("."), value


def apply_overrides(data, overrides):
    """Set each override in the nested dict `data`: a `key.sub=value` string, or a typed flag's
    `("key.sub", value)` pair set as it is (missing sections are created; a section that holds a
    value, e.g. `optim: 3`, is not silently replaced)."""
    for item in overrides or ():
        keys, value = (item[0].split("."), item[1]) if isinstance(item, tuple) else parse_override(item)
        node = data
        for depth, k in enumerate(keys[:-1]):
            if node.get(k) is None:
                node[k] = {}
            elif not isinstance(node[k], dict):
                where = ".".join(keys[:depth + 1])
                raise UserError(f"override '{'.'.join(keys)}=...': '{where}' is {show_value(node[k])} in the config, "
                                f"not a "
                                f"section of keys; fix the config or override '{where}' itself")
            node = node[k]
        node[keys[-1]] = value
    return data

