"""compare_heads --until-settled's design record, RUNS_DIR/sequential_design.json, as a guarded record
(comparison/design_record.py): one comparison at a time holds the runs folder (a second one, with
another margin, is refused while the first runs, and the design it recorded stays byte for byte); a
record of any damaged shape is one line naming the file and the fix; finished runs without a record
are refused. Every refusal leaves the runs folder byte-identical. The looks run on the fake steps of
tests/test_until_settled.py; the race on a real comparison paused at its first training step
(tests/hooked_train.py's gate)."""
import hashlib
import json
import os
import signal
import subprocess
import sys

import pytest

import compare_heads  # scripts/ is on sys.path (tests/conftest.py)
from common import rundir
from common.errors import UserError
from comparison import design_record, settle
from comparison.ledger import check_request
from test_compare import TINY_CONFIG
from test_train_helpers import ROOT, subprocess_env, wait_for_file
from test_until_settled import _args, sandbox  # noqa: F401  (sandbox: the fixture, used by name)

SCRIPT = os.path.join(ROOT, "scripts", "compare_heads.py")
HOOKED = os.path.join(ROOT, "tests", "hooked_train.py")
LOOK_1 = ("--looks", "3", "5", "--max-seeds", "3")  # the first look's 9 runs, then this invocation stops


def _folder(path):
    """{relative path: sha256} of every file under `path`: what 'nothing was touched' compares."""
    out = {}
    for root, _, names in os.walk(path):
        for name in names:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _refused(argv):
    """The one line compare_heads refuses `argv` with, having touched nothing in argv's runs folder."""
    runs = argv[argv.index("--runs-dir") + 1]
    before = _folder(runs)
    with pytest.raises(UserError) as err:
        compare_heads.main(argv)
    assert "\n" not in str(err.value), str(err.value)
    assert _folder(runs) == before
    return str(err.value)


def _damage(text):
    """{case: the record's new bytes, given its good text}: every shape a record may be found in."""
    record = json.loads(text)
    edited = json.loads(text)
    edited["design"]["looks"] = [3, 6]  # its fingerprint no longer matches
    margin = json.loads(text)
    margin["margin"] = 2.0  # the words' margin, not the design's
    return {"random bytes": os.urandom(64) + b"\xff\xfe",
            "cut JSON": text[:len(text) // 2].encode(),
            "a JSON list": json.dumps([record]).encode(),
            "nested 100,000 deep": b"[" * 100_000 + b"]" * 100_000,  # json's parser: RecursionError
            "nested 900 deep": b'{"design": ' + b"[" * 900 + b"]" * 900 + b"}",  # parsed; too deep for what follows
            "Infinity in its looks": text.replace('"looks": [\n   3,\n   5\n  ]', '"looks": [3, Infinity]').encode(),
            "edited looks": json.dumps(edited).encode(),
            "edited margin": json.dumps(margin).encode(),
            "empty": b""}


def test_a_damaged_record_is_one_line_naming_the_file_and_the_fix(sandbox):  # noqa: F811
    root, calls = sandbox
    assert compare_heads.main(_args(root, *LOOK_1)) == 0
    assert not os.path.exists(os.path.join(root, "runs", rundir.LOCK))  # released at the end
    path = os.path.join(root, "runs", settle.DESIGN_FILE)
    good = open(path).read()
    assert '"looks": [\n   3,\n   5\n  ]' in good  # what the Infinity case edits
    calls.clear()
    for case, content in _damage(good).items():
        with open(path, "wb") as f:
            f.write(content)
        for mode in ((), ("--dry-run",), ("--report-only",)):
            line = _refused(_args(root, "--looks", "3", "5", *mode))
            assert line.startswith(f"{path} is damaged: ") and "restore the file from a copy" in line, (case, line)
    assert calls == []  # nothing ran
    # before any finished run the design may be chosen anew: the fix says so
    fresh = os.path.join(root, "fresh")
    os.makedirs(fresh)
    with open(os.path.join(fresh, settle.DESIGN_FILE), "wb") as f:
        f.write(b"[" * 100_000)
    line = _refused(_args(root, "--runs-dir", fresh, "--report-dir", os.path.join(fresh, "report")))
    assert "no pair has finished runs yet: delete the file and rerun" in line, line


def test_finished_runs_without_their_record_are_refused(sandbox):  # noqa: F811
    """The record cannot be rebuilt from the runs (they record their settings, not the margin or the looks),
    and a design chosen after their results would not bound its error rates: refused, in every mode."""
    root, calls = sandbox
    assert compare_heads.main(_args(root, *LOOK_1)) == 0
    os.remove(os.path.join(root, "runs", settle.DESIGN_FILE))
    calls.clear()
    for extra in (("--margin", "top1=2"), ("--dry-run",), ("--report-only",)):
        line = _refused(_args(root, "--looks", "3", "5", *extra))
        assert "holds finished runs" in line and f"but no {settle.DESIGN_FILE}" in line and "restore" in line, line
    assert calls == []


def test_a_damaged_request_record_is_one_line(tmp_path):
    """A run's own record of what the comparison asked for (comparison/ledger.py), damaged: one line, untouched."""
    run = tmp_path / "softmax-s0"
    run.mkdir()
    path = run / rundir.COMPARE_REQUEST
    for content in (b"[" * 100_000, b'{"overrides": ' + b"[" * 900 + b"]" * 900 + b"}", b"\xff\xfe{}", b'{"overrides"',
                    b"[]", b'{"overrides": [], "resolved": {"optim": {"lr": NaN}}}'):
        path.write_bytes(content)
        with pytest.raises(UserError) as err:
            check_request(str(run), {"config": "c.yaml", "overrides": [], "resolved": {}}, create=False)
        assert str(err.value).startswith(f"{path} is damaged: ") and "\n" not in str(err.value), str(err.value)
        assert "move that run away to train it again, or use another --runs-dir" in str(err.value)
        assert path.read_bytes() == content


# ---- the race: a second comparison while the first runs -----------------------------------------------
def _comparison(tmp_path, *extra):
    """A real --until-settled comparison of two heads (tiny config, one epoch, looks at 2 and 3 seeds)."""
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    return ["--config", str(config), "--heads", "softmax", "sparsemax", "--ood-dataset", "none", "--no-mlflow",
            "--runs-dir", str(tmp_path / "runs"), "--report-dir", str(tmp_path / "report"), "--until-settled",
            "--looks", "2", "3", *extra, "optim.epochs=1", "data.builtin_val_size=40"]


def test_a_second_comparison_cannot_replace_the_design_of_a_live_one(tmp_path, capsys):
    """The issue's race: a comparison at margin 0.5 paused in its first training; another at margin 2 on
    the same runs folder is refused in one line naming the first (its --dry-run too), nothing in the folder
    changes; once the first has stopped, the second may replace the design (no look was taken)."""
    gate = str(tmp_path / "gate")
    runs = str(tmp_path / "runs")
    first = subprocess.Popen([sys.executable, SCRIPT, *_comparison(tmp_path, "--launcher",
                                                                   f"{sys.executable} {HOOKED} --pause-before-start "
                                                                   f"--gate {gate}")],
                             cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for_file(gate + ".waiting", first), first.communicate()[1][-3000:]
        design = open(os.path.join(runs, settle.DESIGN_FILE), "rb").read()
        assert json.loads(design)["margin"] == 0.5
        line = _refused(_comparison(tmp_path, "--margin", "top1=2"))
        assert line.startswith(f"{runs} is in use by another comparison (pid {first.pid} ") and \
            design_record.LOCK_PURPOSE in line and "use another --runs-dir" in line, line
        line = _refused(_comparison(tmp_path, "--margin", "top1=2", "--dry-run"))
        assert "took no look yet, but this command asks for another (margin 0.5 -> 2) while" in line, line
        assert f"(pid {first.pid} " in line
        assert compare_heads.main(_comparison(tmp_path, "--dry-run")) == 0  # the same design: read freely
        assert open(os.path.join(runs, settle.DESIGN_FILE), "rb").read() == design
        os.kill(first.pid, signal.SIGTERM)  # forwarded to its training, which saves and stops
    finally:
        open(gate, "w").close()
        if first.poll() is None:
            try:
                first.wait(timeout=240)
            except subprocess.TimeoutExpired:
                first.kill()
    assert first.returncode == 128 + signal.SIGTERM, first.stderr.read()[-3000:]
    assert not os.path.exists(os.path.join(runs, rundir.LOCK))  # released on its way out
    capsys.readouterr()
    assert compare_heads.main(_comparison(tmp_path, "--margin", "top1=2", "--dry-run")) == 0
    assert "took no look yet: would be replaced (margin 0.5 -> 2)" in capsys.readouterr().out
