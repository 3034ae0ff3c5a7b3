"""compare_heads --until-settled (comparison/settle.py, comparison/modes.py): seeds added in looks until
each head's question against the reference is settled, the design fixed in the runs folder.

train.py / eval.py are replaced by a fake that copies the tiny comparison's run files (tests/
test_compare.py) and writes synthetic per-example records: softmax and entmax15 get a seed-dependent
number of correct examples, sparsemax 30 fewer than softmax (31 at every third seed: a difference with
a spread of one example, inferior at the first look), so the looks run end to end in a second.
"""
import json
import os
import shutil

import numpy as np
import pytest
import torch

import compare_heads  # scripts/ is on sys.path (tests/conftest.py)
from common import rundir
from common.errors import UserError
from comparison import settle
from comparison.analysis.equivalence import VERDICTS
from comparison.analysis.sequential import Decision, Design, Interval, sequential_decision, walk
from evaluation_copy import copy_evaluation
from test_compare import TINY_CONFIG, fake_steps, time_runs, tiny_comparison

HEADS = ("softmax", "sparsemax", "entmax15")
N = 101  # the tiny comparison's validation set


def _correct(head, seed):
    """How many of the N examples the fake run of `head` at `seed` gets right."""
    noise = int(np.random.default_rng([seed, HEADS.index(head)]).integers(0, 6))
    if head == "sparsemax":
        return 60 - 30 - (seed % 3 == 2) + int(np.random.default_rng([seed, 0]).integers(0, 6))  # softmax's − 30
    return 60 + noise


def _fake_call(calls, source_runs):
    def call(cmd, stdout=None, stderr=None, env=None, **_):
        script, args = os.path.basename(cmd[1]), tuple(cmd[2:])
        if script == "train.py":
            run_dir = next(a.split("=", 1)[1] for a in args if a.startswith("train.output_dir="))
            os.makedirs(run_dir, exist_ok=True)
            for name in ("summary.json", "metrics.jsonl", rundir.CONFIG):
                shutil.copy(os.path.join(source_runs, "softmax-s0", name), run_dir)
        else:
            run_dir, out = args[args.index("--checkpoint") + 1], args[args.index("--output") + 1]
            head, seed = os.path.basename(run_dir).rsplit("-s", 1)
            label = torch.arange(N) % 10
            right = torch.arange(N) < _correct(head, int(seed))
            records = {"label": label, "pred": torch.where(right, label, (label + 1) % 10),
                       "support_size": torch.full((N,), 10), "loss": torch.ones(N), "max_prob": torch.full((N,), 0.5),
                       "p_y": torch.full((N,), 0.1), "top5_hit": torch.ones(N, dtype=torch.bool)}
            copy_evaluation(os.path.join(source_runs, "softmax-s0", "eval.json"), out, run_dir, head, records)
        calls.append((script, os.path.basename(run_dir)))
        return 0
    return call


@pytest.fixture()
def sandbox(tmp_path, monkeypatch):
    from comparison.report import plots

    source, _ = tiny_comparison()
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    calls = []
    fake_steps(monkeypatch, _fake_call(calls, os.path.join(source, "runs")))
    for name in dir(plots):  # the looks are under test, not the plots (test_compare.py's): most of a report's time
        if name.startswith("plot_"):
            monkeypatch.setattr(plots, name, lambda *args, **kwargs: None)
    return str(tmp_path), calls


def _args(root, *extra):
    return ["--config", os.path.join(root, "tiny.yaml"), "--heads", *HEADS, "--runs-dir", os.path.join(root, "runs"),
            "--report-dir", os.path.join(root, "report"), "--no-mlflow", "--until-settled", *extra]


def _trained(calls):
    return sorted(run for script, run in calls if script == "train.py")


def _one_line(err):
    assert "\n" not in str(err.value), str(err.value)


# ---- the planner ------------------------------------------------------------------------------------
def _decision(stop, verdict, look, n):
    return Decision(stop, verdict, Interval(-0.01, 0.01, 0.9, look, n))


def test_a_settled_head_gets_no_new_seeds_and_the_others_the_next_look():
    design = Design(margin=0.005, looks=(3, 5, 8), mc_paths=4000)
    pairs = [("sparsemax", "softmax"), ("entmax15", "softmax")]
    decisions = {"sparsemax": _decision(True, "inferior", 1, 3), "entmax15": _decision(False, "undecided", 1, 3)}
    wanted = settle.targets(pairs, decisions, {"sparsemax": 3, "entmax15": 3}, design, cap=8)
    assert wanted == {"sparsemax": 3, "entmax15": 5, "softmax": 5}
    # the last look --max-seeds allows: no more seeds for anyone, the reference at its heads' most
    assert settle.targets(pairs, decisions, {"sparsemax": 3, "entmax15": 3}, design, cap=3) \
        == {"sparsemax": 3, "entmax15": 3, "softmax": 3}
    # before the first look: every head gets the first look's seeds
    none = _decision(False, "undecided", 0, 1)
    assert settle.targets(pairs, {"sparsemax": none, "entmax15": none}, {"sparsemax": 1, "entmax15": 1}, design,
                          cap=8) == {"sparsemax": 3, "entmax15": 3, "softmax": 3}
    plan = [(name, seed, f"{name}-s{seed}", []) for name in ("softmax", "sparsemax", "entmax15") for seed in range(8)]
    kept = [e[2] for e in settle.look_plan(plan, wanted) if e[0] == "sparsemax"]
    assert kept == [f"sparsemax-s{s}" for s in range(3)]


def test_the_default_schedule_ends_at_max_seeds():
    assert settle.default_looks(12) == (3, 5, 8, 12)
    assert settle.default_looks(20) == (3, 5, 8, 12, 20)  # 18 dropped: too close to 20 to matter
    assert settle.default_looks(30) == (3, 5, 8, 12, 18, 30)
    assert settle.default_looks(3) == (3,) and settle.default_looks(2) == (2,)


def test_flags_that_cannot_combine_are_one_line(tmp_path):
    base = ["--config", "x.yaml"]
    for extra, match in ((["--max-seeds", "5"], "applies to --until-settled"),
                         (["--until-settled", "--seeds", "0", "1"], "drop --seeds"),
                         (["--until-settled", "--max-seeds", "1"], "at least 2"),
                         (["--until-settled", "--looks", "3", "5", "--max-seeds", "8"], "past the last of --looks")):
        with pytest.raises(UserError, match=match) as err:
            compare_heads.parse_args(base + extra)
        _one_line(err)


# ---- end to end -------------------------------------------------------------------------------------
def test_looks_resume_after_a_kill_and_a_settled_head_stops(sandbox, capsys):
    """Look 1 only (--max-seeds 3, as a kill after it would leave the runs folder), then the full
    schedule: only the missing seeds train, sparsemax (inferior at look 1) none, and the report says
    at which look each head stopped and why."""
    root, calls = sandbox
    assert compare_heads.main(_args(root, "--looks", "3", "5", "8", "--max-seeds", "3")) == 0
    assert _trained(calls) == sorted(f"{h}-s{s}" for h in HEADS for s in range(3))
    out = capsys.readouterr().out
    assert "sparsemax vs softmax: settled at look 1 of 3 (3 seeds), inferior" in out
    assert "entmax15 vs softmax: not settled at look 1 of 3 (3 seeds, the last look --max-seeds 3 allows)" in out
    design = json.load(open(os.path.join(root, "runs", settle.DESIGN_FILE)))
    assert design["design"]["looks"] == [3, 5, 8] and design["metric"] == "top1"

    calls.clear()
    assert compare_heads.main(_args(root, "--looks", "3", "5", "8")) == 0
    out = capsys.readouterr().out
    trained = _trained(calls)
    assert not [r for r in trained if r.startswith("sparsemax")]  # settled: no new seed
    assert not [r for r in trained if int(r.rsplit("-s", 1)[1]) < 3]  # look 1's runs reused, none retrained
    extra = sorted(r for r in trained if r.startswith("entmax15"))
    assert extra and sorted(r for r in trained if r.startswith("softmax")) == [e.replace("entmax15", "softmax")
                                                                               for e in extra]
    summary = json.load(open(os.path.join(root, "report", "summary.json")))["sequential"]
    by_head = {c["variant"]: c for c in summary["comparisons"]}
    assert (by_head["sparsemax"]["look"], by_head["sparsemax"]["seeds"], by_head["sparsemax"]["verdict"]) \
        == (1, 3, "inferior")
    assert by_head["entmax15"]["stopped"] and by_head["entmax15"]["seeds"] == 3 + len(extra)
    assert summary["design"]["fingerprint"] == design["design"]["fingerprint"]
    md = open(os.path.join(root, "report", "report.md")).read()
    assert "## Seeds until settled (sequential design)" in md and by_head["sparsemax"]["reason"] in md
    assert md.index("## Seeds until settled") < md.index("## Equivalence and non-inferiority")
    assert "sparsemax vs softmax: settled at look 1 of 3" in out
    bottom = json.load(open(os.path.join(root, "report", "summary.json")))["plain_words"][0]  # the design's verdicts
    assert bottom.startswith("On this data, by the until-settled design on top-1, sparsemax is less accurate than "
                             "softmax (settled at 3 seeds)") and f"- {bottom}\n" in md and f"- {bottom}\n" in out

    assert compare_heads.main(_args(root, "--looks", "3", "5", "8", "--dry-run")) == 0  # nothing left to run
    out = capsys.readouterr().out
    assert out.startswith("cost (--until-settled): nothing left to run") and "would train" not in out


def test_a_changed_design_is_refused_after_its_first_look(sandbox):
    root, calls = sandbox
    assert compare_heads.main(_args(root, "--looks", "3", "5", "--max-seeds", "3")) == 0
    calls.clear()
    for extra, match in ((["--looks", "3", "5", "8"], r"\(looks 3 5 -> 3 5 8\): the O'Brien–Fleming boundaries"),
                         (["--max-seeds", "8"], r"\(looks 3 5 -> 3 5 8\)"),
                         (["--looks", "3", "5", "--margin", "top1=2"], r"\(margin 0.5 -> 2\): a design chosen after"),
                         (["--looks", "3", "5", "--settle-metric", "ece"], r"\(metric top1 -> ece")):
        with pytest.raises(UserError, match=match) as err:
            compare_heads.main(_args(root, *extra))
        _one_line(err)
        assert "has taken its first look" in str(err.value) and "--looks 3 5" in str(err.value)
    assert calls == []  # refused before anything ran
    assert compare_heads.main(_args(root, "--max-seeds", "3", "--dry-run")) == 0  # a cap on the same design: fine


def test_the_dry_run_says_the_expected_and_the_most_runs(sandbox, capsys):
    root, calls = sandbox
    assert compare_heads.main(_args(root, "--looks", "3", "5", "8", "--dry-run")) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("cost (--until-settled, looks 3 5 8): up to 24 run(s)") and "no finished run" in first
    assert not os.path.exists(os.path.join(root, "runs", settle.DESIGN_FILE))  # --dry-run records nothing
    assert compare_heads.main(_args(root, "--looks", "3", "5", "8", "--max-seeds", "3")) == 0
    time_runs(os.path.join(root, "runs"), 8.0, 2.0, threads=1)  # every run measured at 10 s
    capsys.readouterr()
    assert compare_heads.main(_args(root, "--looks", "3", "5", "8", "--dry-run", "--jobs", "2")) == 0
    lines = capsys.readouterr().out.splitlines()
    # sparsemax settled at 3: at most entmax15 and softmax to 8 seeds (10 runs, 5 per look on 2 slots:
    # 2 + 3 run-lengths of 10 s); entmax15's expected seeds come from the plug-in simulation
    assert "run(s) expected, up to 10, 4 of them for the next look" in lines[0]
    assert "at most 50 s of wall time for the runs on 2 job slot(s)" in lines[0] and "CPU core-hours" in lines[0]
    assert "measured from 9 finished run(s)" in lines[0] and "timed by the comparison" in lines[0]
    assert "sparsemax 3.0 of 3" in lines[1] and "entmax15 " in lines[1]


def test_emit_slurm_writes_one_look_at_a_time(sandbox, monkeypatch, capsys):
    from test_compare import ROOT

    root, calls = sandbox
    monkeypatch.chdir(ROOT)  # --emit-slurm runs from the repository root
    script = os.path.join(root, "look.sbatch")
    assert compare_heads.main(_args(root, "--looks", "3", "5", "--emit-slurm", script)) == 0
    text = open(script).read()
    assert "#SBATCH --array=0-8\n" in text and "sparsemax-s2" in text and "-s3" not in text  # look 1: seeds 0-2
    assert "--emit-slurm" in text.split("When the tasks are done:")[1].splitlines()[1]  # rerun it: the next look
    assert calls == [] and "array tasks all at once" not in capsys.readouterr().out  # nothing measured yet


# ---- the estimators' edges (issue 45) ---------------------------------------------------------------
def test_heads_at_chance_with_identical_results_are_not_compared(sandbox, monkeypatch, capsys):
    """Every head right on the same 11 of 101 images at every seed (the best constant guess gets 11): before,
    the design stopped at look 1 with "equivalent, 90% repeated CI [0.0, 0.0]" while the report said nothing
    was learned. Now the pair stops there with no comparison, and every line of the report agrees."""
    root, calls = sandbox
    monkeypatch.setitem(globals(), "_correct", lambda head, seed: 11)
    assert compare_heads.main(_args(root, "--looks", "3", "5", "8")) == 0
    out = capsys.readouterr().out
    assert _trained(calls) == sorted(f"{h}-s{s}" for h in HEADS for s in range(3))  # no more seeds: look 1 only
    for head in ("sparsemax", "entmax15"):
        assert (f"{head} vs softmax: no comparison at look 1 of 3 (3 seeds): nothing learned ({head} and softmax "
                f"within noise of chance: top-1 {head} 10.9%, softmax 10.9% vs 10.9% for the best constant "
                f"guess)") in out
    summary = json.load(open(os.path.join(root, "report", "summary.json")))
    states = {c["variant"]: (c["state"], c["verdict"]) for c in summary["sequential"]["comparisons"]}
    assert states == {"sparsemax": ("nothing learned", "undecided"), "entmax15": ("nothing learned", "undecided")}
    assert "equivalent" not in json.dumps(summary["sequential"]["comparisons"])
    bottom = summary["plain_words"][0]
    assert "sparsemax is not compared with softmax (sparsemax and softmax learned nothing)" in bottom
    assert "as accurate" not in bottom


def test_an_undecided_reason_quotes_the_intervals_that_decided_it():
    """Undecided at the last look means the 90% repeated CI reaches past the margin and the 95% one includes 0.
    On 3,000 simulated paths (looks 3, 5; margin 0.5 pt, true difference 0.3 pt, seed s.d. 1 pt) the 90%
    interval excludes 0 on 18 undecided paths, where the old reason ("reaches past the margin and includes 0",
    quoting the 90% interval) was false. The reasons of those and of every 10th undecided path now quote both
    intervals, their ends recomputed here from the formula d̄ ± c_k · s / √n."""
    design = Design(margin=0.005, looks=(3, 5))
    c = design.boundaries()
    d = np.random.default_rng(45).normal(0.003, 0.01, size=(3000, 5))
    walked = walk(d, design)
    undecided = np.flatnonzero(walked["verdict"] == VERDICTS.index("undecided"))
    assert undecided.size > 1500
    risky = (walked["eq_low"] > 0) | (walked["eq_high"] < 0)  # where the old reason was false
    checked = excluded = 0
    for row in d[[i for i in undecided if risky[i] or i % 10 == 0]]:  # those, and every 10th path
        decision = sequential_decision(row, design)
        assert decision.verdict == "undecided"
        reason = settle.describe("sparsemax", "softmax", decision, design, "top1", cap=5)
        se = row.std(ddof=1) / np.sqrt(5)
        ends = {}
        for level, kind in (("90%", "equivalence"), ("95%", "difference")):
            head = reason.split(f"{level} repeated CI [")[1].split("]")[0]
            low, high = (float(x.replace("\u2212", "-")) / 100 for x in head.split(", "))
            expected = (row.mean() - c[kind][1] * se, row.mean() + c[kind][1] * se)
            assert (low, high) == pytest.approx(expected, abs=0.0006), reason  # printed to 0.1 pt
            ends[level] = expected
        assert "reaches past the margin (±0.5 pt) and the 95% repeated CI" in reason and reason.endswith("includes 0")
        assert ends["95%"][0] <= 0 <= ends["95%"][1]
        assert not (-0.005 < ends["90%"][0] and ends["90%"][1] < 0.005)
        checked += 1
        excluded += not ends["90%"][0] <= 0 <= ends["90%"][1]
    assert checked > 150 and excluded == 18
