"""Shared helpers for the train.py tests (tiny ResMLP on a tiny built-in dataset, CPU)."""
import json
import os
import subprocess
import sys

from configs import config_from_dict, save_config
from configs.loader import apply_overrides

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(ROOT, "train.py")

TINY = {
    "name": "tiny",
    "model": {"name": "resmlp_tiny"},
    "head": {"name": "softmax"},
    "data": {"dataset": "builtin10", "image_size": 16, "builtin_train_size": 256, "builtin_val_size": 100,
             "batch_size": 32, "eval_batch_size": 64, "num_workers": 0},
    "optim": {"name": "lamb", "lr": 5e-3, "lr_base_batch": 32, "weight_decay": 0.05, "epochs": 2, "warmup_epochs": 0.5},
    "train": {"log_every": 1, "save_every": 5, "ema_decay": 0.9, "log_with": "none", "progress": False},
}
NO_AUG = ["data.hflip=0.0", "data.crop_padding=0", "data.mixup=0.0", "data.cutmix=0.0", "model.drop_path=0.0"]


def tiny_cfg(run_dir, *overrides):
    data = json.loads(json.dumps(TINY))
    apply_overrides(data, [f"train.output_dir={run_dir}", *overrides])
    return config_from_dict(data)


def write_cfg(cfg, path):
    save_config(cfg, str(path))
    return str(path)


def reset_accelerate_state():
    """Accelerate keeps process-wide singletons: reset them before another in-process entry point."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def run_inprocess(cfg, **kwargs):
    """training.loop.train(cfg) (train.py's body) in this process (Accelerate's singletons reset first)."""
    reset_accelerate_state()
    import torch

    from training.loop import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine is shared: one thread is faster than two contended ones
    try:
        return train(cfg, **kwargs)
    finally:
        torch.set_num_threads(threads)


class Killed(Exception):
    """A session stopped from inside, as a SIGKILL stops it: no checkpoint of its last steps."""


class KillAfter:
    """run_inprocess's `hooks` (training.loop.train's): the process 'dies' after update `step`, before it
    is logged or saved, by raising Killed."""

    def __init__(self, step):
        self.step = step

    def on_loss(self, step, loss):
        return loss

    def after_update(self, step):
        if step == self.step:
            raise Killed


def main_inprocess(*argv):
    """`python train.py ARGV` in this process (common.cli.run_cli, as the command line runs it): a
    subprocess.CompletedProcess with the exit status and what it printed. For tests where a real
    process is not what is tested (no signal, kill or second process): it saves a Python start-up."""
    import contextlib
    import io

    import torch

    import train
    from common.cli import run_cli

    reset_accelerate_state()
    out, err = io.StringIO(), io.StringIO()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as run_inprocess (and OMP_NUM_THREADS=1 in subprocess_env)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                run_cli(train.main, list(argv))  # always ends in sys.exit(status)
            except SystemExit as stop:
                code = stop.code
    finally:
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess(["train.py", *argv], code, out.getvalue(), err.getvalue())


def subprocess_env(**extra):
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def train_cmd(config_path, *args):
    return [sys.executable, TRAIN_PY, "--config", str(config_path), *args]


def hooked_train_cmd(config_path, *hook_args):
    """train.py through the test-only launcher that installs fault hooks (tests/hooked_train.py)."""
    return [sys.executable, os.path.join(ROOT, "tests", "hooked_train.py"), *hook_args, "--config", str(config_path)]


# train.py whose run waits after update GATE_STEP until the file GATE exists: a test then acts on a
# process known to be mid-run (signal it, race it), with no timing guess.
def gated_train_cmd(config_path, gate_step, gate_path, *args):
    """train.py pausing after update `gate_step` (`gate_path + '.waiting'` appears) until `gate_path` exists."""
    return hooked_train_cmd(config_path, "--pause-after-step", str(int(gate_step)), "--gate", str(gate_path), *args)


def wait_for_file(path, proc, timeout=180):
    """Wait until `path` exists while `proc` runs; False if it ended or the time ran out."""
    import time

    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if os.path.exists(path):
            return True
        time.sleep(0.02)
    return False


def run_train_subprocess(config_path, *args, env=None, timeout=240):
    return subprocess.run(train_cmd(config_path, *args), cwd=ROOT, env=env or subprocess_env(),
                          capture_output=True, text=True, timeout=timeout)


def read_metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def weights(run_dir, name="model.safetensors"):
    from safetensors.torch import load_file

    return load_file(os.path.join(run_dir, name))


def test_a_slow_run_reads_seconds_per_image_not_zero_images_per_second():
    from training.logging import format_throughput

    assert format_throughput(1234.4) == "1234 img/s" and format_throughput(1.0) == "1 img/s"
    assert format_throughput(0.25) == "4.0 s/img" and format_throughput(1 / 42.0) == "42.0 s/img"
