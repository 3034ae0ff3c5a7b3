"""What a run reads from outside itself never lies inside its own directory.

A run writes, and with --overwrite deletes, in train.output_dir; its sources (model.pretrained,
train.teacher, train.teacher_weights, the feature folder of data.dataset=features) must therefore
be elsewhere: a fine-tune into its own source run would be refused as a run already there, and
with --overwrite would delete the very weights it has just hashed, so it could never resume and
the source run is gone. `check_sources_outside_run` refuses that in one line, before the run
directory is locked or anything in it is read or written; training/run.py's `setup` calls it first.
"""
import os

from common.errors import UserError
from common.rundir import inside
from data import is_features

# source key -> the suffix of the train.output_dir suggested instead
_SUGGESTED_SUFFIX = {"model.pretrained": "_ft", "train.teacher": "_distilled", "train.teacher_weights": "_distilled",
                     "data.root": "_probe"}


def run_sources(cfg):
    """{key: path} of what the run reads from outside itself (paths that exist; a timm name is none)."""
    found = {"model.pretrained": cfg.model.pretrained, "train.teacher": cfg.train.teacher,
             "train.teacher_weights": cfg.train.teacher_weights,
             "data.root": cfg.data.root if is_features(cfg.data) else None}
    return {key: path for key, path in found.items() if path is not None and os.path.lexists(str(path))}


def check_sources_outside_run(cfg):
    """UserError (one line) when a source of the run is its own directory or inside it."""
    out = cfg.train.output_dir
    for key, path in run_sources(cfg).items():
        if inside(path, out):
            where = "is this run's own directory" if inside(out, path) else "lies inside this run's directory"
            instead = os.path.normpath(out) + _SUGGESTED_SUFFIX[key]
            raise UserError(f"{key}={path} {where} (train.output_dir={out}): the run would write over what it "
                            f"reads, and --overwrite would delete it; set another train.output_dir, e.g. "
                            f"train.output_dir={instead}")
