"""Load, validate and save configs.

YAML files may extend another with `base: relative/path.yaml` (relative to the file, chained;
sections are merged key by key, the child wins). Command-line overrides `key.sub=value` parse the
value as a YAML scalar (`optim.lr=1e-3`, `train.ema=false`, `model.init_values=null`).

Every mistake is a one-line `UserError`: unknown key (file and line named, or the command line for
an override's; a valid key suggested only when it is close: `suggest_key`), wrong type (key, expected
type and where it was set named: a file's line, or the command line), malformed YAML
(file and line), missing file, an empty or non-mapping file, a file that is not UTF-8 (byte offset
named), a key given twice in one mapping at any depth (both lines named), bad choice, a number
that is not finite or outside its range (the schema's metadata), a YAML alias, an override into a
key that holds a value rather than a section. Values quoted in errors are cut short.

Why not OmegaConf: its structured configs coerce where this loader must refuse (a bool key takes
3, "no" or "yes"; a str key takes 3), and its YAML and override parsers read `no` as False.
"""
import dataclasses
import difflib
import math
import os
import typing

import yaml

from common import rundir
from common.errors import UserError
from common.intervals import parse_interval
from common.io import atomic_write_text
from common.suggest import closest, suggest_value
from models.mapping_table import check_pool_k
from models.registry import HPARAMS, check_settings

from .finetune_checks import check_finetune_settings
from .overrides import apply_overrides, parse_override
from .schema import CHOICES, RANGES, REPLACED_KEYS, Config, schema_fields, section_names
from .yaml12 import DuplicateKeyError, SafeLoaderYaml12Bools
from .yaml12 import show_value as _show

YAML_SUFFIX = ".yaml"  # the configs' file names (configs/*.yaml; a run's config.yaml)
# Where a key was set, when an override set it: the `sources` value a message names instead of a file's line.
COMMAND_LINE = "the command line"


# ----------------------------------------------------------------------------- reading YAML
def read_yaml_file(path, what="config file"):
    """The YAML document in `path` (None when empty), read as UTF-8 with this module's loader; a
    missing file, bytes that are not UTF-8, malformed YAML, an alias or a duplicate key is a
    one-line UserError naming the file (and the byte offset or line). -> (data, {dotted key: line})."""
    if os.path.isdir(path):
        raise UserError(f"{what} {path} is a folder, not a file; name a {YAML_SUFFIX} file{_files_in(path)}")
    if not os.path.isfile(path):
        raise UserError(f"{what} not found: {path}{_missing_file_hint(path)}")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UserError(f"{path} is not UTF-8 text (byte {err.start}: {raw[err.start:err.start + 1]!r} cannot be "
                        f"decoded); save it as UTF-8") from None
    loader = SafeLoaderYaml12Bools(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except DuplicateKeyError as err:
        first, second = err.lines
        raise UserError(f"{path}: key '{err.key}' is given twice (lines {first} and {second}); keep one") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"malformed YAML at {where}: {problem}") from None
    finally:
        loader.dispose()
    return data, _key_lines(node)


def _files_in(folder, shown=3):
    """' in it, e.g. F/a.yaml, F/b.yaml' for the first YAML files of a folder ('' when it has none)."""
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(YAML_SUFFIX))
    except OSError:
        names = []
    return f" in it, e.g. {', '.join(os.path.join(folder, n) for n in names[:shown])}" if names else ""


def _missing_file_hint(path):
    """'; did you mean X?' for a YAML file that does not exist: its .yaml twin for a .yml path, else the
    closest YAML file name in its folder; a .yml path without either is told the configs' suffix."""
    folder, name = os.path.split(path)
    stem, ext = os.path.splitext(path)
    if ext == ".yml" and os.path.isfile(stem + YAML_SUFFIX):
        return f"; did you mean {stem}{YAML_SUFFIX}?"
    try:
        names = [n for n in os.listdir(folder or os.curdir) if n.endswith((YAML_SUFFIX, ".yml"))]
    except OSError:
        names = []
    hint = closest(names, lambda n: (difflib.SequenceMatcher(None, name, n).ratio(),))
    if hint is not None:
        return f"; did you mean {os.path.join(folder, hint)}?"
    return f"; this project's configs end in {YAML_SUFFIX}" if ext == ".yml" else ""


def _key_lines(node, prefix=""):
    """{dotted key: line} of every scalar mapping key in a composed YAML node, at any depth."""
    lines = {}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                full = prefix + key_node.value
                lines[full] = key_node.start_mark.line + 1
                lines.update(_key_lines(value_node, full + "."))
    return lines


def _read_yaml(path):
    """A config file's mapping and {dotted key: 'path:line'}; an empty or non-mapping file is refused."""
    data, lines = read_yaml_file(path)
    if data is None:
        raise UserError(f"{path} is empty: a config is a mapping of sections (model:, head:, data:, optim:, "
                        f"train:); write {{}} for all defaults")
    if not isinstance(data, dict):
        raise UserError(f"{path}: a config must be a mapping of sections (model:, head:, data:, optim:, train:), "
                        f"got {type(data).__name__}")
    return data, {key: f"{path}:{line}" for key, line in lines.items()}


def _merge(base, child):
    """Deep merge: nested mappings merge key by key, anything else in `child` replaces `base`."""
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _load_chain(path, seen=()):
    """The merged mapping of `path` and its `base:` chain, and where each key was written (the
    child's place wins, as its value does)."""
    resolved = os.path.abspath(path)
    if resolved in seen:
        raise UserError(f"config inheritance cycle: {' -> '.join(seen + (resolved,))}")
    data, where = _read_yaml(path)
    bases = data.pop("base", None)
    where.pop("base", None)
    if bases is None:
        return data, where
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise UserError(f"{path}: 'base' must be a relative path (or a list of them)")
    merged, merged_where = {}, {}
    for base in bases:
        base_data, base_where = _load_chain(os.path.join(os.path.dirname(path), base), seen + (resolved,))
        merged = _merge(merged, base_data)
        merged_where.update(base_where)
    return _merge(merged, data), {**merged_where, **where}


def suggest_key(full_key):
    """The schema key closest to an unknown dotted key, or None when none is close enough.

    A candidate scores the higher of two difflib ratios: whole dotted names ('optim.lrr' vs
    'optim.lr'; sections too: 'modle' vs 'model') and last components ('lr' vs 'optim.lr',
    'train.epochs' vs 'optim.epochs'). Only scores >= SUGGEST_CUTOFF are suggested: no suggestion is
    better than a wrong one. Among equal scores a key of the same section wins, then the closer whole
    name ('haed.name': 'head.name', not the top-level 'name'). Keys added to the schema are candidates
    as soon as they exist."""
    leaf = full_key.rsplit(".", 1)[-1]
    section = full_key.rsplit(".", 1)[0] if "." in full_key else ""
    keys = schema_fields()

    def score(candidate):
        whole = difflib.SequenceMatcher(None, full_key, candidate).ratio()
        last = difflib.SequenceMatcher(None, leaf, candidate.rsplit(".", 1)[-1]).ratio() if candidate in keys else 0.0
        same_section = candidate.startswith(section + ".") if section else "." not in candidate
        return max(whole, last), same_section, whole

    return closest(list(keys) + list(section_names()), score)


def _dotted_keys(data, prefix):
    """The dotted keys of every value in the nested mapping `data`, depth first."""
    for key, value in data.items():
        if isinstance(value, dict):
            yield from _dotted_keys(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def _place(sources, key, file_form=" ({})"):
    """Where `key` was set, for a message: ' on the command line' for an override, the file and line (in
    `file_form`) for a file's key, '' when not known."""
    where = (sources or {}).get(key)
    if where is None:
        return ""
    return f" on {COMMAND_LINE}" if where == COMMAND_LINE else file_form.format(where)


def _unknown_key(full, names, sources, value=None):
    hint = suggest_key(full)
    if hint is None and isinstance(value, dict):  # a misspelt section: the keys under it say which was meant
        for key in _dotted_keys(value, full + "."):
            hint = suggest_key(key)
            if hint is not None:
                full = key  # 'haed.name', named with its suggestion 'head.name'
                break
    where = _place(sources, full, " at {}")
    tip = (f"; {REPLACED_KEYS[full]}" if full in REPLACED_KEYS else
           f"; did you mean '{hint}'?" if hint else
           f"; valid keys here: {', '.join(sorted(names))} (python train.py --help-config lists every key)")
    return UserError(f"unknown config key '{full}'{where}{tip}")


def _type_name(tp):
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        nullable = type(None) in typing.get_args(tp)
        return " or ".join(_type_name(a) for a in args) + (" or null" if nullable else "")
    if origin in (tuple, typing.Tuple):
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return "list of " + _type_name(args[0])
        return "list of " + ", ".join(_type_name(a) for a in args)
    return getattr(tp, "__name__", str(tp))


class _TypeMismatch(Exception):
    pass


def _coerce(value, tp):
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a)
            except _TypeMismatch:
                pass
        raise _TypeMismatch
    if origin in (tuple, typing.Tuple):
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise _TypeMismatch
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(v, args[0]) for v in value)
        if len(value) != len(args):
            raise _TypeMismatch
        return tuple(_coerce(v, a) for v, a in zip(value, args))
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _TypeMismatch
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise _TypeMismatch
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML reads '5e-3' (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise _TypeMismatch from None
        raise _TypeMismatch
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, bool):  # e.g. train.compile=true for a key whose choices include "true"
            return "true" if value else "false"
        raise _TypeMismatch
    return value  # other annotations: accepted as given


def _build(cls, data, prefix="", sources=None):
    """The dataclass `cls` from the nested dict `data`: unknown keys and wrong types refused in one
    line (`sources`: {dotted key: 'file:line'} where the key was written, for the message)."""
    sources = sources or {}
    if not isinstance(data, dict):
        raise UserError(f"'{prefix.rstrip('.')}' must be a mapping of keys, got {_show(data)} ({type(data).__name__})")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = prefix + str(key)
        if key not in names:
            raise _unknown_key(full, names, sources, value)
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value if value is not None else {}, full + ".", sources)
            continue
        try:
            kwargs[key] = _coerce(value, tp)
        except _TypeMismatch:
            where = _place(sources, full)
            raise UserError(f"config key '{full}' expects {_type_name(tp)}, got {_show(value)} "
                            f"({type(value).__name__}){where}") from None
    return cls(**kwargs)


def _leaves(obj, prefix=""):
    """(dotted key, value) of every key of a config dataclass, depth first."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, prefix + f.name + ".")
        else:
            yield prefix + f.name, value


def _check_numbers(cfg, sources=None):
    """Every float finite; every field of RANGES inside its interval (None allowed where typed so)."""
    for key, value in _leaves(cfg):
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise UserError(f"config key '{key}' must be a finite number, got {_show(value)}{_place(sources, key)}")
        if key in RANGES and value is not None:
            interval = parse_interval(RANGES[key])
            if not all(v in interval for v in values):
                raise UserError(f"config key '{key}' must be {interval.describe()}"
                                f"{' (each)' if isinstance(value, tuple) else ''}, got {_show(value)}"
                                f"{_place(sources, key)}")


def _check(cfg, sources=None):
    values = dict(_leaves(cfg))
    for key, choices in CHOICES.items():
        items = values[key] if isinstance(values[key], tuple) else (values[key],)  # a list: each of them
        bad = [v for v in items if v not in choices]
        if not items or bad:
            raise UserError(f"config key '{key}' must be one of {', '.join(choices)}"
                            f"{' (each)' if isinstance(values[key], tuple) else ''}; got {_show(values[key])}"
                            f"{_place(sources, key)}{suggest_value(bad[0], choices) if bad else ''}")
    _check_numbers(cfg, sources)
    check_head_settings(cfg.head)
    check_finetune_settings(cfg)
    model = cfg.model
    if model.pool != "hopfield" and (model.pool_mapping != "softmax" or model.pool_beta is not None
                                     or model.pool_k is not None):
        raise UserError(f"model.pool_mapping / model.pool_beta / model.pool_k set the hopfield pooling, but "
                        f"model.pool is '{model.pool}'; set model.pool=hopfield or drop them")
    if model.pool == "hopfield":
        check_pool_k(model.pool_mapping, model.pool_k)
    return cfg


def check_head_settings(head):
    """The head section by the heads' own rules (models/registry.py), every head's values (a typo
    fails at load even where the selected head ignores it) plus the selected head's cross-checks."""
    try:
        check_settings(head.name, {key: getattr(head, key) for key in HPARAMS}, every_head=True)
    except UserError as err:
        raise UserError(f"config key {err}") from None


def config_from_dict(data, default_name="run", sources=None):
    """Build and check a Config from a nested dict (a YAML file's, after overrides). `sources`:
    {dotted key: 'file:line', or COMMAND_LINE for an override's key (`with_overrides`)}, so that an unknown
    key, a wrong type, a bad choice or an out-of-range number names where it was set."""
    data = dict(data)
    data.setdefault("name", default_name)
    cfg = _check(_build(Config, data, sources=sources), sources)
    cfg.train.output_dir = cfg.train.output_dir.replace("{name}", cfg.name)
    return cfg


def with_overrides(data, sources, overrides):
    """`data` with the overrides applied (configs/overrides.py); each overridden key is no longer the
    file's: its place in `sources` becomes the command line, which a message about it then names."""
    for item in overrides or ():
        sources[item[0] if isinstance(item, tuple) else ".".join(parse_override(item)[0])] = COMMAND_LINE
    return apply_overrides(data, overrides)


def load_config(path, overrides=()):
    """Read `path` (following `base:` chains), apply `key.sub=value` overrides, validate."""
    data, sources = _load_chain(path)
    data = with_overrides(data, sources, overrides)
    return config_from_dict(data, default_name=os.path.splitext(os.path.basename(path))[0], sources=sources)


def _plain(value):
    return [_plain(v) for v in value] if isinstance(value, (list, tuple)) else value


def config_to_dict(cfg):
    """The one conversion of a config (or a section of one) to plain nested dicts and lists: its
    keys, tuples as lists. config.yaml and the resume fingerprint hold it."""
    return {f.name: config_to_dict(getattr(cfg, f.name)) if dataclasses.is_dataclass(getattr(cfg, f.name))
            else _plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def save_config(cfg, path):
    """Write the fully resolved config (every key) as YAML, atomically: a valid `--config` file."""
    atomic_write_text(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def load_run_config(run_dir, overrides=()):
    """The resolved config a training run saved (RUN_DIR/config.yaml; a file path works too)."""
    path = os.path.join(run_dir, rundir.CONFIG) if os.path.isdir(run_dir) else run_dir
    if not os.path.isfile(path):
        raise UserError(f"no {rundir.CONFIG} in {run_dir}: is it a run directory written by train.py?")
    data, sources = _read_yaml(path)
    data.pop("base", None)
    data = with_overrides(data, sources, overrides)
    return config_from_dict(data, default_name=os.path.basename(os.path.abspath(os.path.dirname(path))),
                            sources=sources)
