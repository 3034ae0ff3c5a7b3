"""The checks of a run's start that need neither torch nor the data: train.py asks them before torch
loads, so a run it would refuse is one line in a fraction of a second, not after the imports' seconds.

They decide nothing new. training/run.py's `setup` and training/run_start.py's `decide_start` ask the
same questions again where they decide them (the directory, under the run lock), with the same
words: another process may change the directory in between, so an early answer only refuses what
the late one would, never lets a start through. Nothing is created to check: the destination is
looked at (os.access, os.statvfs), not written.

`check_start(cfg, resume, overwrite)`, in the order the run meets them:
1. the run's sources lie outside its directory (training/run_sources.py);
2. --resume and --overwrite are not both given;
3. the main process only (the one that writes; another node may not see the same filesystem):
   train.output_dir can hold the run lock (a path through a file, a read-only filesystem or a folder
   without write permission: WriteError, exit 74, as the lock's own), no live run holds its lock,
   and without --resume or --overwrite it holds no run.
"""
import errno
import os

from common import rundir
from common.errors import UserError
from common.runlock import RunLock
from training.run_sources import check_sources_outside_run

LOCK_PURPOSE = "training"  # the run lock's purpose while training (named in a second run's refusal)


def run_artefacts(run_dir):
    """Names of the training artefacts present in `run_dir` (weights, logs, summary, checkpoints/;
    a symlink counts, even a dangling one), for a 'this directory holds a run' refusal before a
    destructive fresh start."""
    return [n for n in rundir.RUN_ARTEFACTS if os.path.lexists(os.path.join(run_dir, n))]


def check_flags(resume, overwrite, run_dir):
    if resume is not None and overwrite:
        raise UserError(f"--resume {resume} and --overwrite contradict each other: --resume continues the run in "
                        f"{run_dir}, --overwrite deletes it; pass one of them")


def stopped_before_first_checkpoint(run_dir, present):
    """Whether the run `run_dir` holds (`present`: its run_artefacts) stopped before its first checkpoint
    (a full disk, a kill, a crash in the first updates) and never finished: no summary.json and no
    complete checkpoint (one with its COMPLETE.json). Nothing it trained can be resumed, and a fresh
    start trains it again from the same seed: `--resume auto` starts it over (training/run_start.py)."""
    root = os.path.join(run_dir, rundir.CHECKPOINTS)
    saved = os.listdir(root) if os.path.isdir(root) else []
    return rundir.SUMMARY not in present and not any(
        os.path.isfile(os.path.join(root, name, rundir.MARKER)) for name in saved)


def holds_a_run(run_dir, present, resume):
    """The refusal of a fresh start (no checkpoint to resume) in `run_dir`, which holds `present`."""
    listing = ", ".join(present)
    if resume is None and stopped_before_first_checkpoint(run_dir, present):
        return UserError(f"{run_dir} already holds a run that stopped before its first checkpoint ({listing}): pass "
                         f"--resume auto to start it over there, or --overwrite (or set another train.output_dir)")
    if resume == "auto":
        return UserError(f"--resume auto: {run_dir} has no complete checkpoint but holds a run ({listing}); "
                         f"pass --overwrite instead to delete it and start over, or set another train.output_dir")
    return UserError(f"{run_dir} already holds a run ({listing}): pass --resume auto to continue it, or "
                     f"--overwrite to delete it and start over (or set another train.output_dir)")


def blocking_error(folder):
    """The OSError that creating a file in `folder` (made first, with its parents, when missing) would
    meet, found by looking only: a part of the path that is a file (ENOTDIR), a read-only filesystem
    (EROFS), no write or search permission (EACCES); None when nothing visible blocks it."""
    existing = folder
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing.rstrip(os.sep)) or os.curdir
    if not os.path.isdir(existing):
        return NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), existing)
    if os.access(existing, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        return None
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    code = errno.EROFS if read_only else errno.EACCES
    return OSError(code, os.strerror(code), existing)


def is_main_process(env=None):
    """Rank 0 of a launch, or a process launched alone (before Accelerate: its RANK variable)."""
    return (os.environ if env is None else env).get("RANK", "0") == "0"


def check_start(cfg, resume, overwrite, env=None):
    """UserError (WriteError, exit 74, for a destination that cannot be written) for a start the run
    would refuse (the module docstring); nothing is created or changed."""
    run_dir = cfg.train.output_dir
    check_sources_outside_run(cfg)
    check_flags(resume, overwrite, run_dir)
    if not is_main_process(env):
        return
    lock = RunLock(run_dir, purpose=LOCK_PURPOSE)
    err = blocking_error(run_dir)
    if err is not None:
        raise lock.unwritable(err)
    held = lock.held_elsewhere()
    if held is not None:
        raise held
    present = run_artefacts(run_dir)
    if resume is None and not overwrite and present:
        raise holds_a_run(run_dir, present, resume)
