"""Files on disk: the one run-directory naming (one EMA name, the old one still
read), deleting that never follows a link and refuses before deleting anything, and the one atomic,
error-mapped writer: read-only and full filesystems (a small tmpfs mounted here when running as
root, skipped with the reason otherwise), a path through a file, a kill in the middle of eval.csv,
and the temporary files a killed evaluation leaves (removed under the lock by the next one)."""
import errno
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest
import torch

from common import io as common_io
from common import rundir
from common.cli import run_cli
from common.io import WriteError
from common.removal import removal_blockers, remove, remove_all
from common.runlock import RunLock
from evaluation import tables
from evaluation.metrics import RECORD_FIELDS
from file_tree import snapshot
from test_train_helpers import ROOT, reset_accelerate_state, run_inprocess, tiny_cfg, write_cfg
from training.checkpoint import files as ck
from training.checkpoint.state import TrainerState
from training.run_start import delete_old_run

RUN_FILES = (rundir.WEIGHTS, rundir.SUMMARY, rundir.METRICS, rundir.EPOCHS)
TRAINED = ("optim.epochs=1", "train.save_every=100")  # 8 updates, one checkpoint (step 8)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = str(tmp_path_factory.mktemp("trained") / "run")
    assert run_inprocess(tiny_cfg(run, *TRAINED)) == 0
    return run


def _copy(trained, tmp_path):
    """A copy of the finished one-epoch run (EMA on, one checkpoint: step 8) and its config."""
    run = str(tmp_path / "run")
    shutil.copytree(trained, run, symlinks=True)
    return run, tiny_cfg(run, *TRAINED)


def _fake_run(run):
    """A run directory's artefacts (contents do not matter to deleting them)."""
    os.makedirs(run, exist_ok=True)
    for name in RUN_FILES:
        with open(os.path.join(run, name), "w") as f:
            f.write(name)


def _train_cli(capsys, cfg, *args, tmp_path):
    """train.py's command line in this process -> (exit status, stdout, stderr)."""
    import train

    reset_accelerate_state()
    capsys.readouterr()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the machine is shared: one thread is faster than two contended ones
    try:
        with pytest.raises(SystemExit) as exc:
            run_cli(train.main, ["--config", write_cfg(cfg, tmp_path / f"cli-{uuid.uuid4().hex[:6]}.yaml"), *args])
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def _mount(path, size):
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")


def _remount_read_only(path):
    done = subprocess.run(["mount", "-o", "remount,ro", str(path)], capture_output=True, text=True, timeout=20)
    if done.returncode != 0:
        pytest.skip(f"cannot remount the tmpfs read-only ({done.stderr.strip()})")


@pytest.fixture
def tmpfs(tmp_path):
    """A mounter of small tmpfs filesystems (root only), all unmounted at teardown."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (read-only and full filesystems are simulated with one)")
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    mounted = []

    def mount(path, size="2m"):
        os.makedirs(path, exist_ok=True)
        _mount(path, size)
        mounted.append(str(path))
        return str(path)

    yield mount
    for path in reversed(mounted):
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=20)


# ----------------------------------------------------------------------------- names
def test_one_ema_name():
    assert rundir.EMA_WEIGHTS == "model_ema.safetensors"  # the run directory's documented name, now everywhere
    assert rundir.eval_outputs("out/e.json") == ["out/e.json", "out/e.csv", "out/e.examples.safetensors"]


# ----------------------------------------------------------------------------- deleting
def test_overwrite_removes_symlinks_themselves_and_keeps_their_targets(tmp_path):
    outside = tmp_path / "outside"
    (outside / "ckpts" / "step_000000003").mkdir(parents=True)
    (outside / "ckpts" / "step_000000003" / "model.safetensors").write_bytes(b"precious")
    (outside / "ema.safetensors").write_bytes(b"precious ema")
    run = str(tmp_path / "run")
    _fake_run(run)
    os.symlink(outside / "ckpts", os.path.join(run, rundir.CHECKPOINTS))
    os.symlink(outside / "ema.safetensors", os.path.join(run, rundir.EMA_WEIGHTS))
    os.symlink(outside / "gone", os.path.join(run, rundir.TENSORBOARD))  # dangling
    kept_outside = snapshot(str(outside))
    names = ck.run_artefacts(run) + [rundir.TENSORBOARD]
    assert rundir.CHECKPOINTS in names and rundir.EMA_WEIGHTS in names
    said = []
    delete_old_run(run, names, said.append)
    assert sorted(os.listdir(run)) == []
    assert snapshot(str(outside)) == kept_outside  # the targets survive
    assert len(said) == 1 and said[0].startswith("--overwrite: deleting")


def test_overwrite_with_a_symlinked_checkpoints_folder_starts_a_new_run(trained, tmp_path, capsys):
    run, cfg = _copy(trained, tmp_path)
    outside = str(tmp_path / "elsewhere")
    shutil.move(os.path.join(run, rundir.CHECKPOINTS), outside)  # the user keeps checkpoints on another disk
    os.symlink(outside, os.path.join(run, rundir.CHECKPOINTS))
    kept = snapshot(outside)
    code, out, err = _train_cli(capsys, cfg, "--overwrite", tmp_path=tmp_path)
    assert code == 0, err
    assert "--overwrite: deleting" in out and rundir.CHECKPOINTS in out
    assert not os.path.islink(os.path.join(run, rundir.CHECKPOINTS))  # the new run's own folder
    assert snapshot(outside) == kept
    assert os.path.isfile(os.path.join(run, rundir.SUMMARY))


def test_pruning_removes_a_symlinked_checkpoint_not_its_target(tmp_path):
    run = str(tmp_path / "run")
    root = os.path.join(run, rundir.CHECKPOINTS)
    for step in (1, 2, 3):
        _save_checkpoint(run, step)
    outside = str(tmp_path / "archive")
    shutil.move(os.path.join(root, rundir.checkpoint_name(1)), outside)
    os.symlink(outside, os.path.join(root, rundir.checkpoint_name(1)))
    kept = snapshot(outside)
    ck.prune(root, keep_last=1, protect_last_finite=False, warn=lambda m: None)
    assert [s for s, _ in ck.list_checkpoints(root)] == [3]
    assert sorted(os.listdir(root)) == [rundir.checkpoint_name(3)]
    assert snapshot(outside) == kept


def _save_checkpoint(run, step):
    root = os.path.join(run, rundir.CHECKPOINTS)
    tmp = ck.begin_save(root, step)
    ck.write_rank_files(tmp, 0, {"python": [step]})
    ck.write_main_files(tmp, model_state={"w": torch.full((4,), float(step))}, ema_state=None,
                        optimizer_state={"state": {}}, scheduler_state=None, scaler_state=None,
                        trainer_state=TrainerState(step=step))
    return ck.commit_save(root, step)


def test_remove_unlinks_links_and_never_follows_them_inside_folders(tmp_path):
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep.txt").write_text("keep")
    folder = tmp_path / "folder"
    folder.mkdir()
    os.symlink(target, folder / "link_to_dir")
    os.symlink(target / "keep.txt", folder / "link_to_file")
    remove(str(folder))
    assert not folder.exists() and (target / "keep.txt").read_text() == "keep"
    link = tmp_path / "link"
    os.symlink(target, link)
    remove(str(link))
    assert not os.path.lexists(link) and (target / "keep.txt").exists()


def test_a_refused_overwrite_leaves_the_run_directory_exactly_as_it_was(trained, tmp_path, tmpfs, capsys):
    run, cfg = _copy(trained, tmp_path)
    saved = str(tmp_path / "saved_ckpts")
    shutil.move(os.path.join(run, rundir.CHECKPOINTS), saved)
    ro = tmpfs(os.path.join(run, rundir.CHECKPOINTS), "64m")  # checkpoints on a filesystem of their own, read-only
    shutil.copytree(saved, ro, dirs_exist_ok=True)
    _remount_read_only(ro)
    before = snapshot(run)
    assert removal_blockers([ro])  # seen before deleting anything
    code, out, err = _train_cli(capsys, cfg, "--overwrite", tmp_path=tmp_path)
    assert code == 74 and err.count("\n") == 1, err
    assert "nothing was deleted" in err and rundir.CHECKPOINTS in err and "deleting" not in out
    assert snapshot(run) == before  # weights, logs, summary and checkpoints all still there


def test_remove_all_refuses_before_deleting_anything(tmp_path, tmpfs):
    ro = tmpfs(tmp_path / "ro")
    open(os.path.join(ro, "f"), "w").write("x")
    _remount_read_only(ro)
    first = tmp_path / "first.txt"
    first.write_text("first")
    with pytest.raises(WriteError) as err:
        remove_all([str(first), os.path.join(ro, "f")], why="test")
    assert "read-only" in str(err.value) and "nothing was deleted" in str(err.value)
    assert first.read_text() == "first" and os.path.isfile(os.path.join(ro, "f"))


# ----------------------------------------------------------------------------- unwritable paths
def _assert_one_line_74(code, err, *needles):
    assert code == 74, err
    assert err.count("\n") == 1 and err.startswith("error: cannot write "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err, (needle, err)


def test_output_dir_through_a_file_is_one_line_exit_74(tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    run = str(a_file / "run")
    code, _, err = _train_cli(capsys, tiny_cfg(run, "optim.epochs=1"), tmp_path=tmp_path)
    _assert_one_line_74(code, err, str(a_file), "Not a directory")


def test_read_only_output_dir_is_one_line_exit_74(tmp_path, tmpfs, capsys):
    ro = tmpfs(tmp_path / "ro")
    os.makedirs(os.path.join(ro, "run"))
    _remount_read_only(ro)
    code, _, err = _train_cli(capsys, tiny_cfg(os.path.join(ro, "run"), "optim.epochs=1"), tmp_path=tmp_path)
    _assert_one_line_74(code, err, os.path.join(ro, "run"), "Read-only file system")
    code, _, err = _train_cli(capsys, tiny_cfg(os.path.join(ro, "new_run"), "optim.epochs=1"), tmp_path=tmp_path)
    _assert_one_line_74(code, err, os.path.join(ro, "new_run"), "Read-only file system")


def _eval_cli(capsys, run, output):
    import eval as eval_entry

    reset_accelerate_state()
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        run_cli(eval_entry.main, ["--checkpoint", run, "--quiet", "--calib", "none", "--output", output])
    return exc.value.code, capsys.readouterr().err


def test_eval_output_unwritable_is_one_line_exit_74(trained, tmp_path, tmpfs, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    code, err = _eval_cli(capsys, trained, str(a_file / "eval.json"))
    _assert_one_line_74(code, err, "Not a directory")

    ro = tmpfs(tmp_path / "ro")
    _remount_read_only(ro)
    code, err = _eval_cli(capsys, trained, os.path.join(ro, "eval.json"))
    _assert_one_line_74(code, err, ro, "Read-only file system")

    full = tmpfs(tmp_path / "full", "256k")
    filler = os.path.join(full, "filler")
    with open(filler, "wb", buffering=0) as f:  # fill it up
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    os.truncate(filler, os.path.getsize(filler) - 4096)  # one page left: the lock fits, eval.json does not
    code, err = _eval_cli(capsys, trained, os.path.join(full, "eval.json"))
    _assert_one_line_74(code, err, full, "No space left on device")
    assert sorted(os.listdir(full)) == ["filler"]  # no eval.json.tmp<pid>, no half file, no lock


def test_disk_full_while_writing_eval_json_leaves_no_temp_file(tmp_path, monkeypatch):
    real_open = common_io._open_for_write

    class FullAfter:
        def __init__(self, path):
            self.file = real_open(path)

        def write(self, data):
            self.file.write(bytes(data)[:10])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    path = str(tmp_path / "eval.json")
    common_io.write_json({"old": 1}, path)
    monkeypatch.setattr(common_io, "_open_for_write", FullAfter)
    with pytest.raises(WriteError) as err:
        common_io.write_json({"new": 2}, path)
    assert err.value.exit_code == 74 and "\n" not in str(err.value)
    assert path in str(err.value) and "No space left on device" in str(err.value)
    assert sorted(os.listdir(tmp_path)) == ["eval.json"] and common_io.read_json(path) == {"old": 1}


# ----------------------------------------------------------------------------- a kill mid-write
KILL_DURING_CSV = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from common import io as common_io
    from evaluation import tables

    real_open = common_io._open_for_write

    class KilledMidWrite:
        def __init__(self, path):
            self.file = real_open(path)

        def write(self, data):
            self.file.write(bytes(data)[: len(data) // 2])
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)  # as a preemption would, half-way through the file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    common_io._open_for_write = KilledMidWrite
    tables.write_csv([{{"top1": 0.9, "loss": 0.1}}], {path!r})
""")


def _records(n=4):
    records = {k: torch.zeros(n, dtype=torch.int64) for k in RECORD_FIELDS}
    records.update(p_y=torch.full((n,), 0.5), max_prob=torch.full((n,), 0.5), loss=torch.ones(n),
                   top5_hit=torch.ones(n, dtype=torch.bool))
    return records


def test_a_kill_during_the_csv_write_keeps_the_old_file_and_the_next_eval_cleans_up(tmp_path):
    from inference import eval_command

    output = str(tmp_path / "eval.json")
    csv_path = rundir.eval_csv_path(output)
    tables.write_csv([{"top1": 0.5, "loss": 0.7}], csv_path)
    old = open(csv_path).read()
    done = subprocess.run([sys.executable, "-c", KILL_DURING_CSV.format(root=ROOT, path=csv_path)], timeout=120)
    assert done.returncode == -signal.SIGKILL
    assert open(csv_path).read() == old  # the old row, not a header without values
    leftovers = [n for n in os.listdir(tmp_path) if common_io.is_temp_name(n)]
    assert len(leftovers) == 1 and leftovers[0].startswith("eval.csv.tmp")
    other = tmp_path / "notes.tmp123"  # a temporary file of something else: not eval's to delete
    other.write_text("mine")

    result = {"head": "softmax", "split": "val", "dataset": "builtin10", "weights": "raw", "checkpoint": "x",
              "top1": 0.75, "n": 4}
    eval_command.write_outputs(result, _records(), output)  # the next evaluation, under the folder's lock
    assert not [n for n in os.listdir(tmp_path) if n.startswith("eval.csv.tmp")]
    assert other.read_text() == "mine"
    assert "0.75" in open(csv_path).read() and common_io.read_json(output)["top1"] == 0.75
    assert not os.path.exists(os.path.join(tmp_path, rundir.LOCK))


def test_temp_files_are_only_removed_under_the_lock(tmp_path):
    stale = tmp_path / "eval.json.tmp4194305"  # a pid above Linux's PID_MAX_LIMIT: no live process's
    stale.write_text("half")
    with RunLock(str(tmp_path), purpose="eval"):
        assert common_io.remove_stale_temp(str(tmp_path), names=["eval.json"]) == [str(stale)]
    assert not stale.exists()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_weight_files_follow_the_umask(tmp_path, umask):
    """safetensors creates its file 0600 whatever the umask; the atomic writer gives it open()'s mode."""
    from common.weights import save_safetensors
    path = str(tmp_path / "model.safetensors")
    old = os.umask(umask)
    try:
        save_safetensors({"w": torch.zeros(2)}, path)
        common_io.write_json({"a": 1}, str(tmp_path / "a.json"))
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o666 & ~umask
    assert os.stat(tmp_path / "a.json").st_mode & 0o777 == 0o666 & ~umask
