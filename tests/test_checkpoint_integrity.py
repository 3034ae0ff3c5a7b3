"""Checkpoint integrity: checksums verified on resume, fallback past any damaged checkpoint, one line
when none is valid, clean failure on a full disk, stale temporary files, pruning that keeps a
checkpoint with a finite loss."""
import errno
import hashlib
import json
import os
import subprocess
import uuid

import pytest
import torch
from safetensors import SafetensorError

from common import io as common_io
from common import rundir
from common import weights as common_weights
from common.cli import run_cli
from common.errors import UserError
from common.runlock import RunLock
from common.weights import read_safetensors
from training.checkpoint import files as ck
from training.checkpoint.state import TrainerState


def _state(width=64, seed=0):
    """A small model + AdamW optimizer after one update, deterministic."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(width, width)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, width)).square().mean().backward()
    opt.step()
    return model, opt


def save_checkpoint(run_dir, step, width=64, loss_finite=True, ranks=1):
    model, opt = _state(width, seed=step)
    root = os.path.join(run_dir, rundir.CHECKPOINTS)
    tmp = ck.begin_save(root, step)
    for rank in range(ranks):
        ck.write_rank_files(tmp, rank, {"python": [rank, step]})
    ck.write_main_files(tmp, model_state=model.state_dict(), ema_state=model.state_dict(),
                        optimizer_state=opt.state_dict(), scheduler_state={"base_values": [1e-3]},
                        scaler_state=None,
                        trainer_state=TrainerState(step=step, epoch=0, batch=step, loss_finite=loss_finite))
    return ck.commit_save(root, step)


def _overwrite(path, offset, data):
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _flip_tensor_byte(path):
    """Flip one byte in the tensor data of a safetensors file (the last byte is tensor data)."""
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(size - 3)
        b = f.read(1)
        f.seek(size - 3)
        f.write(bytes([b[0] ^ 0x5A]))


def _same_size_garbage(path):
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(os.urandom(size))


CORRUPTIONS = {
    "header_garbage": lambda p: _overwrite(os.path.join(p, "model.safetensors"), 0, b"\xff" * 16),
    "flipped_tensor_bytes": lambda p: _flip_tensor_byte(os.path.join(p, "model.safetensors")),
    "unreadable_optimizer": lambda p: _same_size_garbage(os.path.join(p, "optimizer.pt")),
    "garbage_state_file": lambda p: _same_size_garbage(os.path.join(p, rundir.TRAINER_STATE)),
    "truncated_ema": lambda p: os.truncate(os.path.join(p, rundir.EMA_WEIGHTS), 100),
    "missing_rng": lambda p: os.remove(os.path.join(p, "rng_0.json")),
}


def test_marker_records_sha256_of_every_file(tmp_path):
    path = save_checkpoint(str(tmp_path), 5, ranks=2)
    meta = json.load(open(os.path.join(path, rundir.MARKER)))
    on_disk = sorted(n for n in os.listdir(path) if n != rundir.MARKER)
    assert sorted(meta["sha256"]) == sorted(meta["files"]) == on_disk
    assert {"model.safetensors", rundir.EMA_WEIGHTS, "optimizer.pt", "rng_0.json", "rng_1.json"} <= set(on_disk)
    for name, digest in meta["sha256"].items():
        assert hashlib.sha256(open(os.path.join(path, name), "rb").read()).hexdigest() == digest
    assert ck.validation_error(path) is None


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_damaged_newest_checkpoint_is_skipped_with_a_warning(tmp_path, kind):
    run = str(tmp_path)
    older = save_checkpoint(run, 5)
    newest = save_checkpoint(run, 10)
    CORRUPTIONS[kind](newest)
    warnings = []
    assert ck.find_latest(run, warn=warnings.append) == older
    assert len(warnings) == 1 and newest in warnings[0] and "skipping" in warnings[0]
    warnings.clear()
    assert ck.resolve_resume("auto", run, warn=warnings.append) == older
    assert newest in warnings[0]
    with pytest.raises(UserError) as err:  # naming the damaged one explicitly is refused, in one line
        ck.resolve_resume(newest, run, warn=lambda m: None)
    assert newest in str(err.value) and "\n" not in str(err.value)


def test_flipped_tensor_bytes_need_the_checksum(tmp_path):
    """Same size, valid header: only the sha256 tells (the size-only check used to accept it)."""
    path = save_checkpoint(str(tmp_path), 5)
    _flip_tensor_byte(os.path.join(path, "model.safetensors"))
    assert ck.validation_error(path, verify=False) is None
    read_safetensors(os.path.join(path, "model.safetensors"))  # still loads: nothing but the hash notices
    assert "sha256" in ck.validation_error(path)


def test_legacy_checkpoint_without_checksums_gets_a_structural_check(tmp_path):
    run = str(tmp_path)
    older = save_checkpoint(run, 5)
    newest = save_checkpoint(run, 10)
    for path in (older, newest):
        marker = os.path.join(path, rundir.MARKER)
        meta = json.load(open(marker))
        del meta["sha256"]
        json.dump(meta, open(marker, "w"))
    assert ck.validation_error(newest) is None
    _same_size_garbage(os.path.join(newest, "optimizer.pt"))
    assert "unreadable" in ck.validation_error(newest)
    assert ck.find_latest(run, warn=lambda m: None) == older


def test_auto_resume_with_no_valid_checkpoint_is_one_line_naming_resume_path(tmp_path):
    run = str(tmp_path)
    for step in (5, 10):
        CORRUPTIONS["flipped_tensor_bytes"](save_checkpoint(run, step))
    warnings = []
    with pytest.raises(UserError) as err:
        ck.resolve_resume("auto", run, warn=warnings.append)
    msg = str(err.value)
    assert "\n" not in msg and "--resume PATH" in msg and "none of the 2 checkpoint(s)" in msg
    assert len(warnings) == 2  # each damaged one named
    # no checkpoints at all: a fresh start (None), not an error
    assert ck.resolve_resume("auto", str(tmp_path / "empty"), warn=warnings.append) is None


def test_newest_verified_checkpoint_skips_damaged_and_nonfinite(tmp_path):
    run = str(tmp_path)
    good = save_checkpoint(run, 5)
    diverged = save_checkpoint(run, 10, loss_finite=False)
    CORRUPTIONS["header_garbage"](save_checkpoint(run, 15))
    assert ck.newest_verified_checkpoint(run) == good
    assert ck.newest_verified_checkpoint(run, require_finite_loss=False) == diverged
    CORRUPTIONS["flipped_tensor_bytes"](good)
    assert ck.newest_verified_checkpoint(run) is None
    assert ck.newest_verified_checkpoint(str(tmp_path / "none")) is None


@pytest.mark.parametrize("protect", [True, False])
def test_prune_never_removes_the_last_checkpoint_with_a_finite_loss(tmp_path, protect):
    run = str(tmp_path)
    root = os.path.join(run, rundir.CHECKPOINTS)
    for step, finite in ((5, True), (10, True), (15, False), (20, False)):
        save_checkpoint(run, step, width=8, loss_finite=finite)
    ck.prune(root, keep_last=2, protect_last_finite=protect)
    kept = [s for s, _ in ck.list_checkpoints(root)]
    assert kept == ([10, 15, 20] if protect else [15, 20])


def test_after_file_written_hook_sees_every_file_before_the_marker(tmp_path, monkeypatch):
    written = []
    monkeypatch.setattr(ck, "_after_file_written", written.append)
    path = save_checkpoint(str(tmp_path), 3)
    names = [os.path.basename(p) for p in written]
    assert names[0] == "rng_0.json" and names[1] == "model.safetensors" and names[-1] == rundir.MARKER
    assert sorted(names) == sorted(os.listdir(path))
    assert all(os.path.basename(os.path.dirname(p)) == ".tmp-" + rundir.checkpoint_name(3) for p in written)


# ----------------------------------------------------------------------------- write failures
def _assert_clean_failure(err, run, previous, failing_name):
    msg = str(err.value)
    assert "\n" not in msg and failing_name in msg and "No space left on device" in msg
    assert "needs about" in msg and "free" in msg and previous in msg and "intact" in msg
    assert err.value.exit_code == ck.EXIT_WRITE_FAILED
    root = os.path.join(run, rundir.CHECKPOINTS)
    assert [n for n in os.listdir(root) if n.startswith(".tmp")] == []  # temporary files removed
    assert [p for _, p in ck.list_checkpoints(root)] == [previous]
    assert ck.validation_error(previous) is None  # previous checkpoint intact (checksums verified)


class _DiskFullAfter:
    """A file that accepts `limit` bytes, then fails like a full disk (ENOSPC)."""

    def __init__(self, path, limit):
        self.file, self.left = open(path, "wb"), limit

    def write(self, data):
        data = memoryview(data).cast("B")
        if len(data) > self.left:
            self.file.write(data[:self.left])
            self.left = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.left -= len(data)
        return self.file.write(data)

    def flush(self):
        self.file.flush()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def test_disk_full_during_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """The disk fills while torch.save writes optimizer.pt (torch reports that as 'unexpected pos')."""
    run = str(tmp_path)
    previous = save_checkpoint(run, 5)
    real_open = common_io._open_for_write
    monkeypatch.setattr(common_io, "_open_for_write", lambda p: _DiskFullAfter(p, 100) if p.endswith("optimizer.pt")
                        else real_open(p))
    with pytest.raises(ck.CheckpointWriteError) as err:
        save_checkpoint(run, 10)
    _assert_clean_failure(err, run, previous, "optimizer.pt")
    assert "unexpected pos" not in str(err.value)


def test_cli_exit_code_for_a_write_failure(capsys):
    def main():
        raise ck.CheckpointWriteError("cannot write x: No space left on device")

    with pytest.raises(SystemExit) as exc:
        run_cli(main)
    assert exc.value.code == ck.EXIT_WRITE_FAILED == 74
    assert capsys.readouterr().err == "error: cannot write x: No space left on device\n"


def test_export_weights_failure_leaves_previous_file_and_no_tmp(tmp_path, monkeypatch):
    path = str(tmp_path / "model.safetensors")
    ck.save_weights({"w": torch.ones(3)}, path)

    def broken(tensors, filename, metadata=None):  # how safetensors reports a failed write
        open(filename, "wb").write(b"partial")
        raise SafetensorError("Error while serializing: I/O error: Input/output error (os error 5)")

    monkeypatch.setattr(common_weights, "save_file", broken)
    with pytest.raises(ck.CheckpointWriteError) as err:
        ck.save_weights({"w": torch.zeros(3)}, path)
    assert "Input/output error" in str(err.value) and path in str(err.value)
    assert sorted(os.listdir(tmp_path)) == ["model.safetensors"]
    assert torch.equal(read_safetensors(path)["w"], torch.ones(3))


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1.5 MiB tmpfs (root only, where mount is allowed); skipped elsewhere."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mnt)],
                              capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a tmpfs here ({e})")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()})")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True, timeout=20)


def test_disk_full_on_a_real_small_filesystem(small_tmpfs):
    run = os.path.join(small_tmpfs, "run-" + uuid.uuid4().hex[:6])
    previous = save_checkpoint(run, 5, width=256)  # ~1 MB: fits once, not twice
    with pytest.raises(ck.CheckpointWriteError) as err:
        save_checkpoint(run, 10, width=256)
    msg = str(err.value)
    assert any(name in msg for name in ("model.safetensors", rundir.EMA_WEIGHTS, "optimizer.pt"))
    _assert_clean_failure(err, run, previous, ".tmp-" + rundir.checkpoint_name(10))
    # the weight export onto the full disk fails the same way, leaving no model.safetensors.tmp<pid>
    big = {"w": torch.zeros(1024, 1024)}
    with pytest.raises(ck.CheckpointWriteError):
        ck.save_weights(big, os.path.join(run, "model.safetensors"))
    assert not [n for n in os.listdir(run) if ".tmp" in n]


# ----------------------------------------------------------------------------- stale temporary files
def test_clean_stale_temp_removes_leftovers_and_recovers_a_finished_save(tmp_path):
    run = str(tmp_path)
    root = os.path.join(run, rundir.CHECKPOINTS)
    save_checkpoint(run, 5)
    finished = save_checkpoint(run, 9)
    os.rename(finished, ck.tmp_dir_for(root, 9))  # killed between its marker and its rename
    partial = ck.tmp_dir_for(root, 12)  # killed mid-save: no marker
    os.makedirs(partial)
    open(os.path.join(partial, "model.safetensors"), "wb").write(b"x" * 10)
    os.makedirs(os.path.join(root, ".tmp-old-" + rundir.checkpoint_name(5)))  # step_5 exists: a leftover
    # temp files of killed writers: pids above Linux's PID_MAX_LIMIT (2^22), so surely no live process's
    for name in ("model.safetensors.tmp4194305", "config.yaml.tmp4194306"):
        open(os.path.join(run, name), "w").write("half")
    keep = ["notes.tmp", "model.safetensors"]
    for name in keep:
        open(os.path.join(run, name), "w").write("mine")

    with pytest.raises(RuntimeError, match="run lock"):  # only the lock holder may delete temporary files
        ck.clean_stale_temp(run)
    warnings = []
    with RunLock(run):
        removed = ck.clean_stale_temp(run, warn=warnings.append)
    assert sorted(os.path.basename(p) for p in removed) == sorted(
        ["model.safetensors.tmp4194305", "config.yaml.tmp4194306", ".tmp-" + rundir.checkpoint_name(12),
         ".tmp-old-" + rundir.checkpoint_name(5)])
    assert [s for s, _ in ck.list_checkpoints(root)] == [5, 9]
    assert ck.validation_error(os.path.join(root, rundir.checkpoint_name(9))) is None
    assert not [n for n in os.listdir(root) if n.startswith(".tmp")]
    assert all(os.path.exists(os.path.join(run, n)) for n in keep)
    assert any("recovered" in w for w in warnings) and any("removed 4" in w for w in warnings)
    assert ck.clean_stale_temp(run, warn=warnings.append, require_lock=False) == []  # idempotent


def test_run_artefacts_lists_what_a_fresh_start_would_delete(tmp_path):
    run = str(tmp_path)
    assert ck.run_artefacts(run) == []
    save_checkpoint(run, 1, width=4)
    open(os.path.join(run, "summary.json"), "w").write("{}")
    assert ck.run_artefacts(run) == ["summary.json", rundir.CHECKPOINTS]
