"""`python train.py --help-config`: every config key with its value, type, allowed values and
meaning, all read from the schema's field metadata (configs/schema.py).

The text is itself a valid config (values as YAML, the rest in comments), so a user can save it and
edit it: with no config it shows the defaults, with `--config FILE` (and overrides) that resolved
config, marking the keys that differ from their defaults.
"""
import json

import yaml

from common.intervals import parse_interval

from .loader import _type_name, apply_overrides, config_from_dict, config_to_dict, load_config
from .schema import CHOICES, RANGES, Config, schema_fields, section_names


def _yaml_value(value):
    """One value as YAML flow text: 'no' stays a string, lists stay on one line."""
    if isinstance(value, str):
        return yaml.safe_dump(value, default_style=None).splitlines()[0]
    return json.dumps(value)


def _facts(key, tp, default, value, help_text, range_doc=None):
    """'float, > 0, default 0.005; peak learning rate ...' for one key (range_doc: a range the
    schema cannot check itself, e.g. a head's k in [1, num_classes], checked by the head registry)."""
    facts = [_type_name(tp)]
    if key in CHOICES:
        facts.append("one of " + "|".join(CHOICES[key]))
    if key in RANGES:
        facts.append(parse_interval(RANGES[key]).describe())
    elif range_doc:
        facts.append(range_doc)
    if value != default:
        facts.append(f"default {_yaml_value(default)}")
    text = ", ".join(facts)
    return f"{text}; {help_text}" if help_text else text


def describe_config(cfg=None, source=None):
    """The help text: the defaults (cfg None), or `cfg` resolved from `source` (a file name)."""
    defaults = _flat(config_to_dict(Config()))
    values = _flat(config_to_dict(cfg)) if cfg is not None else defaults
    if cfg is None:
        lines = ["# Every config key: its default, type, allowed values and meaning (configs/schema.py).",
                 "# Set keys in a YAML file (--config FILE, which may extend another with base: FILE) or as",
                 "# key.sub=value overrides; `--help-config --config FILE` prints that file resolved."]
    else:
        lines = [f"# The resolved config of {source or 'the command line'}: every key, its value, type, allowed",
                 "# values and meaning; a key set away from its default names the default."]
    section = None
    for key, (f, tp) in schema_fields().items():
        head, _, leaf = key.rpartition(".")
        if head != (section or ""):
            section = head
            lines.append(f"{head}:")
        indent = "  " if head else ""
        facts = _facts(key, tp, defaults[key], values[key], f.metadata.get("help", ""), f.metadata.get("range_doc"))
        lines.append(f"{indent}{leaf}: {_yaml_value(values[key])}  # {facts}")
    lines.append(f"# sections: {', '.join(section_names())}")
    return "\n".join(lines)


def config_help(path=None, overrides=()):
    """`--help-config [--config PATH] [overrides]`: the defaults, or that config resolved."""
    if path is not None:
        return describe_config(load_config(path, overrides), path)
    if overrides:
        return describe_config(config_from_dict(apply_overrides({}, overrides)), "the command line")
    return describe_config()


def _flat(nested, prefix=""):
    out = {}
    for key, value in nested.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out
