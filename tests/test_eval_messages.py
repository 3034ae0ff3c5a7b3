"""eval.py says what it wrote (a line per file, or that the metrics were not kept) and how far its
long steps are, in a log too (inference/step_progress.py: plain lines where stdout is no terminal)."""
import io
import os
import re
import shutil

import pytest
import torch
from tqdm import tqdm

from common import rundir
from evaluation.metrics import RECORD_FIELDS
from inference import eval_command, step_progress
from test_compare import tiny_run_dir
from test_train_helpers import reset_accelerate_state

pytestmark = pytest.mark.usefixtures("one_thread")


def _files(*folders):
    """{path: (inode, mtime, size)} of every file under the folders (an atomic rewrite is a new inode)."""
    found = {}
    for folder in folders:
        for where, _, names in os.walk(folder):
            for name in names:
                st = os.stat(os.path.join(where, name))
                found[os.path.join(where, name)] = (st.st_ino, st.st_mtime_ns, st.st_size)
    return found


def _eval(argv, capsys):
    import eval as eval_entry

    reset_accelerate_state()
    assert eval_entry.main(argv) == 0
    return capsys.readouterr().out.splitlines()


def _named(lines):
    return {line.split(" ")[1] for line in lines if line.startswith("wrote ")}


def test_eval_names_each_file_it_writes_and_only_those(tmp_path, capsys, monkeypatch):
    """Without --output: the run's conformal thresholds and OOD memory are named, and the metrics said
    not kept; with --output (the memory reused, no calibration): the three outputs and nothing else.
    Captured stdout is no terminal, as a log: the memory build's progress shows as plain lines."""
    run = str(tmp_path / "run")
    shutil.copytree(tiny_run_dir("softmax"), run, ignore=shutil.ignore_patterns("checkpoints"))
    for name in ("conformal.json", "ood_memory.safetensors"):
        os.remove(os.path.join(run, name))
    monkeypatch.setattr(step_progress, "MIN_GAP_S", 0.0)  # a line at each 10% mark, however fast
    argv = ["--checkpoint", run, "--ood-dataset", "auto", "--ood-memory", "20", "--batch-size", "8", "--quiet"]

    before = _files(run)
    lines = _eval(argv, capsys)
    changed = {path for path, st in _files(run).items() if before.get(path) != st}
    assert changed == {os.path.join(run, "conformal.json"), os.path.join(run, "ood_memory.safetensors")}
    assert _named(lines) == changed
    assert eval_command.NO_METRICS_FILE in lines
    memory = [line for line in lines if line.startswith("building the OOD feature memory (20 training images): ")]
    assert len(memory) == 3  # 20 images in batches of 8: a line at 1 and 2 of 3, then done
    for line, expected in zip(memory, (r"33% \(1 of 3 batches in \d\d:\d\d; about \d\d:\d\d left\)",
                                       r"66% \(2 of 3 batches in \d\d:\d\d; about \d\d:\d\d left\)",
                                       r"done, 3 batches in \d\d:\d\d")):
        assert re.fullmatch(r"building the OOD feature memory \(20 training images\): " + expected, line), line
    assert any(line.startswith("evaluating the val split (101 images): ") for line in lines)

    out = tmp_path / "out" / "e.json"
    before = _files(run, tmp_path / "out")
    lines = _eval(argv + ["--calib", "none", "--output", str(out)], capsys)
    changed = {path for path, st in _files(run, tmp_path / "out").items() if before.get(path) != st}
    outputs = {str(out), rundir.eval_csv_path(str(out)), rundir.examples_path(str(out))}
    assert changed == outputs and _named(lines) == outputs
    assert eval_command.NO_METRICS_FILE not in lines
    assert not any(line.startswith("building the OOD feature memory") for line in lines)  # stored: reused


def test_write_outputs_names_the_maps_it_removes(tmp_path):
    """An earlier hopfield result's pooling maps at the output, replaced by one that has none: removed, and said."""
    output = str(tmp_path / "eval.json")
    maps = rundir.pool_maps_path(output)
    open(maps, "w").close()
    records = {k: torch.zeros(3, dtype=torch.bool if k == "top5_hit" else torch.int64) for k in RECORD_FIELDS}
    result = {"head": "softmax", "split": "val", "dataset": "builtin10", "weights": "raw", "checkpoint": "x", "n": 3}
    lines = eval_command.write_outputs(result, records, output)
    assert not os.path.exists(maps)
    assert [line.split(" ")[:2] for line in lines] == [["wrote", output], ["wrote", rundir.eval_csv_path(output)],
                                                       ["wrote", rundir.examples_path(output)], ["removed", maps]]


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _steps(capsys, total, seconds_per_batch):
    clock = _Clock()
    lines = step_progress.LogLines(total, "step", clock=clock)
    for _ in range(total):
        clock.now += seconds_per_batch
        lines.update(1)
    lines.close()
    return capsys.readouterr().out.splitlines()


def test_log_lines_come_at_a_modest_rate(capsys):
    # 50 s: a line at each 20% (10% marks, 10 s apart), the last batch left to the closing line
    assert _steps(capsys, 100, 0.5) == [
        "step: 20% (20 of 100 batches in 00:10; about 00:40 left)",
        "step: 40% (40 of 100 batches in 00:20; about 00:30 left)",
        "step: 60% (60 of 100 batches in 00:30; about 00:20 left)",
        "step: 80% (80 of 100 batches in 00:40; about 00:10 left)", "step: done, 100 batches in 00:50"]
    assert _steps(capsys, 100, 0.05) == []  # 5 s: nothing
    # 1000 s: each 10% mark, and a line at least every minute between them
    lines = _steps(capsys, 1000, 1.0)
    done = [int(line.split("(")[1].split(" ")[0]) for line in lines[:-1]]  # 1 s per batch: batches = seconds
    gaps = [b - a for a, b in zip([0] + done, done)]
    assert max(gaps) <= 60 and min(gaps) >= 10 and all(mark in done for mark in range(100, 1000, 100))
    assert lines[-1] == "step: done, 1000 batches in 16:40"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_the_bar_a_log_the_lines_another_rank_nothing(monkeypatch):
    for stream, enabled, kind in ((io.StringIO(), True, step_progress.LogLines), (_Terminal(), True, tqdm),
                                  (_Terminal(), False, tqdm), (io.StringIO(), False, tqdm)):
        monkeypatch.setattr("sys.stdout", stream)
        progress = step_progress.step_progress(3, "step", enabled=enabled)
        assert type(progress) is kind or (kind is tqdm and isinstance(progress, tqdm))
        progress.update(3)
        progress.close()
        bar = "step: 100%" in stream.getvalue() and "3/3" in stream.getvalue()
        assert bar == (enabled and stream.isatty()), (stream, enabled)
        assert enabled or stream.getvalue() == ""
