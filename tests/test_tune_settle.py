"""compare_heads --tune --until-settled (comparison/tune_settle.py): each head tuned once on the tune split,
then seeds added in looks with the tuned settings, one design file. On a tiny feature folder
(tests/feature_folder.py) every trial and run trains in this process in a fraction of a second.

The kills are real SIGKILLs of a forked copy of this process (torch and the project already imported:
no Python start per kill), each at one point of the same comparison: during tuning (a trial's first
save), between looks (the second reading of the decisions) and in the middle of a look (a run's first
save). Each rerun redoes no finished trial or run, and the last one reaches the uninterrupted
comparison's verdicts, on the same tuned settings.
"""
import json
import os
import signal
import sys

import pytest
import yaml

import compare_heads  # scripts/ is on sys.path (tests/conftest.py)
from common import rundir
from common.errors import UserError
from comparison import settle
from feature_folder import write_feature_folder
from test_design_record import _folder
from test_train_helpers import reset_accelerate_state
from test_tune import CONFIG, _studies

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

HEADS = ("softmax", "sparsemax")
LOOKS = ("--looks", "2", "3")  # look 1 cannot stop (O'Brien–Fleming's first boundary is t > 54): two looks always


@pytest.fixture(scope="module")
def feats(tmp_path_factory):
    return write_feature_folder(str(tmp_path_factory.mktemp("feat") / "f"), classes=6, spread=0.35,
                                counts={"train": 160, "val": 60, "calib": 40})


@pytest.fixture
def sandbox(tmp_path, feats, monkeypatch):
    from comparison.report import plots

    monkeypatch.chdir(tmp_path)
    with open("cfg.yaml", "w") as f:
        yaml.safe_dump({**CONFIG, "optim": {**CONFIG["optim"], "epochs": 1}}, f)
    for name in dir(plots):  # the design and its resume are under test, not the plots (test_compare.py's)
        if name.startswith("plot_"):
            monkeypatch.setattr(plots, name, lambda *args, **kwargs: None)
    return tmp_path


def _args(feats, runs, *extra):
    return ["--config", "cfg.yaml", "--features", feats, "--runs-dir", runs, "--report-dir", f"{runs}-report",
            "--ood-dataset", "none", "--no-mlflow", "--heads", *HEADS, "--tune", "--trials", "2", "--pruner", "none",
            "--until-settled", *LOOKS, *extra]


def _compare(argv):
    reset_accelerate_state()
    return compare_heads.main(argv)


def _killed(argv, where, log):
    """compare_heads `argv` in a forked copy of this process that SIGKILLs itself `where`: ("save", folder
    part) at the first checkpoint save begun in a run folder naming it, ("look", n) at the n-th reading
    of the looks' decisions. Its output goes to `log`."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            sys.stdout = sys.stderr = os.fdopen(1, "w", buffering=1)
            _arm(*where)
            _compare(argv)
        finally:
            os._exit(99)  # not killed where asked
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (status, open(log).read()[-3000:])
    return open(log).read()


def _arm(kind, at):
    """Install the child's SIGKILL (see _killed)."""
    if kind == "save":
        from training.checkpoint import files

        begin = files.begin_save

        def begin_save(root, step):
            if at in root:
                os.kill(os.getpid(), signal.SIGKILL)
            return begin(root, step)

        files.begin_save = begin_save
    else:
        now, seen = settle.Looks.now, []

        def killing_now(self):
            seen.append(1)
            if len(seen) == at:
                os.kill(os.getpid(), signal.SIGKILL)
            return now(self)

        settle.Looks.now = killing_now


def _stamps(folder):
    """{file: mtime in ns} under `folder` but the locks (a killed process leaves its lock, taken over by the
    next): a finished trial or run rewritten would change them."""
    return {os.path.join(root, n): os.stat(os.path.join(root, n)).st_mtime_ns
            for root, _, names in os.walk(folder) for n in names if n != rundir.LOCK}


def _outcome(runs):
    """What the comparison decided: each head's design outcome and each study's chosen settings."""
    summary = json.load(open(f"{runs}-report/summary.json"))
    comparisons = [{k: c[k] for k in ("variant", "state", "verdict", "look", "seeds", "interval")}
                   for c in summary["sequential"]["comparisons"]]
    chosen = {name: study.best_trial.params for name, study in _studies(f"sqlite:///{runs}/tune/studies.db").items()}
    return comparisons, chosen, summary["plain_words"][0]


def test_tuned_then_settled_resumes_after_kills_and_reaches_the_uninterrupted_verdict(sandbox, feats, capsys):
    # the uninterrupted comparison
    assert _compare(_args(feats, "ref")) == 0
    out = capsys.readouterr().out
    assert "this process ran 4 trial(s)" in out
    assert "look at 2 seeds: 4 run(s)" in out and "look at 3 seeds: 2 run(s)" in out
    comparisons, chosen, bottom = _outcome("ref")
    assert [c["look"] for c in comparisons] == [2] and comparisons[0]["seeds"] == 3
    assert bottom.startswith("On this data, with each head's tuned settings, by the until-settled design on top-1, "
                             "sparsemax ")
    record = json.load(open(f"ref/tune/tuned/{settle.DESIGN_FILE}"))
    assert record["design"]["looks"] == [2, 3] and record["tuning"]["trials"] == 2
    assert sorted(record["tuning"]["studies"]) == sorted(HEADS)
    for head in HEADS:  # the looks' runs train the chosen settings; no untuned arm
        cfg = yaml.safe_load(open(f"ref/tune/tuned/{head}-s2/config.yaml"))
        assert {k: cfg[k.split(".")[0]][k.split(".")[1]] for k in chosen[f"cfg/{head}"]} == chosen[f"cfg/{head}"]
    assert not os.path.exists("ref/tune/untuned") and not os.path.exists("ref-report/untuned")
    report = open("ref-report/report.md").read()
    assert report.index("## Seeds until settled (sequential design)") < report.index("## Tuning")
    assert "- No untuned arm: the design's verdicts compare the tuned heads only." in report
    assert f"- {bottom}\n" in report and "Tuned against untuned verdicts" not in report

    # the same comparison killed during tuning (sparsemax's second trial), between looks, in the middle of look 2
    argv = _args(feats, "runs")
    log = _killed(argv, ("save", os.path.join("trials", "sparsemax", "trial-0001")), "kill1.log")
    assert "[tune cfg/sparsemax] trial 0 (1/2 complete)" in log
    finished = _stamps("runs/tune/trials/softmax") | _stamps("runs/tune/trials/sparsemax/trial-0000")
    log = _killed(argv, ("look", 2), "kill2.log")
    assert "trial 1: its process is gone; queued again" in log and "this process ran 1 trial(s)" in log
    assert "look at 2 seeds: 4 run(s)" in log and "look at 3 seeds" not in log
    trials = _studies()["cfg/sparsemax"].get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]  # the killed trial retried once
    assert trials[2].params == trials[1].params
    assert [t.state.name for t in _studies()["cfg/softmax"].get_trials()] == ["COMPLETE"] * 2
    finished |= _stamps("runs/tune/tuned")
    log = _killed(argv, ("save", "sparsemax-s2"), "kill3.log")
    assert "this process ran 0 trial(s)" in log and "[1/2] softmax seed 2: training" in log
    assert "look at 3 seeds: 2 run(s) to train and evaluate (softmax seed 2, sparsemax seed 2)" in log
    finished |= _stamps("runs/tune/tuned/softmax-s2")
    assert _compare(argv) == 0
    out = capsys.readouterr().out
    assert "this process ran 0 trial(s)" in out
    steps = [line.split("] ", 1)[1] for line in out.splitlines() if line.endswith((": training", ": evaluating"))]
    assert steps == ["sparsemax seed 2: training", "sparsemax seed 2: evaluating"]  # only the run killed in look 2
    assert {f: t for f, t in _stamps("runs").items() if f in finished} == finished  # nothing finished redone
    assert _outcome("runs")[:2] == (comparisons, chosen)  # the uninterrupted verdicts, the same tuned settings


def test_a_changed_design_after_a_look_is_refused_in_one_line(sandbox, feats, capsys):
    """Margin, looks, trials, pruner or a search space (an override pins optim.weight_decay): each refused
    before anything runs or is written, every file byte-identical; the same design goes on to its next look."""
    argv = _args(feats, "runs")
    assert _compare(argv + ["--max-seeds", "2"]) == 0  # look 1 taken, then this invocation stops
    before = _folder(".")
    for extra, change in ((["--margin", "top1=1"], "(margin 0.5 -> 1)"),
                          (["--looks", "2", "4"], "(looks 2 3 -> 2 4)"),
                          (["--trials", "3"], "(trials 2 -> 3)"),
                          (["--pruner", "median"], "(pruner none -> median)"),
                          (["optim.weight_decay=0.01"], "(overrides optim.weight_decay (unset) -> 0.01 (every "
                                                        "variant), space optim.weight_decay log [0.0001, 1] -> "
                                                        "(unset) (every variant))")):
        with pytest.raises(UserError) as err:
            compare_heads.main(argv + extra)
        line = str(err.value)
        assert "\n" not in line and "has taken its first look" in line and change in line, line
        assert "--looks 2 3 --trials 2 --pruner none" in line
        assert _folder(".") == before, extra
    assert compare_heads.main(argv + ["--dry-run"]) == 0
    assert "softmax seed 2: would train and evaluate runs/tune/tuned/softmax-s2" in capsys.readouterr().out
    assert compare_heads.parse_args(["--config", "cfg.yaml", "--tune", "--until-settled"]).until_settled  # no refusal


@pytest.mark.parametrize("settle", [True, False])
def test_unfinished_studies_dry_run_says_so_and_emit_slurm_is_refused_in_one_line(sandbox, feats, capsys, settle):
    """Before any trial (one helper serves --tune and --tune --until-settled): --dry-run says it would run
    the trials first and writes nothing; --emit-slurm, which needs the studies' best settings, is one line."""
    argv = _args(feats, "runs")
    if not settle:  # the same command without --until-settled and its looks
        at = argv.index("--until-settled")
        argv = argv[:at] + argv[at + 1 + len(LOOKS):]
    assert compare_heads.main(argv + ["--dry-run"]) == 0
    then = "the looks" if settle else "the verdict runs"
    assert f"would run the trials of softmax, sparsemax, then {then}" in capsys.readouterr().out
    before = _folder(".")
    with pytest.raises(UserError) as err:
        compare_heads.main(argv + ["--emit-slurm", "runs.sbatch"])
    line = str(err.value)
    mode = "--tune --until-settled" if settle else "--tune"
    assert "\n" not in line and line.startswith(f"--emit-slurm with {mode} writes ")
    assert "softmax, sparsemax have fewer than --trials 2 complete trials" in line
    assert _folder(".") == before and not os.path.exists("runs.sbatch")
