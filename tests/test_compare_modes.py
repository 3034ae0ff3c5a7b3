"""scripts/compare_heads.py's modes share one plan: sequential, --jobs N, --emit-slurm, --report-only.

train.py / eval.py are replaced by a fake `subprocess.call` that records each command and copies a
finished run of the tiny comparison (tests/test_compare.py) into place, so the modes run end to end
(report included) without training anything.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest

from test_compare import ROOT, TINY_CONFIG, _child_run, fake_steps, time_runs, tiny_comparison

sys.path.insert(0, os.path.join(ROOT, "scripts"))
import compare_heads  # noqa: E402
from common import rundir  # noqa: E402
from common.children import ChildProcesses  # noqa: E402
from common.errors import UserError  # noqa: E402
from comparison import slot_env  # noqa: E402
from comparison.plan import baseline_pairs, plan_runs  # noqa: E402
from comparison.progress import Progress, duration  # noqa: E402
from comparison.report.write import check_report_dir  # noqa: E402
from comparison.slot_env import device_env  # noqa: E402
from comparison.worker_slots import WorkerSlot  # noqa: E402
from evaluation_copy import copy_evaluation  # noqa: E402

HEADS = ("softmax", "sparsemax")
SEEDS = ("0", "1")


def _fake_call(calls, source_runs):
    """subprocess.call stand-in: records (script, args, pinned env) and copies the tiny run's files."""
    def call(cmd, stdout=None, stderr=None, env=None, **_):
        script = os.path.basename(cmd[1])
        args = tuple(cmd[2:])
        if script == "train.py":
            run_dir = next(a.split("=", 1)[1] for a in args if a.startswith("train.output_dir="))
            head = next(a.split("=", 1)[1] for a in args if a.startswith("head.name="))
            os.makedirs(run_dir, exist_ok=True)
            for name in ("summary.json", "metrics.jsonl", rundir.CONFIG):
                shutil.copy(os.path.join(source_runs, f"{head}-s0", name), run_dir)
        else:
            run_dir, out = args[args.index("--checkpoint") + 1], args[args.index("--output") + 1]
            head = os.path.basename(run_dir).rsplit("-s", 1)[0]
            copy_evaluation(os.path.join(source_runs, f"{head}-s0", "eval.json"), out, run_dir)
        pinned = None if env is None else (env.get("OMP_NUM_THREADS"), env.get("CUDA_VISIBLE_DEVICES"))
        calls.append((script, args, pinned))
        return 0
    return call


def _args(root, *extra):
    return ["--config", os.path.join(root, "tiny.yaml"), "--heads", *HEADS, "--seeds", *SEEDS,
            "--runs-dir", os.path.join(root, "runs"), "--report-dir", os.path.join(root, "report"),
            "--no-mlflow", *extra]  # the comparison's MLflow log has its own test (test_trackers.py)


@pytest.fixture()
def sandbox(tmp_path):
    source, _ = tiny_comparison()
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    return str(tmp_path), os.path.join(source, "runs")


def _slurm_tasks(path):
    """[(run_dir, train overrides, eval args)] of the array job's case block, in task order."""
    text = open(path).read()
    tasks = re.findall(r"^  (\d+)\) RUN_DIR=(.*)\n\s+TRAIN_OVERRIDES=\((.*)\)\n\s+EVAL_ARGS=\((.*)\);;$", text, re.M)
    assert [int(t[0]) for t in tasks] == list(range(len(tasks)))
    return [(shlex.split(d)[0], shlex.split(o), shlex.split(e)) for _, d, o, e in tasks], text


def test_every_mode_runs_the_same_plan(sandbox, monkeypatch, capsys):
    root, source_runs = sandbox
    runs = os.path.join(root, "runs")
    plan, _ = plan_runs(compare_heads.parse_args(_args(root)))
    assert len(plan) == len(HEADS) * len(SEEDS)

    # Sequential: train then eval, run after run, in plan order.
    sequential = []
    fake_steps(monkeypatch, _fake_call(sequential, source_runs))
    assert compare_heads.main(_args(root)) == 0
    assert [c[0] for c in sequential] == ["train.py", "eval.py"] * len(plan)
    one_slot = device_env(0, 1)  # a one-job slot's environment: every core (the user's cap kept)
    assert {c[2] for c in sequential} == {(one_slot.get("OMP_NUM_THREADS"), one_slot.get("CUDA_VISIBLE_DEVICES"))}

    # --jobs 2: the same commands (any order), each job pinned to half the CPU threads, through each
    # slot's worker process (comparison.worker_slots.WorkerSlot; its own tests: test_compare_worker.py).
    shutil.rmtree(runs)
    parallel = []
    fake = _fake_call(parallel, source_runs)
    monkeypatch.setattr(ChildProcesses, "run", _child_run(lambda *a, **k: pytest.fail("not a worker")))
    monkeypatch.setattr(WorkerSlot, "run", lambda self, cmd, log=None: fake(cmd, env=self.env))
    monkeypatch.setattr(slot_env, "count_gpus", lambda: 0)
    monkeypatch.setattr(slot_env, "count_cores", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # tests/conftest.py sets 1: no cap here
    assert compare_heads.main(_args(root, "--jobs", "2")) == 0
    assert sorted(c[:2] for c in parallel) == sorted(c[:2] for c in sequential)
    assert {c[2] for c in parallel} == {("2", None)}  # 4 cores / 2 jobs
    for _, _, run_dir, _ in plan:
        assert os.path.isfile(os.path.join(run_dir, rundir.COMPARE_LOG))

    # --emit-slurm: one array task per planned run, with the same train and eval arguments.
    monkeypatch.chdir(ROOT)
    script = os.path.join(root, "compare.sbatch")
    assert compare_heads.main(_args(root, "--emit-slurm", script)) == 0
    tasks, text = _slurm_tasks(script)
    train_args = [c[1] for c in sequential if c[0] == "train.py"]
    eval_args = [c[1] for c in sequential if c[0] == "eval.py"]
    assert [t[0] for t in tasks] == [p[2] for p in plan]
    assert [("--config", os.path.join(root, "tiny.yaml"), *t[1], "--resume", "auto") for t in tasks] == train_args
    assert [tuple(t[2]) for t in tasks] == eval_args
    assert f"#SBATCH --array=0-{len(plan) - 1}\n" in text and "#SBATCH --signal=B:USR1@300" in text
    assert "scripts/slurm_train.sh" in text and "--report-only" in text
    if shutil.which("bash"):
        assert subprocess.run(["bash", "-n", script]).returncode == 0  # the script parses

    # --report-only: nothing runs; a run without its evaluation is named as missing.
    gone = plan[-1][2]
    os.remove(os.path.join(gone, "eval.json"))
    fake_steps(monkeypatch, lambda *a, **k: pytest.fail("report-only ran something"))
    capsys.readouterr()
    assert compare_heads.main(_args(root, "--report-only")) == 0
    out = capsys.readouterr().out
    assert f"missing (1 of {len(plan)} planned run(s)" in out and gone in out
    md = open(os.path.join(root, "report", "report.md")).read()
    assert "## Missing runs" in md and f"- `{gone}`" in md
    # the SLURM script's evaluation check uses the same rule
    assert compare_heads.main(["--check-evaluated", gone, "eval.json", "builtin10_ood"]) == 1
    assert compare_heads.main(["--check-evaluated", plan[0][2], "eval.json", "builtin10_ood"]) == 0
    assert compare_heads.main(["--check-evaluated", plan[0][2], "eval.json", "other_ood"]) == 1

    # --dry-run lists the same runs
    shutil.rmtree(runs)
    assert compare_heads.main(_args(root, "--dry-run")) == 0
    out = capsys.readouterr().out
    assert [line.split()[-1] for line in out.splitlines() if "would train and evaluate" in line] == [p[2] for p in plan]


def test_report_only_without_any_finished_run_says_so(sandbox):
    root, _ = sandbox
    with pytest.raises(UserError, match="none of the 4 planned runs"):
        compare_heads.main(_args(root, "--report-only"))


def test_device_env_round_robin():
    env = {"PATH": "x"}
    assert [device_env(s, 2, env, gpu_count=4)["CUDA_VISIBLE_DEVICES"] for s in (0, 1)] == ["0,2", "1,3"]
    assert [device_env(s, 3, env, gpu_count=1)["CUDA_VISIBLE_DEVICES"] for s in (0, 1, 2)] == ["0"] * 3
    visible = dict(env, CUDA_VISIBLE_DEVICES="3,5")
    assert [device_env(s, 2, visible, gpu_count=2)["CUDA_VISIBLE_DEVICES"] for s in (0, 1)] == ["3", "5"]
    cpu = [device_env(s, 2, env, gpu_count=0, cpu_count=2) for s in (0, 1)]
    assert [e["OMP_NUM_THREADS"] for e in cpu] == ["1", "1"] and "CUDA_VISIBLE_DEVICES" not in cpu[0]
    assert device_env(0, 4, env, gpu_count=0, cpu_count=2)["OMP_NUM_THREADS"] == "1"
    capped = dict(env, OMP_NUM_THREADS="1")  # the user's own setting is a cap, never raised
    assert device_env(0, 1, capped, gpu_count=0, cpu_count=4)["OMP_NUM_THREADS"] == "1"
    assert device_env(0, 2, dict(env, OMP_NUM_THREADS="8"), gpu_count=0, cpu_count=4)["OMP_NUM_THREADS"] == "2"
    assert env == {"PATH": "x"}  # the caller's mapping is left alone


def test_mode_errors_are_one_line(tmp_path, monkeypatch):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY_CONFIG)
    base = ["--config", str(cfg), "--runs-dir", str(tmp_path / "runs")]
    with pytest.raises(UserError, match="--jobs"):
        compare_heads.parse_args(base + ["--jobs", "2", "--report-only"])
    with pytest.raises(UserError, match="--launcher does not apply"):
        compare_heads.parse_args(base + ["--emit-slurm", "x.sbatch", "--launcher", "python"])
    with pytest.raises(UserError, match="at least 1"):
        compare_heads.parse_args(base + ["--jobs", "0"])
    with pytest.raises(UserError, match="--baseline entmax15 is not among"):
        compare_heads.main(base + ["--heads", "softmax", "sparsemax", "--baseline", "entmax15", "--dry-run"])
    with pytest.raises(UserError, match="unknown --ood-dataset"):
        compare_heads.main(base + ["--ood-dataset", "builtin1O_ood", "--dry-run"])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="repository root"):
        compare_heads.main(base + ["--emit-slurm", str(tmp_path / "x.sbatch")])


def test_baseline_pairs_follow_the_norm():
    args = compare_heads.parse_args(["--config", "x.yaml", "--heads", "softmax", "sparsemax", "entmax15",
                                     "--norms", "affine", "layernorm"])
    assert baseline_pairs(args) == [
        ("sparsemax-affine", "softmax-affine"), ("entmax15-affine", "softmax-affine"),
        ("sparsemax-layernorm", "softmax-layernorm"), ("entmax15-layernorm", "softmax-layernorm")]
    args = compare_heads.parse_args(["--config", "x.yaml", "--heads", "sparsemax", "entmax15"])
    assert baseline_pairs(args) == [("entmax15", "sparsemax")]  # no softmax: the first head


def test_report_folder_belongs_to_one_runs_folder(tmp_path, capsys):
    """The report folder defaults beside --runs-dir; --dry-run says where; a folder holding the report
    of another runs folder is refused before anything trains, unless --overwrite."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY_CONFIG)
    base = ["--config", str(cfg), "--heads", "softmax", "--dry-run"]
    runs_a, runs_b, shared = (str(tmp_path / n) for n in ("a", "b", "shared"))
    assert compare_heads.main(base + ["--runs-dir", runs_a]) == 0
    assert f"report: {os.path.join(runs_a, 'report', 'report.md')}" in capsys.readouterr().out

    check_report_dir(shared, runs_a, overwrite=False, record=True)  # as a report of A writes it
    assert compare_heads.main(base + ["--runs-dir", runs_a, "--report-dir", shared]) == 0  # the same runs: fine
    with pytest.raises(UserError, match=r"holds the report of the runs in .*a, not .*b; .*--overwrite"):
        compare_heads.main(base + ["--runs-dir", runs_b, "--report-dir", shared])
    assert compare_heads.main(base + ["--runs-dir", runs_b, "--report-dir", shared, "--overwrite"]) == 0


def test_progress_line_counts_the_plan_and_estimates_the_rest():
    now = [100.0]
    progress = Progress(4, skipped=2, clock=lambda: now[0])
    now[0] += 30
    assert progress.line() == ("progress: 3 of 6 run(s) finished (1 now, in 30 s); about 1 min 30 s left "
                               "(1 job slot(s), 0 run(s) in flight)")
    now[0] += 90
    assert progress.line().endswith("(2 now, in 2 min 00 s); about 2 min 00 s left (1 job slot(s), 0 run(s) in flight)")
    progress.line()
    assert progress.line() == "progress: 6 of 6 run(s) finished (4 now, in 2 min 00 s)"
    assert duration(3725) == "1 h 02 min"


def test_the_estimate_counts_the_job_slots_and_the_runs_in_flight():
    """9 runs on 3 slots with fake durations (a slot runs its runs back to back): after each finished
    run the estimate is checked against the rest measured on the same fake clock. Equal durations:
    exact; unequal ones (±20%): within one run-length, where wall time / runs done x runs left said
    8 run-lengths after the first run when 2 were left."""
    import re

    for durations in ([60.0] * 9, [60.0, 72.0, 48.0, 66.0, 54.0, 60.0, 70.0, 50.0, 60.0]):
        events, free = [], [0.0, 0.0, 0.0]  # the schedule: each run on the slot that frees first
        for i, d in enumerate(durations):
            slot = min(range(3), key=lambda s: free[s])
            events += [(free[slot], 0, i), (free[slot] + d, 1, i)]
            free[slot] += d
        end = max(free)
        now = [0.0]
        progress = Progress(9, slots=3, clock=lambda: now[0])
        for t, kind, i in sorted(events):
            now[0] = t
            if kind == 0:
                progress.started(i)
                continue
            line = progress.line(i)
            left = re.search(r"about (?:(\d+) min )?(\d+) s left", line)
            if left is None:
                assert "9 of 9" in line
                continue
            estimate = 60 * int(left.group(1) or 0) + int(left.group(2))
            tolerance = 1 if len(set(durations)) == 1 else 60
            assert abs(estimate - (end - t)) <= tolerance, (line, end - t)


def test_a_step_run_one_after_another_sets_its_threads(monkeypatch):
    """compare_heads' steps get OMP_NUM_THREADS (a one-job slot's share: every core) in every mode, so
    train.py's busy-cores warning (asking the user to set it) is never printed for a run the user did
    not start; the user's own cap is kept."""
    from comparison import execution
    from training.launch import busy_cores_warning

    seen = []

    class Children:
        def run(self, cmd, **kwargs):
            seen.append(kwargs["env"])
            return 0

        def check_stopped(self, *args):
            pass

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    execution.run_step(Children(), ["python", "train.py"], "training runs/x")
    assert int(seen[-1]["OMP_NUM_THREADS"]) >= 1
    assert busy_cores_warning("cpu", 2, load=99.0, cores=2, env=seen[-1]) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    execution.run_step(Children(), ["python", "train.py"], "training runs/x")
    assert seen[-1]["OMP_NUM_THREADS"] == "1"


def test_the_plans_first_line_is_its_cost(sandbox, monkeypatch, capsys):
    """--dry-run's first line: nothing measured yet; then, with finished runs in the runs folder, their
    measured cost (the comparison's step timing, else train.py's and eval.py's own times) scheduled on
    the --jobs slots."""
    from comparison.report import plots

    root, source_runs = sandbox
    for name in dir(plots):  # the cost line is under test: no plots
        if name.startswith("plot_"):
            monkeypatch.setattr(plots, name, lambda *args, **kwargs: None)
    assert compare_heads.main(_args(root, "--dry-run")) == 0
    assert capsys.readouterr().out.splitlines()[0] == ("cost: 4 of 4 run(s) to train and evaluate; no finished run "
                                                       "to measure from yet (the estimate comes once a run is done)")
    fake_steps(monkeypatch, _fake_call([], source_runs))
    assert compare_heads.main(_args(root)) == 0
    runs = os.path.join(root, "runs")
    time_runs(runs, 8.0, 2.0, threads=2)
    more = [a if a != "1" else "1 2 3".split() for a in _args(root)]
    argv = [w for a in more for w in (a if isinstance(a, list) else [a])]  # --seeds 0 1 2 3
    capsys.readouterr()
    assert compare_heads.main(argv + ["--dry-run", "--jobs", "2"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    # 4 runs of 10 s on 2 slots: 20 s; 4 × 10 s × 2 threads = 80 core-seconds
    assert first == (f"cost: 4 of 8 run(s) to train and evaluate: about 20 s of wall time for the runs on 2 job "
                     f"slot(s), 0.022 CPU core-hours (per run 10 s; measured from 4 finished run(s) in {runs}: "
                     f"timed by the comparison)")
    for name in os.listdir(runs):
        if os.path.isdir(os.path.join(runs, name)):
            os.remove(os.path.join(runs, name, "compare_timing.json"))
    assert compare_heads.main(argv + ["--dry-run"]) == 0
    assert "train.py's and eval.py's own times, start-up not included" in capsys.readouterr().out.splitlines()[0]
