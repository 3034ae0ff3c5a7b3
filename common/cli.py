"""Entry-point wrapper: a user mistake becomes one line on stderr and exit code 2, not a traceback."""
import sys

from common.errors import UserError


def run_cli(main, *args, **kwargs):
    """Call `main(*args, **kwargs)`; print a UserError as `error: <message>` and exit 2 (or the
    error's own `exit_code`, e.g. 74 for training.checkpoint.files.CheckpointWriteError).

    Anything else is a bug and keeps its traceback. The return value of `main` (an int or None)
    becomes the exit status.
    """
    try:
        status = main(*args, **kwargs)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        sys.exit(getattr(err, "exit_code", 2))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr, flush=True)
        sys.exit(130)
    sys.exit(status or 0)
