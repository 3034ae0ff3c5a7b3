"""Load, validate and save configs.

YAML files may extend another with `base: relative/path.yaml` (relative to the file, chained;
sections are merged key by key, the child wins). Command-line overrides `key.sub=value` parse the
value as a YAML scalar (`optim.lr=1e-3`, `train.ema=false`, `model.init_values=null`).

Every mistake is a one-line `UserError`: unknown key (closest valid key suggested), wrong type
(key and expected type named), malformed YAML (file and line), missing file, bad choice, a number
that is not finite or outside its range (schema.RANGES), a YAML alias, an override into a key
that holds a value rather than a section. Values quoted in errors are cut short.

Why not OmegaConf: its structured configs coerce where this loader must refuse (a bool key takes
3, "no" or "yes"; a str key takes 3), and its YAML and override parsers read `no` as False.
"""
import dataclasses
import difflib
import math
import os
import re
import typing

import yaml

from common.io import atomic_write_text
from common.errors import UserError

from models.registry import HPARAMS, check_settings

from .schema import CHOICES, RANGES, Config

RUN_CONFIG_NAME = "config.yaml"


class _SafeLoaderYaml12Bools(yaml.SafeLoader):
    """yaml.SafeLoader (no object construction) whose booleans are YAML 1.2's: only true/false,
    and which refuses aliases.

    PyYAML follows YAML 1.1, where `no`, `yes`, `on`, `off` are booleans, so
    `train.mixed_precision=no` (Accelerate's own spelling) would arrive as False.
    Aliases (`*name`) are refused where they are met, before anything is expanded: a few hundred
    bytes of nested aliases expand to billions of nodes ("billion laughs"), and a config has no
    need for them (`base:` shares settings between files).
    """

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not allowed in a config; "
                                              "write the value out or share it with base:", self.peek_event().start_mark)
        return super().compose_node(parent, index)


_BOOL_TAG = "tag:yaml.org,2002:bool"
_SafeLoaderYaml12Bools.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SafeLoaderYaml12Bools.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def safe_load(stream):
    """yaml.safe_load with YAML 1.2 booleans (see _SafeLoaderYaml12Bools)."""
    return yaml.load(stream, Loader=_SafeLoaderYaml12Bools)  # a SafeLoader subclass: safe


def _show(value, limit=60):
    """repr(value) cut to `limit` characters: an error line stays one short line whatever the value."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ----------------------------------------------------------------------------- reading YAML
def _read_yaml(path):
    if not os.path.isfile(path):
        raise UserError(f"config file not found: {path}")
    try:
        with open(path) as f:
            data = safe_load(f)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise UserError(f"malformed YAML at {where}: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: a config must be a mapping of sections (model:, head:, data:, optim:, train:)")
    return data


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
    path = os.path.abspath(path)
    if path in seen:
        raise UserError(f"config inheritance cycle: {' -> '.join(seen + (path,))}")
    data = _read_yaml(path)
    bases = data.pop("base", None)
    if bases is None:
        return data
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise UserError(f"{path}: 'base' must be a relative path (or a list of them)")
    merged = {}
    for base in bases:
        base_path = os.path.join(os.path.dirname(path), base)
        merged = _merge(merged, _load_chain(base_path, seen + (path,)))
    return _merge(merged, data)


# ----------------------------------------------------------------------------- overrides
def parse_override(text):
    """'optim.lr=1e-3' -> (['optim', 'lr'], 0.001): the value is parsed as a YAML scalar."""
    text = text[2:] if text.startswith("--") else text
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise UserError(f"override {_show(text)} must look like key.sub=value (e.g. optim.lr=1e-3)")
    try:
        value = safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # not valid YAML: keep it as a plain string, the type check decides
    return key.strip().split("."), value


def apply_overrides(data, overrides):
    """Set each `key.sub=value` in the nested dict `data` (missing sections are created; a
    section that holds a value, e.g. `optim: 3`, is not silently replaced)."""
    for text in overrides or ():
        keys, value = parse_override(text)
        node = data
        for depth, k in enumerate(keys[:-1]):
            if node.get(k) is None:
                node[k] = {}
            elif not isinstance(node[k], dict):
                where = ".".join(keys[:depth + 1])
                raise UserError(f"override '{'.'.join(keys)}=...': '{where}' is {_show(node[k])} in the config, not a "
                                f"section of keys; fix the config or override '{where}' itself")
            node = node[k]
        node[keys[-1]] = value
    return data


# ----------------------------------------------------------------------------- typed building
def _all_keys(cls=Config, prefix=""):
    keys = []
    for f in dataclasses.fields(cls):
        full = prefix + f.name
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            keys += _all_keys(hint, full + ".")
        else:
            keys.append(full)
    return keys


def _suggest(full_key):
    keys = _all_keys()
    match = difflib.get_close_matches(full_key, keys, n=1, cutoff=0.6)
    if not match:  # try the last component alone, e.g. 'lr' -> 'optim.lr'
        leaf = full_key.rsplit(".", 1)[-1]
        by_leaf = {k.rsplit(".", 1)[-1]: k for k in keys}
        leaf_match = difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.6)
        match = [by_leaf[leaf_match[0]]] if leaf_match else []
    return match[0] if match else None


def _type_name(tp):
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_type_name(a) for a in args) + " or null"
    if origin in (tuple, typing.Tuple):
        return "list of " + ", ".join(_type_name(a) for a in typing.get_args(tp))
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


def _build(cls, data, prefix=""):
    if not isinstance(data, dict):
        raise UserError(f"'{prefix.rstrip('.')}' must be a mapping of keys, got {_show(data)} ({type(data).__name__})")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in data.items():
        full = prefix + str(key)
        if key not in names:
            sibling = difflib.get_close_matches(str(key), sorted(names), n=1, cutoff=0.6)
            hint = prefix + sibling[0] if sibling else _suggest(full)
            tip = f"; did you mean '{hint}'?" if hint else f"; valid keys here: {', '.join(sorted(names))}"
            raise UserError(f"unknown config key '{full}'{tip}")
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value if value is not None else {}, full + ".")
            continue
        try:
            kwargs[key] = _coerce(value, tp)
        except _TypeMismatch:
            raise UserError(f"config key '{full}' expects {_type_name(tp)}, got {_show(value)} ({type(value).__name__})") from None
    return cls(**kwargs)


def _leaves(obj, prefix=""):
    """(dotted key, value) of every field of a config dataclass, depth first."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _leaves(value, prefix + f.name + ".")
        else:
            yield prefix + f.name, value


def _interval_check(interval):
    """'[0, 1)' -> (predicate, text for a message)."""
    low, high = (float(x) for x in interval[1:-1].split(","))
    low_ok = (lambda v: v >= low) if interval[0] == "[" else (lambda v: v > low)
    high_ok = (lambda v: v <= high) if interval[-1] == "]" else (lambda v: v < high)
    low_text = f"{low:g}"
    text = (f"{'>=' if interval[0] == '[' else '>'} {low_text}" if high == math.inf else f"in {interval}")
    return (lambda v: low_ok(v) and high_ok(v)), text


def _check_numbers(cfg):
    """Every float finite; every field of RANGES inside its interval (None allowed where typed so)."""
    for key, value in _leaves(cfg):
        values = value if isinstance(value, tuple) else (value,)
        if any(isinstance(v, float) and not math.isfinite(v) for v in values):
            raise UserError(f"config key '{key}' must be a finite number, got {_show(value)}")
        if key in RANGES and value is not None:
            inside, text = _interval_check(RANGES[key])
            if not all(inside(v) for v in values):
                raise UserError(f"config key '{key}' must be {text}{' (each)' if isinstance(value, tuple) else ''}, "
                                f"got {_show(value)}")


def _check(cfg):
    for key, choices in CHOICES.items():
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value not in choices:
            raise UserError(f"config key '{key}' must be one of {', '.join(choices)}; got {_show(value)}")
    _check_numbers(cfg)
    check_head_settings(cfg.head)
    if cfg.model.img_size != cfg.data.image_size:
        raise UserError(
            f"model.img_size ({cfg.model.img_size}) differs from data.image_size ({cfg.data.image_size}); set both to the same value"
        )
    return cfg


def check_head_settings(head):
    """The head section by the heads' own rules (models/registry.py), every head's values (a typo
    fails at load even where the selected head ignores it) plus the selected head's cross-checks."""
    try:
        check_settings(head.name, {key: getattr(head, key) for key in HPARAMS}, every_head=True)
    except UserError as err:
        raise UserError(f"config key {err}") from None


def config_from_dict(data, default_name="run"):
    data = dict(data)
    data.setdefault("name", default_name)
    cfg = _check(_build(Config, data))
    cfg.train.output_dir = cfg.train.output_dir.replace("{name}", cfg.name)
    return cfg


def load_config(path, overrides=()):
    """Read `path` (following `base:` chains), apply `key.sub=value` overrides, validate."""
    data = apply_overrides(_load_chain(path), overrides)
    return config_from_dict(data, default_name=os.path.splitext(os.path.basename(path))[0])


def config_to_dict(cfg):
    def plain(x):
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    return plain(dataclasses.asdict(cfg))


def save_config(cfg, path):
    """Write the fully resolved config (every field) as YAML, atomically."""
    atomic_write_text(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def load_run_config(run_dir, overrides=()):
    """The resolved config a training run saved (RUN_DIR/config.yaml; a file path works too)."""
    path = os.path.join(run_dir, RUN_CONFIG_NAME) if os.path.isdir(run_dir) else run_dir
    if not os.path.isfile(path):
        raise UserError(f"no {RUN_CONFIG_NAME} in {run_dir}: is it a run directory written by train.py?")
    data = _read_yaml(path)
    data.pop("base", None)
    data.pop("history", None)  # the changes accepted on resume (engine/resume_policy.py), not a setting
    data = apply_overrides(data, overrides)
    return config_from_dict(data, default_name=os.path.basename(os.path.abspath(os.path.dirname(path))))
