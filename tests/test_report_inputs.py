"""The comparison checks every evaluation it reads (comparison/run_results.py): one run's eval.json or
per-example records damaged, or another run's copied in, is one line in --report-only (which evaluates
nothing), names the file and the eval.py command that redoes it, and touches nothing; the rerun
evaluates exactly that run again and leaves every other run's files byte-identical.

The comparison is the tiny one's runs (tests/test_compare.py) laid out by a fake train.py / eval.py
(no training), softmax and sparsemax at seeds 0 and 1, built once and copied per case; its paths are
relative, so the copy is the same comparison (a runs folder moved whole)."""
import json
import os
import random
import shutil

import pytest

import compare_heads  # scripts/ is on sys.path (tests/conftest.py)
from common import rundir
from common.cli import run_cli
from common.errors import UserError
from comparison import run_results
from comparison.paths import EVAL_SCRIPT
from comparison.report import document, plots
from evaluation.examples import load_examples, save_examples
from evaluation_copy import copy_evaluation
from test_compare import TINY_CONFIG, fake_steps, tiny_comparison

HEADS = ("softmax", "sparsemax")
ARGS = ["--config", "tiny.yaml", "--heads", *HEADS, "--seeds", "0", "1", "--runs-dir", "runs", "--report-dir", "report",
        "--no-mlflow", "--ood-dataset", "none"]
VICTIM = os.path.join("runs", "sparsemax-s0")  # the run each case damages
EVAL = os.path.join(VICTIM, rundir.EVAL_RESULT)
EXAMPLES = rundir.examples_path(EVAL)


def _fake_call(calls, source_runs):
    """train.py copies the tiny run's files; eval.py writes the tiny run's evaluation as this run's."""
    def call(cmd, **_):
        script, args = os.path.basename(cmd[1]), tuple(cmd[2:])
        if script == "train.py":
            run_dir = next(a.split("=", 1)[1] for a in args if a.startswith("train.output_dir="))
            head = next(a.split("=", 1)[1] for a in args if a.startswith("head.name="))
            os.makedirs(run_dir, exist_ok=True)
            for name in (rundir.SUMMARY, rundir.METRICS, rundir.CONFIG):
                shutil.copy(os.path.join(source_runs, f"{head}-s0", name), run_dir)
        else:
            run_dir, out = args[args.index("--checkpoint") + 1], args[args.index("--output") + 1]
            head = os.path.basename(run_dir).rsplit("-s", 1)[0]
            copy_evaluation(os.path.join(source_runs, f"{head}-s0", rundir.EVAL_RESULT), out, run_dir)
        calls.append((script, os.path.normpath(run_dir)))
        return 0
    return call


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished comparison (runs and report), made once: read it, never change it."""
    root = tmp_path_factory.mktemp("finished")
    (root / "tiny.yaml").write_text(TINY_CONFIG)
    with pytest.MonkeyPatch.context() as mp:
        _quiet_plots(mp)
        fake_steps(mp, _fake_call([], os.path.join(tiny_comparison()[0], "runs")))
        mp.chdir(root)
        assert compare_heads.main(ARGS) == 0
    return root


def _quiet_plots(mp):
    for name in dir(plots):  # the inputs are under test, not the plots (test_compare.py's): most of a report's time
        if name.startswith("plot_"):
            mp.setattr(plots, name, lambda *args, **kwargs: None)


@pytest.fixture()
def comparison(finished, tmp_path, monkeypatch):
    """A copy of the finished comparison, the current directory; -> the fake steps' calls."""
    for name in ("tiny.yaml", "runs", "report"):
        (shutil.copytree if (finished / name).is_dir() else shutil.copy)(finished / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    _quiet_plots(monkeypatch)
    calls = []
    fake_steps(monkeypatch, _fake_call(calls, os.path.join(tiny_comparison()[0], "runs")))
    return calls


def _files(folder):
    out = {}
    for root, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.normpath(os.path.join(root, name))] = f.read()
    return out


# ---- the damage, one case each -----------------------------------------------------------------------
def _random_bytes():
    with open(EVAL, "wb") as f:
        f.write(b"\xff" + bytes(random.Random(0).randrange(256) for _ in range(300)))


def _cut_json():
    with open(EVAL, "rb") as f:
        text = f.read()
    with open(EVAL, "wb") as f:
        f.write(text[:len(text) // 2])


def _json_list():
    with open(EVAL, "w") as f:
        json.dump([1, 2, 3], f)


def _missing_key():
    with open(EVAL) as f:
        result = json.load(f)
    del result["top1"]
    with open(EVAL, "w") as f:
        json.dump(result, f)


def _foreign_run():
    """softmax seed 1's evaluation and records, copied in as they are (its head, its checkpoint)."""
    other = os.path.join("runs", "softmax-s1", rundir.EVAL_RESULT)
    shutil.copy(other, EVAL)
    shutil.copy(rundir.examples_path(other), EXAMPLES)


def _foreign_seed():
    """The same head's evaluation of seed 1: only its checkpoint tells it apart."""
    other = os.path.join("runs", "sparsemax-s1", rundir.EVAL_RESULT)
    shutil.copy(other, EVAL)
    shutil.copy(rundir.examples_path(other), EXAMPLES)


def _cut_examples():
    os.truncate(EXAMPLES, os.path.getsize(EXAMPLES) - 100)


def _short_examples():
    records, meta = load_examples(EXAMPLES)
    save_examples({k: v[:-1] for k, v in records.items()}, EXAMPLES, **{k: v for k, v in meta.items() if k != "n"})


def _ema_weights():
    with open(EVAL) as f:
        result = json.load(f)
    result["weights"] = "ema"
    with open(EVAL, "w") as f:
        json.dump(result, f)


CASES = {  # damage -> what the one line says after the file's path
    "random bytes": (_random_bytes, EVAL, "is not text (byte 0 is not UTF-8): not eval.py's JSON"),
    "cut JSON": (_cut_json, EVAL, "is not valid JSON, cut short or damaged ("),
    "a JSON list": (_json_list, EVAL, "is a list, not an object"),
    "a key missing": (_missing_key, EVAL, "lacks the key 'top1'"),
    "another run's": (_foreign_run, EVAL, "is the evaluation of "),
    "another seed's": (_foreign_seed, EVAL, "is the evaluation of "),
    "the EMA weights'": (_ema_weights, EVAL, "evaluates the ema weights; eval.json is the raw weights' evaluation"),
    "cut records": (_cut_examples, EXAMPLES, "is cut or damaged: not a whole safetensors file ("),
    "records of the wrong length": (_short_examples, EXAMPLES, "holds 100 'label' record(s), not one per example: "
                                                               "eval.json counts n = 101"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_damaged_evaluation_is_one_line_and_the_rerun_evaluates_that_run_again(case, comparison, capsys):
    damage, path, says = CASES[case]
    damage()
    before = _files(".")
    capsys.readouterr()

    # --report-only: one line naming the file, what is wrong and the command that redoes it; nothing touched
    with pytest.raises(SystemExit) as exit_info:
        run_cli(compare_heads.main, ARGS + ["--report-only"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: {path} {says}"), err[0]
    assert (f"; --report-only evaluates nothing: evaluate the run again with python {os.path.relpath(EVAL_SCRIPT)} "
            f"--checkpoint {VICTIM} --output {EVAL} --quiet, or rerun without --report-only (it does that)") in err[0]
    assert _files(".") == before
    # the other readers say the same of it: the SLURM task's check, the report's reader
    assert compare_heads.main(["--check-evaluated", VICTIM, rundir.EVAL_RESULT]) == 1
    with pytest.raises(UserError) as read_err:
        document.load_run(VICTIM, rundir.EVAL_RESULT)
    assert str(read_err.value).startswith(f"{path} {says}") and "\n" not in str(read_err.value)

    # the rerun evaluates that run again, nothing else; every other run's files stay byte-identical
    assert compare_heads.main(ARGS) == 0
    out = capsys.readouterr().out
    assert f"sparsemax seed 0: {path} {says}" in out and "; evaluating it again" in out
    assert comparison == [("eval.py", VICTIM)]
    others = {p: b for p, b in _files("runs").items() if not p.startswith(VICTIM + os.sep)}
    assert others == {p: b for p, b in before.items() if p.startswith("runs" + os.sep) and
                      not p.startswith(VICTIM + os.sep)}
    assert run_results.not_evaluated(VICTIM, rundir.EVAL_RESULT) is None
    assert "0 training run(s) and 1 evaluation(s)" in out


def test_a_copied_runs_folder_is_still_its_own_evaluation(comparison, capsys):
    """The copy's evaluations name the folder they were made in (another absolute path): a runs folder
    moved or copied whole is the same comparison, reported without evaluating anything."""
    with open(EVAL) as f:
        assert os.path.realpath(json.load(f)["checkpoint"]) != os.path.realpath(VICTIM)
    assert compare_heads.main(ARGS + ["--report-only"]) == 0
    assert "missing" not in capsys.readouterr().out and comparison == []
