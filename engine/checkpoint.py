"""Atomic training checkpoints: RUN_DIR/checkpoints/step_<N>/ with a completion marker.

Layout of one checkpoint directory:
    model.safetensors       raw weights (unwrapped state dict, incl. output_head)
    ema.safetensors         EMA weights (when train.ema)
    optimizer.pt            optimizer state dict   (torch.save; loaded with weights_only=True)
    scheduler.pt            timm scheduler state dict
    scaler.pt               fp16 grad-scaler state (fp16 only)
    trainer_state.json      step/epoch counters, loader position, best metric, config fingerprint
    rng_<rank>.json         every rank's Python/numpy/torch RNG states
    COMPLETE.json           written last: {file: size}; a directory without it is not a checkpoint

Atomicity: everything is written into `.tmp-step_<N>/`, fsynced, the marker is written last, then
the directory is renamed to `step_<N>` (one rename on a POSIX filesystem). A kill at any moment
leaves either the old set of checkpoints or the new one, never a half-written `step_<N>`; a stale
`.tmp-*` directory is ignored by `find_latest` and removed by the next save.

Fault hook (tests): RESMLP_KILL_DURING_SAVE=<step> SIGKILLs the process in the middle of writing
that step's checkpoint (after the weights, before the marker).
"""
import json
import os
import re
import shutil
import signal

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from common import io as common_io
from common.errors import UserError

CHECKPOINT_SUBDIR = "checkpoints"
MARKER = "COMPLETE.json"
STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"^step_(\d+)$")


def checkpoint_name(step):
    return f"step_{step:09d}"


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


def _fsync_file(path):
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def save_weights(state_dict, path):
    """Write a state dict as safetensors atomically (tmp file + fsync + os.replace)."""
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()}
    tmp = f"{path}.tmp{os.getpid()}"
    save_file(tensors, tmp)
    _fsync_file(tmp)
    os.replace(tmp, path)


def write_json(obj, path):
    common_io.write_json(obj, path)


# ----------------------------------------------------------------------------- saving
def begin_save(root, step):
    """Main process: a fresh temporary directory for the checkpoint of `step`; stale ones removed."""
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):
        if name.startswith(".tmp-"):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    tmp = os.path.join(root, ".tmp-" + checkpoint_name(step))
    os.makedirs(tmp)
    return tmp


def tmp_dir_for(root, step):
    return os.path.join(root, ".tmp-" + checkpoint_name(step))


def write_rank_files(tmp, rank, rng_state):
    """Every rank: its RNG states."""
    write_json(rng_state, os.path.join(tmp, f"rng_{rank}.json"))


def write_main_files(tmp, *, model_state, ema_state, optimizer_state, scheduler_state, scaler_state, trainer_state):
    """Main process: weights, optimizer/scheduler/scaler, counters."""
    save_weights(model_state, os.path.join(tmp, "model.safetensors"))
    if os.environ.get("RESMLP_KILL_DURING_SAVE") == str(trainer_state["step"]):
        os.kill(os.getpid(), signal.SIGKILL)  # fault injection: die mid-save
    if ema_state is not None:
        save_weights(ema_state, os.path.join(tmp, "ema.safetensors"))
    for name, obj in (("optimizer.pt", optimizer_state), ("scheduler.pt", scheduler_state), ("scaler.pt", scaler_state)):
        if obj is not None:
            torch.save(obj, os.path.join(tmp, name))
            _fsync_file(os.path.join(tmp, name))
    write_json(trainer_state, os.path.join(tmp, STATE_FILE))


def commit_save(root, step):
    """Main process, after every rank wrote its files: marker, then the atomic rename."""
    tmp = tmp_dir_for(root, step)
    sizes = {n: os.path.getsize(os.path.join(tmp, n)) for n in sorted(os.listdir(tmp))}
    write_json({"step": step, "files": sizes}, os.path.join(tmp, MARKER))
    _fsync_dir(tmp)
    final = os.path.join(root, checkpoint_name(step))
    if os.path.exists(final):  # re-saving a step after a resume: move the old one out of the way
        old = os.path.join(root, ".tmp-old-" + checkpoint_name(step))
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(root)
    return final


def prune(root, keep_last, keep_steps=()):
    """Delete complete checkpoints except the newest `keep_last` and those in `keep_steps` (best)."""
    found = list_checkpoints(root)
    valid = [s for s, p in found if validation_error(p) is None]
    keep = set(valid[-keep_last:]) | {s for s in keep_steps if s is not None}
    newest = valid[-1] if valid else -1
    for s, path in found:
        # complete ones beyond the last K (not the best), and incomplete ones older than the newest
        if (s in valid and s not in keep) or (s not in valid and s < newest):
            shutil.rmtree(path, ignore_errors=True)


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


def validation_error(path):
    """None when `path` is a complete checkpoint, else why not (one line)."""
    marker = os.path.join(path, MARKER)
    if not os.path.isfile(marker):
        return f"checkpoint {path} is incomplete (no {MARKER}: the save was interrupted)"
    try:
        with open(marker) as f:
            files = json.load(f)["files"]
    except (OSError, ValueError, KeyError):
        return f"checkpoint {path} has a corrupt {MARKER}"
    for name, size in files.items():
        p = os.path.join(path, name)
        if not os.path.isfile(p):
            return f"checkpoint {path} is missing {name}"
        if os.path.getsize(p) != size:
            return f"checkpoint file {p} is truncated or corrupt ({os.path.getsize(p)} bytes, expected {size})"
    return None


def find_latest(run_dir, warn=print):
    """The newest valid checkpoint of a run (partial or truncated ones are skipped), or None."""
    for step, path in reversed(list_checkpoints(os.path.join(run_dir, CHECKPOINT_SUBDIR))):
        err = validation_error(path)
        if err is None:
            return path
        warn(f"skipping {err}")
    return None


def resolve_resume(resume, run_dir, warn=print):
    """`--resume auto` -> latest valid checkpoint of run_dir or None; `--resume PATH` -> PATH
    (a checkpoint directory, or a run directory / checkpoints folder meaning its latest)."""
    if resume is None:
        return None
    if resume == "auto":
        return find_latest(run_dir, warn)
    path = resume
    if not os.path.exists(path):
        raise UserError(f"--resume {path}: no such checkpoint")
    if os.path.isfile(path):
        path = os.path.dirname(path)
    if not os.path.isfile(os.path.join(path, STATE_FILE)) and not os.path.isfile(os.path.join(path, MARKER)):
        root = path if os.path.basename(path.rstrip("/")) == CHECKPOINT_SUBDIR else os.path.join(path, CHECKPOINT_SUBDIR)
        found = find_latest(os.path.dirname(root.rstrip("/")), warn) if os.path.isdir(root) else None
        if found is None:
            raise UserError(f"--resume {resume}: not a checkpoint directory and no valid checkpoint inside")
        path = found
    err = validation_error(path)
    if err:
        raise UserError(f"{err}; pick another with --resume PATH or --resume auto")
    return path


# ----------------------------------------------------------------------------- loading
def read_trainer_state(path):
    try:
        with open(os.path.join(path, STATE_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise UserError(f"checkpoint {path}: cannot read {STATE_FILE} ({err})") from None


def load_weights(path):
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, RuntimeError) as err:
        raise UserError(f"weights file {path} is truncated or corrupt: {str(err).splitlines()[0]}") from None


def load_torch(path):
    if not os.path.isfile(path):
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a damaged file
        raise UserError(f"checkpoint file {path} is truncated or corrupt: {str(err).splitlines()[0]}") from None


def load_rng(path, rank):
    p = os.path.join(path, f"rng_{rank}.json")
    if not os.path.isfile(p):
        return None
    with open(p) as f:
        return json.load(f)


def check_fingerprint(saved, current, path):
    """A checkpoint only resumes the same model/head/classes; otherwise one clear line."""
    for key in sorted(set(saved) | set(current)):
        if saved.get(key) != current.get(key):
            raise UserError(
                f"checkpoint {path} was trained with {key}={saved.get(key)!r} but the config has "
                f"{key}={current.get(key)!r}; resume with the same model/head configuration or start "
                f"a new run in another train.output_dir"
            )


def load_state_dict_strict(module, state, path):
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as err:
        first = str(err).splitlines()[1].strip() if len(str(err).splitlines()) > 1 else str(err)
        raise UserError(f"checkpoint {path} does not match the model: {first}") from None
