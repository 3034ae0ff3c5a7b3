"""Outputs of the entry points and scripts: a bad destination is one line and exit 74 before the
work (common.io.prepare_output), and the temporary files of a killed writer are removed by the
next writer in that folder, only when their pid is gone (common.runlock.writing_into).

The destinations are real filesystem failures: a path through a file (ENOTDIR, any user) and a
read-only tmpfs (root only, skipped elsewhere). The checkpoints given are bogus where the output is
checked first: an exit 74 instead of 2 shows the output was refused before the checkpoint was read."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from common import io as common_io
from common.cli import run_cli
from test_export import make_run
from test_run_files import tmpfs  # noqa: F401  (the read-only filesystem fixture)
from test_train_helpers import ROOT, reset_accelerate_state

sys.path.insert(0, os.path.join(ROOT, "scripts"))
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

TINY_DATA = ["data.builtin_train_size=32", "data.builtin_val_size=16", "data.eval_batch_size=16"]


def _entry(name):
    import importlib

    return importlib.import_module(name).main


def _cases(blocked, run, cfg):
    """(entry point, argv) writing below `blocked`, a path that cannot be written."""
    return {
        "predict": ("predict", ["--checkpoint", "nowhere", "--images", "nowhere", "--output", f"{blocked}/p.csv"]),
        "eval": ("eval", ["--checkpoint", "nowhere", "--output", f"{blocked}/e.json"]),
        "export": ("export", [str(run), "--format", "torchscript", "--output", f"{blocked}/m.pt"]),
        "extract_features": ("extract_features", ["--checkpoint", "nowhere", "--output", f"{blocked}/f"]),
        "compare_heads report": ("compare_heads", ["--config", cfg, "--heads", "softmax", "--report-dir",
                                                   f"{blocked}/r", "--runs-dir", os.path.join(os.path.dirname(cfg),
                                                                                               "runs")]),
        "bench_gpu": ("bench_gpu", ["--device", "cpu", "--quick", "--out", f"{blocked}/b"]),
        "bench_feature_sweep": ("bench_feature_sweep", ["--quick", "--work", f"{blocked}/w"]),
    }


def _exit_and_error(entry, argv, capsys):
    reset_accelerate_state()
    with pytest.raises(SystemExit) as exit_info:
        run_cli(_entry(entry), argv)
    err = capsys.readouterr().err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert "Traceback" not in err and len(errors) == 1, err
    return exit_info.value.code, errors[0]


@pytest.mark.parametrize("what", ["predict", "eval", "export", "extract_features", "compare_heads report",
                                  "bench_gpu", "bench_feature_sweep"])
def test_an_output_through_a_file_is_one_line_and_exit_74_before_the_work(tmp_path, capsys, what):
    blocked = tmp_path / "a_file"
    blocked.write_text("not a folder")
    run, _ = make_run(tmp_path)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: {name: resmlp_tiny}\ndata: {image_size: 16, builtin_train_size: 32}\n")
    entry, argv = _cases(blocked, run, str(cfg))[what]
    before = sorted(os.listdir(tmp_path))
    code, line = _exit_and_error(entry, argv, capsys)
    assert code == common_io.EXIT_WRITE_FAILED == 74, line
    assert f"{blocked}/" in line and "Not a directory" in line and "a part of the path is a file" in line
    assert sorted(os.listdir(tmp_path)) == before and not os.path.exists(run / "run.lock")  # nothing trained or written


@pytest.mark.parametrize("what", ["predict", "export"])
def test_a_new_folder_on_a_read_only_filesystem_is_one_line_and_exit_74(tmp_path, tmpfs, capsys, what):  # noqa: F811
    from test_run_files import _remount_read_only

    ro = tmpfs(tmp_path / "ro")
    _remount_read_only(ro)
    run, _ = make_run(tmp_path)
    code, line = _exit_and_error(*_cases(f"{ro}/sub", run, "unused")[what], capsys)
    assert code == 74 and f"{ro}/sub/" in line and "Read-only file system" in line and "read-only: choose" in line
    assert os.listdir(ro) == []


# ----------------------------------------------------------------------------- killed writers
KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    sys.path.insert(0, {root!r})
    from common import io as common_io

    class KilledMidWrite:  # the writer is killed half-way through its temporary file
        def __init__(self, path):
            self.file = open(path, "wb")

        def write(self, data):
            self.file.write(bytes(data)[: len(data) // 2])
            self.file.flush()
            os.kill(os.getpid(), signal.SIGKILL)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

    common_io._open_for_write = KilledMidWrite
    common_io.atomic_write_bytes({path!r}, b"x" * 1000)
""")


def _killed_writer(path):
    """Run a writer of `path` killed by SIGKILL mid-write (a real process); -> the temporary file it left."""
    done = subprocess.run([sys.executable, "-c", KILLED_WRITER.format(root=ROOT, path=str(path))], timeout=60)
    assert done.returncode == -signal.SIGKILL
    left = [n for n in os.listdir(os.path.dirname(path)) if n.startswith(os.path.basename(path) + ".tmp")]
    assert len(left) == 1
    return os.path.join(os.path.dirname(path), left[0])


def test_the_next_extraction_and_export_remove_a_killed_writers_temp_files_but_not_a_live_ones(tmp_path):
    import export
    import extract_features

    run, _ = make_run(tmp_path)
    features, exports = tmp_path / "features", tmp_path / "exports"
    shard = features / "train" / "shard_00000.safetensors"
    output = exports / "m.torchscript.pt"
    for folder in (shard.parent, exports):
        folder.mkdir(parents=True)
    dead = [_killed_writer(shard), _killed_writer(features / "features.json"), _killed_writer(output)]
    dead.append(f"{shard.parent / 'shard_00002.safetensors'}.tmp{os.getpid()}")  # a predecessor with this pid
    open(dead[-1], "wb").write(b"old")  # (a restarted container reuses pids)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:  # a writer that is still running (not under the folder's lock): its temporary files are kept
        kept = [f"{shard.parent / 'shard_00001.safetensors'}.tmp{live.pid}", f"{output}.json.tmp{live.pid}"]
        for path in kept:
            open(path, "wb").write(b"live")
        reset_accelerate_state()
        assert extract_features.main(["--checkpoint", str(run), "--output", str(features), "--splits", "train",
                                      "--shard-size", "64", *TINY_DATA]) == 0
        export.main([str(run), "--format", "torchscript", "--output", str(output)])
        assert not any(os.path.exists(p) for p in dead)
        assert all(open(p, "rb").read() == b"live" for p in kept)
        assert torch.jit.load(str(output)) is not None and shard.is_file()
    finally:
        live.kill()
        live.wait()
