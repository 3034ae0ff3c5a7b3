"""scripts/compare_heads.py on a tiny config: report columns, plot files, resumability.

The tiny comparison (softmax vs sparsemax, one seed, a few steps) is trained once per test run by
`tiny_comparison()` and shared with the eval, predict, tracker and worker tests (read-only).
"""
import json
import os
import shutil
import struct
import subprocess
import sys

import pytest

from common import rundir
from common.children import ChildProcesses
from session_dir import built_once

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "compare_heads.py")
HEADS = ("softmax", "sparsemax")

# 256 train samples (25% held out for calibration), 101 val samples: not divisible by the batch
# size nor by 2 processes, so padded or duplicated samples would show in the counts.
TINY_CONFIG = """\
model: {name: resmlp_tiny}
head: {name: softmax}
data: {dataset: builtin10, image_size: 32, batch_size: 64, eval_batch_size: 32, num_workers: 0,
       builtin_train_size: 256, builtin_val_size: 101, calib_fraction: 0.25}
optim: {name: adamw, lr: 2.0e-3, lr_base_batch: 64, weight_decay: 0.05, epochs: 2, warmup_epochs: 0}
train: {eval_every: 1, log_every: 2, save_every: 100, ema: true, ema_decay: 0.5, progress: false,
        log_with: none}
"""

_CACHE = {}


def compare_args():
    """compare_heads' arguments for the tiny comparison: paths relative to its folder (run from there),
    so that a copy of the folder is the same comparison."""
    return ["--config", "tiny.yaml", "--heads", *HEADS, "--seeds", "0", "--runs-dir", "runs", "--report-dir", "report"]


# A rerun of the tiny comparison here leaves MLflow out: its build logs it once, which test_trackers.py reads,
# and a rerun's log into the copied store costs seconds that no assertion here reads.
NO_MLFLOW = ["--no-mlflow"]


def _build_tiny_comparison(root):
    with open(os.path.join(root, "tiny.yaml"), "w") as f:
        f.write(TINY_CONFIG)
    proc = subprocess.run([sys.executable, SCRIPT, *compare_args()], cwd=root, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(os.path.join(root, "stdout.txt"), "w") as f:
        f.write(proc.stdout)


def tiny_comparison():
    """The tiny comparison, run once per test run (as a user would, in a subprocess) and shared by every
    pytest-xdist worker (tests/session_dir.py): read it, never change it; a test that changes it works
    on `tiny_comparison_copy`."""
    if "root" not in _CACHE:
        root = built_once("tiny-comparison", _build_tiny_comparison)
        with open(os.path.join(root, "stdout.txt")) as f:
            _CACHE.update(root=root, stdout=f.read())
    return _CACHE["root"], _CACHE["stdout"]


def tiny_comparison_copy(tmp_path, monkeypatch):
    """A private copy of the tiny comparison's folder (config, runs, report), made the current
    directory, where compare_args() names the same comparison: as a project moved or copied whole."""
    root, _ = tiny_comparison()
    copy = tmp_path / "comparison"
    copy.mkdir()
    for name in ("tiny.yaml", "runs", "report"):
        (shutil.copytree if os.path.isdir(os.path.join(root, name)) else shutil.copy)(os.path.join(root, name),
                                                                                      copy / name)
    monkeypatch.chdir(copy)
    return str(copy)


def tiny_run_dir(head="sparsemax"):
    """A finished, evaluated run of the tiny comparison (seed 0): read it, never change it."""
    root, _ = tiny_comparison()
    return os.path.join(root, "runs", f"{head}-s0")


def _png_size(path):
    with open(path, "rb") as f:
        head = f.read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])



def _child_run(call):
    """A subprocess.call-like stand-in as common.children.ChildProcesses.run (children start through it)."""
    return lambda self, cmd, **kwargs: call(cmd, **kwargs)


def time_runs(runs_dir, train_s, eval_s, threads):
    """Give every finished run in `runs_dir` the step times the comparison measured (compare_timing.json),
    and train.py's own time the same (the cost takes the longer of the two: the copied runs' own
    time is whatever this machine took to train them)."""
    for name in os.listdir(runs_dir):
        run = os.path.join(runs_dir, name)
        if os.path.isfile(os.path.join(run, rundir.SUMMARY)):
            with open(os.path.join(run, "compare_timing.json"), "w") as f:
                json.dump({"train_s": train_s, "eval_s": eval_s, "device": "cpu", "threads": threads}, f)
            summary = json.load(open(os.path.join(run, rundir.SUMMARY)))
            with open(os.path.join(run, rundir.SUMMARY), "w") as f:
                json.dump(dict(summary, train_time_s=train_s), f)


def fake_steps(monkeypatch, call):
    """Every train.py / eval.py step of a comparison goes to `call(cmd, env=...)` instead: the ones a
    child process runs (ChildProcesses.run) and the ones a worker runs (WorkerSlot.run: one-run-after-
    another comparisons run their steps on one worker)."""
    from comparison.worker_slots import WorkerSlot

    monkeypatch.setattr(ChildProcesses, "run", _child_run(call))
    monkeypatch.setattr(WorkerSlot, "run", lambda self, cmd, log=None: call(cmd, env=self.env))

def test_report_has_every_column_and_plot():
    from comparison.report import document, plots

    root, stdout = tiny_comparison()
    report_dir = os.path.join(root, "report")
    md = open(os.path.join(report_dir, "report.md")).read()
    runs = {h: [document.load_run(os.path.join(root, "runs", f"{h}-s0"), "eval.json", seed=0)] for h in HEADS}
    labels = [row[0] for row in document.summary_table(runs)[1]]
    expected = ["top-1 acc", "top-5 acc", "FY loss", "NLL (finite part)", "P(p_y = 0)",
                "ECE (15 bins), mean of per-run", "ECE (15 bins), pooled over seeds",
                "support size mean", "support size median", "support contains y",
                "mean per-class acc", "worst-class acc",
                "support ε=0.1 coverage", "support ε=0.05 mean set size", "support ε=0.1 calibrated T",
                "lac ε=0.1 coverage", "aps ε=0.05 mean set size", "train time (s)", "train img/s", "eval img/s"]
    for label in expected:
        assert label in labels
    for method in ("support", "lac", "aps"):  # the empty-set fraction of every prediction-set method
        for eps in ("0.1", "0.05"):
            assert f"{method} ε={eps} empty sets" in labels
    for label in labels:
        assert f"| {label} |" in md, label
        assert label in stdout, label  # the table printed at the end
    assert "| metric | softmax | sparsemax |" in md
    # softmax has no sparse support set; the sparse head has real numbers there
    row = next(line for line in md.splitlines() if line.startswith("| support ε=0.1 coverage |"))
    assert row.split("|")[2].strip() == "n/a" and row.split("|")[3].strip().endswith("%")
    for name in plots.PLOT_FILES.values():
        path = os.path.join(report_dir, name)
        w, h = _png_size(path)
        assert w > 200 and h > 200 and os.path.getsize(path) > 5000
        assert f"]({name})" in md
    assert "report: " + os.path.join("report", "report.md") in stdout  # relative, as it was asked for
    lines = open(os.path.join(report_dir, "runs.csv")).read().strip().splitlines()
    assert len(lines) == 1 + len(HEADS) and "ps_support_eps0.1_coverage" in lines[0]
    assert "2 training run(s) and 2 evaluation(s)" in stdout
    # the steps ran on the comparison's one worker and printed on its stdout, as child processes would
    for head in HEADS:
        assert f"run dir {os.path.join('runs', f'{head}-s0')}" in stdout  # train.py's last line


def test_one_run_after_another_runs_every_step_on_one_worker(tmp_path, monkeypatch):
    """The default mode's steps go to one WorkerSlot (one Python start for the whole comparison, not
    two per run), with a one-job slot's environment; no step starts a process of its own."""
    from comparison.slot_env import device_env
    from comparison.worker_slots import WorkerSlot

    root = tiny_comparison_copy(tmp_path, monkeypatch)
    shutil.rmtree(os.path.join(root, "runs", "sparsemax-s0"))  # one run to redo: train and evaluate
    slots = []
    monkeypatch.setattr(ChildProcesses, "run", _child_run(lambda *a, **k: pytest.fail("a step got a process")))
    source = os.path.join(tiny_comparison()[0], "runs", "sparsemax-s0")

    def run(self, cmd, log=None):
        slots.append((id(self), os.path.basename(cmd[1]), log, self.env == device_env(0, 1)))
        if os.path.basename(cmd[1]) == "train.py":
            # the run as trained and evaluated
            shutil.copytree(source, os.path.join(root, "runs", "sparsemax-s0"), dirs_exist_ok=True)
        return 0

    monkeypatch.setattr(WorkerSlot, "run", run)
    import compare_heads

    assert compare_heads.main(compare_args() + NO_MLFLOW) == 0
    assert [s[1:] for s in slots] == [("train.py", None, True), ("eval.py", None, True)]
    assert len({s[0] for s in slots}) == 1


def _stamps(root):
    out = {}
    for h in HEADS:
        for name in ("summary.json", "eval.json", "model.safetensors"):
            p = os.path.join(root, "runs", f"{h}-s0", name)
            out[p] = os.stat(p).st_mtime_ns
    return out


def test_second_invocation_runs_nothing(tmp_path, monkeypatch, capsys):
    """...also in a copy of the whole folder elsewhere: the config's path is no setting, and the report
    folder, which names its runs folder, is still this comparison's."""
    root = tiny_comparison_copy(tmp_path, monkeypatch)
    before = _stamps(root)
    report_written = os.stat(os.path.join(root, "report", "report.md")).st_mtime_ns
    import compare_heads

    calls = []
    fake_steps(monkeypatch, lambda *a, **k: calls.append(a) or 0)
    assert compare_heads.main(compare_args() + NO_MLFLOW) == 0
    out = capsys.readouterr().out
    assert calls == []
    assert "0 training run(s) and 0 evaluation(s)" in out
    assert out.count("done, skipped") == len(HEADS)
    assert _stamps(root) == before
    assert os.stat(os.path.join(root, "report", "report.md")).st_mtime_ns != report_written  # rewritten in place


def test_missing_eval_is_redone_without_retraining(tmp_path, monkeypatch, capsys):
    """A run whose training finished but whose evaluation did not: only eval.py runs (subprocess
    through --launcher, so the accelerate state of this test process stays untouched)."""
    root = tiny_comparison_copy(tmp_path, monkeypatch)
    import compare_heads

    run = os.path.join(root, "runs", "sparsemax-s0")
    with open(os.path.join(run, "eval.json")) as f:
        old = json.load(f)
    os.remove(os.path.join(run, "eval.json"))
    summary_mtime = os.stat(os.path.join(run, "summary.json")).st_mtime_ns
    assert compare_heads.main(compare_args() + NO_MLFLOW + ["--launcher", sys.executable]) == 0
    out = capsys.readouterr().out
    assert "0 training run(s) and 1 evaluation(s)" in out
    assert "train.py" not in out
    with open(os.path.join(run, "eval.json")) as f:
        new = json.load(f)
    assert new["top1"] == old["top1"] and new["n"] == old["n"]
    assert os.stat(os.path.join(run, "summary.json")).st_mtime_ns == summary_mtime


def test_runs_with_other_settings_are_refused(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import compare_heads
    from common.errors import UserError
    from comparison.ledger import check_request
    from comparison.plan import plan_runs

    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY_CONFIG)
    run = tmp_path / "runs" / "softmax-s0"
    run.mkdir(parents=True)
    (run / rundir.COMPARE_REQUEST).write_text(json.dumps({"config": str(cfg), "overrides": ["x=1"]}))
    args = ["--config", str(cfg), "--heads", "softmax", "--runs-dir", str(tmp_path / "runs"),
            "--report-dir", str(tmp_path / "report")]
    with pytest.raises(UserError, match="other settings"):
        compare_heads.main(args)
    # The same overrides but the config file changed since: named in the message.
    (run / rundir.COMPARE_REQUEST).unlink()
    assert compare_heads.main(args + ["--dry-run"]) == 0
    plan, _ = plan_runs(compare_heads.parse_args(args))
    import configs
    request = {"config": str(cfg), "overrides": plan[0][3],
               "resolved": configs.config_to_dict(configs.load_config(str(cfg), plan[0][3]))}
    check_request(str(run), request)
    cfg.write_text(TINY_CONFIG.replace("lr: 2.0e-3", "lr: 3.0e-3"))
    with pytest.raises(UserError, match=r"optim.lr: 0.002 -> 0.003"):
        compare_heads.main(args)
    with pytest.raises(UserError, match="valid: softmax, sparsemax, entmax15, entmax_bisect"):
        compare_heads.main(args[:3] + ["sparsmax"] + args[4:])


def test_plan_names_variants_and_overrides():
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import compare_heads
    from comparison.plan import plan_runs

    args = compare_heads.parse_args(["--config", "x.yaml", "--heads", "softmax", "entmax_bisect",
                                     "--alphas", "1.25", "1.75", "--norms", "affine", "layernorm",
                                     "--seeds", "0", "1", "--runs-dir", "R", "optim.epochs=1"])
    plan, _ = plan_runs(args)
    names = sorted({p[0] for p in plan})
    assert names == sorted(["softmax-affine", "softmax-layernorm", "entmax_bisect-a1.25-affine",
                            "entmax_bisect-a1.75-affine", "entmax_bisect-a1.25-layernorm",
                            "entmax_bisect-a1.75-layernorm"])
    assert len(plan) == 12
    name, seed, run_dir, ov = next(p for p in plan if p[0] == "entmax_bisect-a1.75-layernorm" and p[1] == 1)
    assert run_dir == os.path.join("R", "entmax_bisect-a1.75-layernorm-s1")
    assert {"optim.epochs=1", "head.name=entmax_bisect", "head.alpha=1.75", "model.norm=layernorm",
            "train.seed=1", f"train.output_dir={run_dir}"} <= set(ov)


def _records(run_dir):
    from common.rundir import examples_path
    from evaluation.examples import load_examples

    return load_examples(examples_path(os.path.join(run_dir, "eval.json")))[0]


def test_report_has_paired_statistics_selective_and_ood_sections():
    """The statistics are wired to the runs' per-example records: the pair's top-1 difference is the
    difference of the two eval.json top-1s, McNemar's counts are those of the records, and the
    sentence for each metric is in report.md and on the terminal."""
    root, stdout = tiny_comparison()
    report_dir = os.path.join(root, "report")
    md = open(os.path.join(report_dir, "report.md")).read()
    with open(os.path.join(report_dir, "paired_statistics.json")) as f:
        paired = json.load(f)
    assert len(paired) == 1 and paired[0]["variant"] == "sparsemax" and paired[0]["baseline"] == "softmax"
    runs = {h: os.path.join(root, "runs", f"{h}-s0") for h in HEADS}
    evals = {h: json.load(open(os.path.join(runs[h], "eval.json"))) for h in HEADS}
    top1 = paired[0]["bootstrap"]["top1"]
    assert top1["difference"] == pytest.approx(evals["sparsemax"]["top1"] - evals["softmax"]["top1"], abs=1e-12)
    assert top1["ci_low"] <= top1["difference"] <= top1["ci_high"]
    loss = paired[0]["bootstrap"]["loss"]
    assert loss["difference"] == pytest.approx(evals["sparsemax"]["loss"] - evals["softmax"]["loss"], rel=1e-5)
    ra, rb = _records(runs["sparsemax"]), _records(runs["softmax"])
    ca, cb = (ra["pred"] == ra["label"]), (rb["pred"] == rb["label"])
    assert paired[0]["mcnemar"]["b"] == int((ca & ~cb).sum()) and paired[0]["mcnemar"]["c"] == int((~ca & cb).sum())
    assert "## Paired differences against the baseline" in md
    # the conditional sentences (given these trainings) are the report's details; the terminal gets
    # one verdict per head (across trainings; here both heads sit at chance after a few steps)
    for sentence in paired[0]["sentences"]:
        assert f"- {sentence}" in md
    assert f"- {paired[0]['verdict']}" in md and f"- {paired[0]['verdict']}" in stdout
    assert not any(sentence in stdout for sentence in paired[0]["sentences"])  # one sentence per head
    assert paired[0]["verdict"].startswith("sparsemax vs softmax: no comparison: nothing learned")
    assert "sparsemax: no comparison: nothing learned" in stdout
    assert paired[0]["across"]["top1"]["per_seed"] == [pytest.approx(top1["difference"], abs=1e-12)]
    assert paired[0]["sentences"][0].startswith("sparsemax − softmax top-1: ")
    assert "McNemar exact p" in paired[0]["sentences"][0]
    assert [s.split(":")[0] for s in paired[0]["sentences"]] == [
        "sparsemax − softmax top-1", "sparsemax − softmax ECE", "sparsemax − softmax FY loss"]
    # selective prediction: the table's AURC is eval.py's, for both confidences of the sparse head
    assert "## Selective prediction" in md and "![Risk–coverage](risk_coverage.png)" in md
    for head, label, key in (("softmax", "max probability", "max_prob"), ("sparsemax", "max probability", "max_prob"),
                             ("sparsemax", "1/support size (ties: max prob)", "support")):
        row = next(line for line in md.splitlines() if line.startswith(f"| {head} | {label} |"))
        assert row.split("|")[3].strip() == f"{evals[head]['selective'][key]['aurc']:.4f}"
    assert not any(line.startswith("| softmax | 1/support") for line in md.splitlines())
    # OOD: the built-in OOD set by default, AUROC per score (support size for the sparse head only)
    assert "## Out-of-distribution detection" in md and "builtin10_ood" in md
    for head, label, key in (("softmax", "entropy", "neg_entropy"), ("sparsemax", "support size", "neg_support")):
        row = next(line for line in md.splitlines() if line.startswith(f"| {head} | {label} |"))
        assert row.split("|")[3].strip() == f"{100 * evals[head]['ood']['scores'][key]['auroc']:.2f}%"
    assert not any(line.startswith("| softmax | support size |") for line in md.splitlines())
    # the logit and feature-memory scores beside them, each with its difference to max probability
    ood_md = md.split("## Out-of-distribution detection")[1].split("\n## ")[0]
    assert "Δ AUROC vs max prob" in ood_md
    row = next(line for line in ood_md.splitlines() if line.startswith("| sparsemax | kNN |")).split("|")
    diff = (evals["sparsemax"]["ood"]["scores"]["knn"]["auroc"]
            - evals["sparsemax"]["ood"]["scores"]["max_prob"]["auroc"])
    from comparison.analysis.statistics import signed_points

    assert row[5].strip() == f"{signed_points(diff)} pt (1 seed)"
    assert next(line for line in ood_md.splitlines()
                if line.startswith("| softmax | max probability |")).split("|")[5].strip() == "—"
    assert "Train times and img/s depend on what else the machine was running" in md


def test_identical_heads_are_not_significant(tmp_path):
    """A variant whose every run is a copy of the baseline's (two seeds): zero difference, an
    interval [0, 0], McNemar p = 1, "not significant" in every sentence."""
    from comparison.report import document

    root, _ = tiny_comparison()
    run = os.path.join(root, "runs", "softmax-s0")
    variants = {name: [document.load_run(run, "eval.json", seed=s) for s in (0, 1)] for name in ("softmax", "copy")}
    _, path, paired = document.write_report(variants, str(tmp_path), "t", "cmd", pairs=[("copy", "softmax")])
    md = open(path).read()
    assert paired[0]["seeds"] == [0, 1] and paired[0]["mcnemar"]["p_value"] == 1.0
    assert paired[0]["bootstrap"]["top1"]["n_rows"] == 2 * 101
    assert "- copy − softmax top-1: 0.0 pt [0.0, 0.0], not significant at 5% (McNemar exact p = 1)" in md
    for sentence in paired[0]["sentences"]:
        assert "not significant" in sentence and f"- {sentence}" in md
    # the verdict across trainings: zero on both seeds; the tiny runs sit at chance, which comes first
    assert paired[0]["across"]["top1"]["per_seed"] == [0.0, 0.0] and not paired[0]["across"]["top1"]["significant"]
    assert paired[0]["verdict"].startswith("copy vs softmax: no comparison: nothing learned")
    assert f"- {paired[0]['verdict']}" in md
    # two seeds: the pooled ECE row and the mean-of-per-run row are both there, named
    assert "| ECE (15 bins), mean of per-run |" in md and "| ECE (15 bins), pooled over seeds |" in md
