"""Test-only launcher: train.py with fault-injection hooks, which production never installs.

    python tests/hooked_train.py [--nan-at-step N] [--step-delay-s X] --config C.yaml [train.py args ...]

--nan-at-step N   the loss of optimizer update N (0-based) is made NaN
--step-delay-s X  sleep X seconds after each update (numerics untouched; lets a test kill mid-epoch)
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


class FaultHooks:
    """The `hooks` object train.train() accepts: on_loss(step, loss) -> loss, after_update(step)."""

    def __init__(self, nan_at_step=-1, step_delay_s=0.0):
        self.nan_at_step = nan_at_step
        self.step_delay_s = step_delay_s

    def on_loss(self, step, loss):
        return loss * float("nan") if step == self.nan_at_step else loss

    def after_update(self, step):
        if self.step_delay_s:
            time.sleep(self.step_delay_s)


def main(argv=None):
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--nan-at-step", type=int, default=-1)
    parser.add_argument("--step-delay-s", type=float, default=0.0)
    args, rest = parser.parse_known_args(argv)
    import train
    from engine.cli import run_cli

    run_cli(train.main, rest, hooks=FaultHooks(args.nan_at_step, args.step_delay_s))


if __name__ == "__main__":
    main()
