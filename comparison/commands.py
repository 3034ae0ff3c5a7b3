"""What a planned run needs and the commands that do it: the train.py and eval.py command lines (the
same in every mode: run here, by a job worker, or by a SLURM array task) and whether a run is trained
and evaluated already (a finished step is never redone). Torch-free: a SLURM array task's question
(comparison/slurm.py) reads it before anything heavy loads; the OOD set eval.py is asked for is
comparison/command.py's `resolve_ood`."""
import os
import shlex
import sys

from common import rundir
from common.errors import UserError
from comparison.paths import EVAL_SCRIPT, TRAIN_SCRIPT
from comparison.run_results import not_evaluated


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
        return is_trained(run_dir), self.evaluation(run_dir) is None

    def evaluation(self, run_dir):
        """None when `run_dir` is evaluated for these commands, else why not (run_results.NotEvaluated:
        no evaluation yet, another OOD set's, or a damaged or foreign one, which is evaluated again)."""
        return not_evaluated(run_dir, self.eval_file, self.ood)

    def eval_line(self, run_dir):
        """The eval.py command of `run_dir` as a user types it in this directory (the fix of a damaged
        evaluation)."""
        launcher = self.launcher if self.launcher != [sys.executable] else ["python"]
        return shlex.join(launcher + [os.path.relpath(EVAL_SCRIPT)] + self.eval_args(run_dir))


def is_trained(run_dir):
    """train.py wrote its summary.json: the training finished."""
    return os.path.isfile(os.path.join(run_dir, rundir.SUMMARY))
