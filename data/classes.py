"""Class names of a dataset, stored with a run and checked when the run's model is evaluated.

A model's output j means the class its training data called j. Evaluating it on a folder whose
class folders differ (but count the same) maps labels silently, so a run stores its class names
(RUN_DIR/classes.json, written by training) and evaluation compares them with the dataset's:
a mismatch is one line naming the first differences and `--allow-class-mismatch`. Beside it,
RUN_DIR/class_map.txt holds the same list in timm's class_map format, for timm's own scripts.

Names come from each dataset's declaration (data/registry.py): ImageFolder -> the sorted train/
folder names; CIFAR-10/100 -> the archives' label names; builtin10/100 -> the shape names
(builtin100: shape_hue<k>); builtin*_ood -> those of its in-distribution set (same label space);
shards -> the shard index's list; features -> the source data's (features.json).
"""
import json
import os

from common import rundir
from common.errors import UserError
from common.io import atomic_write_text
from common.sidecar_format import class_list_problem  # the one rule, shared with the export sidecar

from .registry import dataset_spec

ALLOW_FLAG = "--allow-class-mismatch"


def class_names(data_cfg):
    """Label index -> class name for `data_cfg.dataset`, as its declaration reads them (data/registry.py)."""
    return list(dataset_spec(data_cfg.dataset).classes(data_cfg))


def class_map_text(names):
    """timm's class_map text format: line j is the name of label j (timm strips each line, so its
    `class_map=` argument gives folders this project's label order, numeric folders included)."""
    return "".join(f"{name}\n" for name in names)


def save_class_names(run_dir, names):
    """Write RUN_DIR/classes.json ({"classes": [...]}) and RUN_DIR/class_map.txt atomically."""
    atomic_write_text(os.path.join(run_dir, rundir.CLASSES), json.dumps({"classes": list(names)}, indent=1))
    atomic_write_text(os.path.join(run_dir, rundir.CLASS_MAP), class_map_text(names))


def load_class_names(run_dir):
    """The class names a run stored, or None when it stored none (runs from before classes.json);
    an unreadable, empty or repeating list is one UserError line naming the file."""
    path = os.path.join(run_dir, rundir.CLASSES)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            names = json.load(f)["classes"]
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError("not a list of names")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{path} is unreadable ({err}); restore it or delete it to skip the class check") from None
    problem = class_list_problem(names)
    if problem:
        raise UserError(f"{path} {problem}: each class once, in label order; restore the file train.py wrote "
                        f"or delete it to skip the class check")
    return names


def _short(name, limit=40):
    return name if len(name) <= limit else name[:limit - 3] + "..."


def class_mismatch(run_names, data_names):
    """None when the lists are equal, else a short description of how they differ."""
    run_names, data_names = list(run_names), list(data_names)
    if run_names == data_names:
        return None
    parts = []
    if len(run_names) != len(data_names):
        parts.append(f"{len(run_names)} classes in the run, {len(data_names)} in the data")
    diffs = [(i, a, b) for i, (a, b) in enumerate(zip(run_names, data_names)) if a != b]
    if diffs:
        shown = "; ".join(f"label {i}: {_short(a)!r} (run) vs {_short(b)!r} (data)" for i, a, b in diffs[:3])
        more = f" and {len(diffs) - 3} more" if len(diffs) > 3 else ""
        parts.append(f"{len(diffs)} label(s) named differently ({shown}{more})")
    return ", ".join(parts)


def check_class_names(run_names, data_names, *, allow_mismatch=False, run_dir="the run", warn=print):
    """Raise a one-line UserError when the run's class names differ from the dataset's, unless
    `allow_mismatch` (then warn). `run_names=None` (the run stored none): a warning, no check.
    Returns True when the names were checked and equal."""
    if run_names is None:
        warn(f"warning: {run_dir} stores no class names ({rundir.CLASSES}); labels are matched by index only")
        return False
    diff = class_mismatch(run_names, data_names)
    if diff is None:
        return True
    if allow_mismatch:
        warn(f"warning: class names differ from {run_dir}'s ({diff}); evaluating anyway ({ALLOW_FLAG})")
        return False
    raise UserError(f"the dataset's classes do not match the ones {run_dir} was trained on: {diff}; evaluate on "
                    f"the same classes, or pass {ALLOW_FLAG} if the labels really correspond")
