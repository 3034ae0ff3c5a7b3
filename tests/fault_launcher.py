"""Run train.py with a test-only fault hook installed (never used outside tests).

    python tests/fault_launcher.py --kill-during-save STEP -- train.py-arguments...

`--kill-during-save STEP` SIGKILLs the process right after the weights of the step-STEP checkpoint
are written into its temporary directory (before the optimizer state and the completion marker),
through engine.checkpoint's `_after_file_written` hook: the production code carries no fault switch.
"""
import argparse
import os
import runpy
import signal
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN_PY = os.path.join(ROOT, "train.py")


def main():
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kill-during-save", type=int, required=True, metavar="STEP")
    args = parser.parse_args(argv[:split])
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from engine import checkpoint as ck

    target = ".tmp-" + ck.checkpoint_name(args.kill_during_save)

    def kill_mid_save(path):
        if os.path.basename(os.path.dirname(path)) == target and os.path.basename(path) == "model.safetensors":
            os.kill(os.getpid(), signal.SIGKILL)

    ck._after_file_written = kill_mid_save
    sys.argv = [TRAIN_PY, *argv[split + 1:]]
    runpy.run_path(TRAIN_PY, run_name="__main__")


if __name__ == "__main__":
    main()
