"""Test-only launcher: train.py with fault-injection hooks, which production never installs.

    python tests/hooked_train.py [--nan-at-step N] [--step-delay-s X] [--pause-after-step N --gate PATH]
                                 [--kill-during-save STEP] --config C.yaml [train.py args ...]
    python tests/hooked_train.py [hook options] PATH/train.py|PATH/eval.py [its args ...]

The second form lets it stand in as a launcher prefix (compare_heads.py --launcher "python
tests/hooked_train.py --pause-after-step 2 --gate G"): train.py gets the hooks, eval.py runs as is.

--nan-at-step N        the loss of optimizer update N (0-based) is made NaN
--step-delay-s X       sleep X seconds after each update (numerics untouched; lets a test kill mid-epoch)
--pause-after-step N   after update N, add this process's pid to GATE.waiting and wait until GATE exists
                       (a test then signals the process at a known step, with no timing guess)
--pause-before-start   the same before train.py is even imported (a test that needs a comparison live with a
                       step under way, not the training itself; a signal then ends the step at once)
--kill-during-save S   SIGKILL right after the weights of the step-S checkpoint are written into its
                       temporary directory (before the optimizer state and the completion marker),
                       through training.checkpoint.files's `_after_file_written` hook
"""
import argparse
import os
import signal
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


class FaultHooks:
    """The `hooks` object training.loop.train() accepts: on_loss(step, loss) -> loss, after_update(step)."""

    def __init__(self, nan_at_step=-1, step_delay_s=0.0, pause_after_step=-1, gate=None):
        self.nan_at_step = nan_at_step
        self.step_delay_s = step_delay_s
        self.pause_after_step, self.gate = pause_after_step, gate

    def on_loss(self, step, loss):
        return loss * float("nan") if step == self.nan_at_step else loss

    def after_update(self, step):
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        if step == self.pause_after_step:
            wait_at_gate(self.gate)


def wait_at_gate(gate):
    """Add this process's pid to GATE.waiting, then wait until GATE exists."""
    with open(gate + ".waiting", "a") as f:  # one line per waiting process
        f.write(f"{os.getpid()}\n")
    while not os.path.exists(gate):
        time.sleep(0.02)


def kill_during_save(step):
    """Install the checkpoint writer's test hook: SIGKILL mid-save of the step-`step` checkpoint."""
    from common import rundir
    from training.checkpoint import files as ck

    target = ".tmp-" + rundir.checkpoint_name(step)

    def kill_mid_save(path):
        if os.path.basename(os.path.dirname(path)) == target and os.path.basename(path) == "model.safetensors":
            os.kill(os.getpid(), signal.SIGKILL)

    ck._after_file_written = kill_mid_save


def main(argv=None):
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--nan-at-step", type=int, default=-1)
    parser.add_argument("--step-delay-s", type=float, default=0.0)
    parser.add_argument("--pause-after-step", type=int, default=-1)
    parser.add_argument("--gate", default=None)
    parser.add_argument("--kill-during-save", type=int, default=None, metavar="STEP")
    parser.add_argument("--pause-before-start", action="store_true")
    args, rest = parser.parse_known_args(argv)
    if rest and rest[0].endswith(".py"):  # used as a launcher: the script comes first
        script, rest = rest[0], rest[1:]
        if os.path.basename(script) != "train.py":
            import runpy

            sys.argv = [script, *rest]
            runpy.run_path(script, run_name="__main__")
            return
    if args.pause_before_start:
        wait_at_gate(args.gate)
    import train
    from common.cli import run_cli

    if args.kill_during_save is not None:
        kill_during_save(args.kill_during_save)
    run_cli(train.main, rest, hooks=FaultHooks(args.nan_at_step, args.step_delay_s, args.pause_after_step, args.gate))


if __name__ == "__main__":
    main()
