"""What a planned run needs and the commands that do it: the train.py and eval.py command lines (the
same in every mode: run here, by a job worker, or by a SLURM array task), the OOD set eval.py is
asked for, and whether a run is trained and evaluated already (a finished step is never redone)."""
import json
import os
import shlex
import sys

from common import rundir
from common.errors import UserError
from comparison.paths import EVAL_SCRIPT, TRAIN_SCRIPT


def resolve_ood(args, cfg):
    """The OOD dataset name eval.py gets (None: no OOD detection)."""
    from data import is_features
    from evaluation.ood_report import default_ood_dataset, ood_dataset_names

    if args.ood_dataset == "none":
        return None
    if is_features(cfg.data):
        return _feature_ood(args, cfg)
    if args.ood_dataset == "auto":
        return default_ood_dataset(cfg.data.dataset)
    if args.ood_dataset not in ood_dataset_names():
        raise UserError(f"unknown --ood-dataset '{args.ood_dataset}'; valid: auto, none, "
                        f"{', '.join(ood_dataset_names())}")
    return args.ood_dataset


def _feature_ood(args, cfg):
    """On cached features the OOD set is OOD features: the folder's own (DIR/ood) or --ood-root's."""
    from data.features import ood_root

    if args.ood_dataset not in ("auto", "features"):
        raise UserError(f"--ood-dataset {args.ood_dataset}: on cached features the OOD set is OOD features; use "
                        f"auto (DIR/ood, scripts/extract_features.py --ood NAME), features with --ood-root DIR, "
                        f"or none")
    if args.ood_root is None and ood_root(cfg.data.root) is None:
        if args.ood_dataset == "auto":
            return None
        raise UserError(f"--ood-dataset features: {cfg.data.root} holds no OOD features; extract them with "
                        f"scripts/extract_features.py --ood NAME, or give --ood-root OOD_FEATURE_DIR")
    return "features"


class Commands:
    """The train and eval commands of a planned run; the same in every mode."""

    def __init__(self, args, config, ood):
        self.config, self.ood, self.ood_root = config, ood, args.ood_root
        self.ema = args.ema
        self.eval_file = rundir.eval_result_name(args.ema)
        self.launcher = shlex.split(args.launcher) if args.launcher else [sys.executable]
        if args.launcher and not any(os.path.basename(c).startswith("python") for c in self.launcher) \
                and "launch" not in self.launcher:
            raise UserError(f"--launcher '{args.launcher}' should end in a Python launcher "
                            f"(e.g. 'accelerate launch --num_processes 2' or 'python')")

    def train_args(self, overrides):
        return ["--config", self.config, *overrides, "--resume", "auto"]

    def eval_args(self, run_dir):
        out = ["--checkpoint", run_dir, "--output", os.path.join(run_dir, self.eval_file), "--quiet"]
        out += ["--ema"] if self.ema else []
        if self.ood:
            out += ["--ood-dataset", self.ood] + (["--ood-root", self.ood_root] if self.ood_root else [])
        return out

    def train(self, overrides):
        return self.launcher + [TRAIN_SCRIPT] + self.train_args(overrides)

    def evaluate(self, run_dir):
        return self.launcher + [EVAL_SCRIPT] + self.eval_args(run_dir)

    def status(self, run_dir):
        """(trained, evaluated) of `run_dir` for these commands."""
        return is_trained(run_dir), is_evaluated(run_dir, self.eval_file, self.ood)


def is_trained(run_dir):
    """train.py wrote its summary.json: the training finished."""
    return os.path.isfile(os.path.join(run_dir, rundir.SUMMARY))


def is_evaluated(run_dir, eval_file, ood=None):
    """The eval JSON and its per-example records are there, with the results of the OOD set `ood`
    when one is asked for (a run evaluated against another OOD set is evaluated again)."""
    path = os.path.join(run_dir, eval_file)
    evaluated = os.path.isfile(path) and os.path.isfile(rundir.examples_path(path))
    if evaluated and ood:
        try:
            with open(path) as f:
                evaluated = (json.load(f).get("ood") or {}).get("dataset") == ood
        except (OSError, ValueError):
            evaluated = False
    return evaluated
