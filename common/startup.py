"""The first line an entry point prints on a terminal, before its seconds of imports (torch, timm,
Accelerate): without it a command looks hung until then. Standard library only, so it can run
first; on stderr and only on a terminal (logs, pipes and tests see nothing), once per launch
(rank 0 of an `accelerate launch`)."""
import os
import sys


def say_loading(tool, stream=None, env=None):
    """'train.py: loading torch, timm and Accelerate...' on `stream` (stderr) when it is a terminal."""
    stream = sys.stderr if stream is None else stream
    env = os.environ if env is None else env
    if env.get("LOCAL_RANK", "0") != "0" or not getattr(stream, "isatty", lambda: False)():
        return
    print(f"{tool}: loading torch, timm and Accelerate (a few seconds)...", file=stream, flush=True)
