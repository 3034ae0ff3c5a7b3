"""Atomic, checksummed training checkpoints: RUN_DIR/checkpoints/step_<N>/ with a completion marker.

Layout of one checkpoint directory (names: common/rundir.py):
    model.safetensors       raw weights (unwrapped state dict, incl. output_head)
    model_ema.safetensors   EMA weights (when train.ema)
    optimizer.pt            optimizer state dict   (torch.save; loaded with weights_only=True)
    scheduler.pt            timm scheduler state dict
    scaler.pt               fp16 grad-scaler state (fp16 only)
    trainer_state.json      the versioned TrainerState (training/checkpoint/state.py: counters, position
                            in the epoch, the whole resolved config, `loss_finite`)
    rng_<rank>.json         every rank's Python/numpy/torch RNG states
    COMPLETE.json           written last: {"step", "files": {name: size}, "sha256": {name: hex}};
                            a directory without it is not a checkpoint

Atomicity: everything is written into `.tmp-step_<N>/`, fsynced, the marker is written last, then
the directory is renamed to `step_<N>` (one rename on a POSIX filesystem). A kill at any moment
leaves either the old set of checkpoints or the new one, never a half-written `step_<N>`.

Integrity: the marker records every file's size and sha256. `validation_error` checks both (a
checkpoint written before checksums existed gets a structural check instead: safetensors header,
torch.load, JSON). `find_latest` walks the checkpoints newest first, skips any invalid one with a
warning naming it and why, and `resolve_resume("auto")` refuses with one line naming
`--resume PATH` when checkpoints exist but none is valid.

Write failures: torch.save writes through a Python file object, so a full disk surfaces as the
OSError(ENOSPC) behind its RuntimeError (torch.save straight to a path reports only "[enforce fail
at inline_container.cc] unexpected pos", which never mentions space); safetensors reports the OS
error number in its message. Any OSError while saving removes the temporary files and raises
`CheckpointWriteError` (a UserError: one line naming the file, the space the checkpoint needs and
the space free; common.io's WriteError); the previous checkpoints are never touched before the
final rename. Entry points exit with `CheckpointWriteError.exit_code` (74, EX_IOERR from sysexits.h).

Deleting (pruning, clearing temporary folders) goes through common/removal.py: a symlinked
checkpoint loses its link, never its target, and one that cannot be deleted whole is kept.

Temporary files: `clean_stale_temp(run_dir)` removes what killed saves leave (`.tmp-*`
checkpoint directories, `*.tmp<pid>` files such as `model.safetensors.tmp<pid>`), and finishes a
save that was killed between its marker and its rename. It refuses to run unless this process
holds the run lock (common/runlock.py), so another live run's temporary files are never deleted;
`begin_save` relies on the same lock when it clears older `.tmp-*` directories.

Test hook: the module attribute `_after_file_written` (None in production) is called with the path
of every checkpoint file once it is written and fsynced; tests set it (in subprocesses through
tests/hooked_train.py --kill-during-save) to kill the process in the middle of a save.
"""
import errno
import hashlib
import json
import os
import re

import torch
from safetensors import safe_open

from common import rundir
from common.errors import UserError
from common.io import (
    EXIT_WRITE_FAILED,  # noqa: F401 - re-exported: the exit code of a failed save
    WriteError,
    json_file_text,
    remove_stale_temp,
    through_file,
    write_error,
    write_file,
)
from common.removal import removal_blockers, remove
from common.removal import remove_quietly as remove_tree_quietly
from common.runlock import held_by_this_process
from common.weights import first_line, read_torch, safetensors_writer, save_safetensors, tensors_nbytes
from training.checkpoint.state import TrainerState, read_quietly
from training.start_checks import run_artefacts  # noqa: F401 - re-exported (defined torch-free: train.py asks early)

_NAME = re.compile(r"^step_(\d+)$")
_HASH_CHUNK = 1 << 20
_RESUME_HINT = "free some space or set train.output_dir on a larger disk, then resume with --resume auto"
_FIX_HINT = "check the folder's permissions and filesystem, then resume with --resume auto"

# Test-only hook: called with each checkpoint file's path right after it is written (see docstring).
_after_file_written = None

# A checkpoint or weight file could not be written: common.io's one write error (exit 74).
CheckpointWriteError = WriteError


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------- low-level writes
def _write_error(path, err, needed, previous, what="checkpoint"):
    """One line for an OSError while writing `path`; `needed` = bytes the whole save needs."""
    kept = f"the previous {what} {previous} is intact" if previous else f"no earlier {what} was touched"
    hint = _RESUME_HINT if err.errno in (errno.ENOSPC, errno.EDQUOT) else _FIX_HINT
    if not previous:  # the run has no checkpoint to resume: --resume auto starts it over (training/run_start.py)
        hint += " (with no checkpoint yet, it starts the run over)"
    return write_error(path, err, needed=needed, kept=kept, hint=hint)


def _torch_writer(obj):
    # a file object, so a failed write surfaces its OSError (common.io.os_error_of)
    return through_file(lambda f: torch.save(obj, f))


def _json_writer(obj):
    return through_file(lambda f: f.write(json_file_text(obj).encode()))  # the project's one JSON encoding


def _write_file(path, write):
    """Create `path` with write(path), fsynced; the test hook sees it (common.io.write_file)."""
    write_file(path, write, after_written=_after_file_written)


def save_weights(state_dict, path):
    """Write a state dict as safetensors atomically (tmp file + fsync + os.replace). A failure
    raises WriteError (exit 74) and leaves the previous file at `path` (if any) intact."""
    previous = path if os.path.exists(path) else None
    kept = f"the previous file {previous} is intact" if previous else "no earlier file was touched"
    save_safetensors(state_dict, path, kept=kept, hint=_FIX_HINT)


# ----------------------------------------------------------------------------- saving
def begin_save(root, step):
    """Main process: a fresh temporary directory for the checkpoint of `step`; stale ones removed
    (safe because the caller holds the run lock: no other live run writes here)."""
    try:
        os.makedirs(root, exist_ok=True)
        for name in os.listdir(root):
            if name.startswith(".tmp-"):
                remove_tree_quietly(os.path.join(root, name))
        tmp = tmp_dir_for(root, step)
        os.makedirs(tmp)
    except OSError as err:
        raise _write_error(getattr(err, "filename", None) or root, err, None, latest_complete(root)) from None
    return tmp


def tmp_dir_for(root, step):
    return os.path.join(root, ".tmp-" + rundir.checkpoint_name(step))


def abort_save(tmp):
    """Remove a temporary checkpoint directory after a failed save (idempotent)."""
    remove_tree_quietly(tmp)


def latest_complete(root):
    """The newest step_<N> directory of `root` that has a marker (cheap; no verification), or None."""
    for _, path in reversed(list_checkpoints(root)):
        if os.path.isfile(os.path.join(path, rundir.MARKER)):
            return path
    return None


def _write_checkpoint_files(tmp, payloads):
    """Write [(name, write, obj)] into `tmp` (write(path) makes the file of obj); any OSError aborts
    the whole save."""
    root = os.path.dirname(tmp.rstrip(os.sep))
    needed = sum(tensors_nbytes(obj) for _, _, obj in payloads)
    for name, write, _ in payloads:
        path = os.path.join(tmp, name)
        try:
            _write_file(path, write)
        except OSError as err:
            abort_save(tmp)
            raise _write_error(path, err, needed, latest_complete(root)) from None


def write_rank_files(tmp, rank, rng_state):
    """Every rank: its RNG states."""
    _write_checkpoint_files(tmp, [(rundir.rng_file(rank), _json_writer(rng_state), rng_state)])


def write_main_files(tmp, *, model_state, ema_state, optimizer_state, scheduler_state, scaler_state, trainer_state):
    """Main process: weights, optimizer/scheduler/scaler, the TrainerState."""
    if not isinstance(trainer_state, TrainerState):
        raise TypeError(f"trainer_state must be an training.checkpoint.state.TrainerState, "
                        f"got {type(trainer_state).__name__}")
    record = trainer_state.to_dict()
    payloads = [(rundir.WEIGHTS, safetensors_writer(model_state), model_state)]
    if ema_state is not None:
        payloads.append((rundir.EMA_WEIGHTS, safetensors_writer(ema_state), ema_state))
    for name, obj in ((rundir.OPTIMIZER, optimizer_state), (rundir.SCHEDULER, scheduler_state),
                      (rundir.SCALER, scaler_state)):
        if obj is not None:
            payloads.append((name, _torch_writer(obj), obj))
    payloads.append((rundir.TRAINER_STATE, _json_writer(record), record))
    _write_checkpoint_files(tmp, payloads)


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_HASH_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def commit_save(root, step):
    """Main process, after every rank wrote its files: marker (sizes + sha256), then the atomic rename."""
    tmp = tmp_dir_for(root, step)
    previous = latest_complete(root)
    final = os.path.join(root, rundir.checkpoint_name(step))
    old = os.path.join(root, ".tmp-old-" + rundir.checkpoint_name(step))
    try:
        names = sorted(os.listdir(tmp))
        sizes = {n: os.path.getsize(os.path.join(tmp, n)) for n in names}
        hashes = {n: file_sha256(os.path.join(tmp, n)) for n in names}
        _write_file(os.path.join(tmp, rundir.MARKER), _json_writer({"step": step, "files": sizes, "sha256": hashes}))
        _fsync_dir(tmp)
        if os.path.exists(final):  # re-saving a step after a resume: move the old one out of the way
            os.rename(final, old)
            os.rename(tmp, final)
            remove_tree_quietly(old)
        else:
            os.rename(tmp, final)
        _fsync_dir(root)
    except OSError as err:
        abort_save(tmp)
        if os.path.isdir(old) and not os.path.exists(final):  # put the re-saved step's old copy back
            os.rename(old, final)
        raise _write_error(getattr(err, "filename", None) or tmp, err, 4096, previous) from None
    return final


def _saved_after_nonfinite_loss(path):
    state = read_quietly(path)
    return state is not None and not state.loss_finite


def prune(root, keep_last, keep_steps=(), protect_last_finite=True, warn=print):
    """Delete complete checkpoints except the newest `keep_last`, those in `keep_steps` (best) and,
    with `protect_last_finite`, the newest one whose trainer state does not say `loss_finite: false`
    (so a run that diverged keeps a checkpoint to go back to). Incomplete ones older than the newest
    complete one are deleted too. Sizes only (no hashing): this runs after every save."""
    found = list_checkpoints(root)
    valid = [s for s, p in found if validation_error(p, verify=False) is None]
    keep = set(valid[-keep_last:]) | {s for s in keep_steps if s is not None}
    if protect_last_finite:
        paths = dict(found)
        finite = [s for s in valid if not _saved_after_nonfinite_loss(paths[s])]
        if finite:
            keep.add(finite[-1])
    newest = valid[-1] if valid else -1
    for s, path in found:
        # complete ones beyond the last K (not kept), and incomplete ones older than the newest
        if (s in valid and s not in keep) or (s not in valid and s < newest):
            _prune_one(path, warn)


def _prune_one(path, warn):
    """Delete one checkpoint, whole or not at all: a symlinked step_<N> loses the link, never its
    target; one that cannot be deleted completely (read-only, permissions) is kept, with a warning."""
    problems = removal_blockers([path])
    if problems:
        warn(f"warning: keeping {path} (pruning cannot delete it: {'; '.join(problems)})")
        return
    try:
        remove(path)
    except OSError as err:
        warn(f"warning: pruning {path} failed part-way ({err.strerror or err}); it is no longer a valid checkpoint")


# ----------------------------------------------------------------------------- stale temporary files
def _recover_or_remove(root, name, say):
    """A `.tmp-step_N` (killed between marker and rename) or `.tmp-old-step_N` (killed between the
    two renames of a re-save) that is complete while step_N is missing becomes step_N again."""
    path = os.path.join(root, name)
    base = name[len(".tmp-old-"):] if name.startswith(".tmp-old-") else name[len(".tmp-"):]
    final = os.path.join(root, base)
    if _NAME.match(base) and not os.path.exists(final) and validation_error(path) is None:
        os.rename(path, final)
        say(f"recovered checkpoint {final} (its save was interrupted just before the final rename)")
        return None
    remove_tree_quietly(path)
    return path


def clean_stale_temp(run_dir, warn=print, require_lock=True):
    """Remove what interrupted saves left in `run_dir` and its checkpoints folder: `.tmp-*`
    directories and `NAME.tmp<pid>` files (e.g. `model.safetensors.tmp<pid>`). Returns the removed
    paths (one warning line summarises them).

    `require_lock`: refuse (RuntimeError, a programming error) unless this process holds the run
    lock (common/runlock.py), so another live run's temporary files are never deleted."""
    if require_lock and not held_by_this_process(run_dir):
        raise RuntimeError(f"clean_stale_temp({run_dir!r}) needs this process to hold the run lock")
    root = rundir.checkpoints_dir(run_dir)
    removed = remove_stale_temp(run_dir)
    if os.path.isdir(root):
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            if name.startswith(".tmp-") and os.path.isdir(path) and not os.path.islink(path):
                gone = _recover_or_remove(root, name, warn)
                if gone:
                    removed.append(gone)
        removed += remove_stale_temp(root)
    if removed:
        warn(f"removed {len(removed)} temporary file(s) left by an interrupted run: "
             + ", ".join(os.path.relpath(p, run_dir) for p in removed[:5]) + (" ..." if len(removed) > 5 else ""))
    return removed


# ----------------------------------------------------------------------------- finding / validating
def list_checkpoints(root):
    """[(step, path)] of directories named step_<N>, oldest first (valid or not)."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in os.listdir(root):
        m = _NAME.match(name)
        if m and os.path.isdir(os.path.join(root, name)):
            out.append((int(m.group(1)), os.path.join(root, name)))
    return sorted(out)


def _structural_error(path, name):
    """Legacy checkpoints (no checksums): does the file at least parse?"""
    p = os.path.join(path, name)
    try:
        if name.endswith(".safetensors"):
            with safe_open(p, framework="pt") as f:
                for key in f.keys():
                    f.get_slice(key)
        elif name.endswith(".pt"):
            read_torch(p)
        elif name.endswith(".json"):
            with open(p) as f:
                json.load(f)
    except Exception as err:
        return f"checkpoint file {p} is unreadable ({first_line(err)})"
    return None


def validation_error(path, verify=True):
    """None when `path` is a complete, intact checkpoint, else why not (one line).

    Always: the marker exists and parses, every listed file exists with its recorded size.
    `verify`: every file's sha256 matches the marker (checkpoints from before checksums get a
    structural parse instead). `verify=False` is the cheap check used when pruning."""
    marker = os.path.join(path, rundir.MARKER)
    if not os.path.isfile(marker):
        return f"checkpoint {path} is incomplete (no {rundir.MARKER}: the save was interrupted)"
    try:
        with open(marker) as f:
            meta = json.load(f)
        files = meta["files"]
        hashes = meta.get("sha256")
        if not isinstance(files, dict) or not (hashes is None or isinstance(hashes, dict)):
            raise ValueError("malformed")
    except (OSError, ValueError, KeyError, TypeError):
        return f"checkpoint {path} has a corrupt {rundir.MARKER}"
    for name, size in files.items():
        p = os.path.join(path, name)
        if not os.path.isfile(p):
            return f"checkpoint {path} is missing {name}"
        if os.path.getsize(p) != size:
            return f"checkpoint file {p} is truncated or corrupt ({os.path.getsize(p)} bytes, expected {size})"
    if not verify:
        return None
    if rundir.TRAINER_STATE not in files:
        return f"checkpoint {path} is missing {rundir.TRAINER_STATE}"
    for name in files:
        if hashes is not None:
            expected = hashes.get(name)
            if expected is None:
                return f"checkpoint {path} has no checksum for {name}"
            if file_sha256(os.path.join(path, name)) != expected:
                return (f"checkpoint file {os.path.join(path, name)} is corrupt (its sha256 differs from the one "
                        "recorded when it was saved)")
        else:
            err = _structural_error(path, name)
            if err:
                return err
    return None


def find_latest(run_dir, warn=print, verify=True):
    """The newest valid checkpoint of a run, or None. Invalid ones (interrupted, truncated,
    corrupted after the save) are skipped with a warning naming each and why."""
    for step, path in reversed(list_checkpoints(os.path.join(run_dir, rundir.CHECKPOINTS))):
        err = validation_error(path, verify=verify)
        if err is None:
            return path
        warn(f"warning: skipping {err}")
    return None


def newest_verified_checkpoint(run_dir, require_finite_loss=True):
    """The newest checkpoint that passes full verification (and, with `require_finite_loss`, was not
    saved after a non-finite loss), or None: what a non-finite-loss error should name as kept."""
    for _, path in reversed(list_checkpoints(os.path.join(run_dir, rundir.CHECKPOINTS))):
        if validation_error(path) is not None:
            continue
        if require_finite_loss and _saved_after_nonfinite_loss(path):
            continue
        return path
    return None


def existing_checkpoints_line(run_dir, limit=5):
    """'checkpoints in RUN/checkpoints: step_.., step_.. (newest last)' or why there are none: what a
    mistyped --resume PATH should see."""
    root = os.path.join(run_dir, rundir.CHECKPOINTS)
    found = list_checkpoints(root)
    if not found:
        return f"{root} holds no checkpoint (start without --resume)"
    names = [os.path.basename(p) for _, p in found]
    shown = ", ".join(names[-limit:])
    more = f"{len(names) - limit} older and " if len(names) > limit else ""
    return f"checkpoints in {root}: {more}{shown} (newest last), or --resume auto for the newest valid one"


def resolve_resume(resume, run_dir, warn=print):
    """`--resume auto` -> newest valid checkpoint of run_dir, None when the run has no checkpoint
    at all, UserError (one line naming --resume PATH) when it has some but none is valid;
    `--resume PATH` -> PATH (a checkpoint directory, or a run directory / checkpoints folder
    meaning its newest valid one)."""
    if resume is None:
        return None
    if resume == "auto":
        found = find_latest(run_dir, warn)
        existing = list_checkpoints(os.path.join(run_dir, rundir.CHECKPOINTS))
        if found is None and existing:
            raise UserError(
                f"--resume auto: none of the {len(existing)} checkpoint(s) in "
                f"{os.path.join(run_dir, rundir.CHECKPOINTS)} is valid (see the warnings above); pass "
                f"--resume PATH with a checkpoint you trust, or --overwrite to start over")
        return found
    path = resume
    if not os.path.exists(path):
        raise UserError(f"--resume {path}: no such checkpoint; {existing_checkpoints_line(run_dir)}")
    if os.path.isfile(path):
        path = os.path.dirname(path)
    if not os.path.isfile(os.path.join(path, rundir.TRAINER_STATE)) and \
            not os.path.isfile(os.path.join(path, rundir.MARKER)):
        root = (path if os.path.basename(path.rstrip("/")) == rundir.CHECKPOINTS
                else os.path.join(path, rundir.CHECKPOINTS))
        found = find_latest(os.path.dirname(root.rstrip("/")), warn) if os.path.isdir(root) else None
        if found is None:
            raise UserError(f"--resume {resume}: not a checkpoint directory and no valid checkpoint inside")
        path = found
    err = validation_error(path)
    if err:
        raise UserError(f"{err}; pick another with --resume PATH or --resume auto")
    return path


# ----------------------------------------------------------------------------- loading
def load_torch(path):
    """A checkpoint's torch file (weights_only=True), None when the checkpoint has none."""
    return read_torch(path) if os.path.isfile(path) else None


def load_rng(path, rank):
    p = os.path.join(path, rundir.rng_file(rank))
    if not os.path.isfile(p):
        return None
    with open(p) as f:
        return json.load(f)
