"""One folder for the whole test run, shared by every pytest-xdist worker: runs that several test
files read (the tiny comparison) are built there once per run, not once per worker.

conftest.py makes it in the controller (or the one process without xdist), before the workers
start, and names it in RESMLP_TEST_SESSION_DIR, which the workers inherit; it removes it at the end.
A module imported outside pytest gets a folder of its own, removed at exit.
"""
import atexit
import fcntl
import os
import shutil
import tempfile

ENV = "RESMLP_TEST_SESSION_DIR"


def make_session_dir():
    """A new folder named in ENV (for the processes started after this); -> its path."""
    path = tempfile.mkdtemp(prefix="resmlp-tests-")
    os.environ[ENV] = path
    return path


def session_dir():
    path = os.environ.get(ENV)
    if not path or not os.path.isdir(path):
        path = make_session_dir()
        atexit.register(shutil.rmtree, path, True)
    return path


def built_once(name, build):
    """SESSION/name, made by `build(path)` in the first process that asks for it (under an exclusive
    lock across processes: the others wait, then read it); a build that failed is redone by the next
    process that asks."""
    path = os.path.join(session_dir(), name)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(path + ".done"):
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
            build(path)
            open(path + ".done", "w").close()
    return path
