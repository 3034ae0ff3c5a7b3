"""The cost of a comparison before it runs: the wall time and device hours of the runs it still has
to do, at the per-run cost measured from the finished runs of its runs folder (the plan's first line).

A run's cost: the comparison's own timing of its train and eval steps (RUN_DIR/compare_timing.json,
written by comparison/execution.py: start-up, data loading and checkpoints included), else what
train.py and eval.py measured themselves (summary.json's train_time_s, eval.json's wall_seconds:
their start-up not included). A variant's runs to do cost the mean of its measured runs; a variant
with none, the mean of every measured run in the folder; a run still to evaluate counts whole. Wall
time: the runs scheduled on the job slots (--jobs N; --emit-slurm: every array task at once) by
comparison/progress.time_left, the command's own start and report not included; device hours: GPU
hours (seconds × processes) for runs measured on GPUs, CPU core-hours (seconds × processes × threads)
on CPU, "run-hours" where no device was recorded.
"""
import os

import numpy as np

from common import rundir
from common.errors import UserError
from common.io import read_json, write_json
from comparison import run_results, settle
from comparison.progress import duration, time_left

TIMING_FILE = "compare_timing.json"  # in a run directory: the comparison's wall time of its steps
NO_MEASURE = "no finished run to measure from yet"
ARRAY = 10 ** 6  # "slots" of --emit-slurm: every array task at once, as a cluster with room runs them


def slots_text(slots):
    """'2 job slot(s)', or the array job's tasks."""
    return "array tasks all at once" if slots >= ARRAY else f"{slots} job slot(s)"


def seconds_text(seconds):
    """A per-run duration: tenths below 10 s (a probe on cached features), else progress.duration."""
    return f"{seconds:.1f} s" if seconds < 10 else duration(seconds)


def record_step(run_dir, step, seconds, env, gpus):
    """Add one step's wall time ("train" or "eval") to RUN_DIR/compare_timing.json, with what the slot
    had: its GPUs (CUDA_VISIBLE_DEVICES when `gpus`), else its CPU threads (OMP_NUM_THREADS)."""
    path = os.path.join(run_dir, TIMING_FILE)
    timing = _read(path) or {}
    timing[f"{step}_s"] = float(seconds)
    if gpus:
        timing.update(device="gpu", visible=[d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d])
    else:
        threads = env.get("OMP_NUM_THREADS", "")
        timing.update(device="cpu", threads=int(threads) if threads.isdigit() else 1)
    write_json(timing, path)


def _read(path):
    try:
        data = read_json(path)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_cost(run_dir, eval_file):
    """{"seconds", "device" (gpu / cpu / None: not recorded), "units" (processes × threads, or ×
    GPUs), "timed" (by the comparison)} of a finished run, None when it is not finished. A train step
    timed after a resume counts only its last session: the longer of that and train.py's own
    (cumulative) time is taken."""
    summary = _read(os.path.join(run_dir, rundir.SUMMARY))
    try:
        result = run_results.read_result(run_dir, eval_file)
    except UserError:  # not evaluated yet, or an evaluation to redo: nothing measured
        return None
    if summary is None:
        return None
    timing = _read(os.path.join(run_dir, TIMING_FILE)) or {}
    own_train, own_eval = summary.get("train_time_s") or 0.0, result.get("wall_seconds") or 0.0
    train = max(timing.get("train_s") or 0.0, own_train)
    evaluate = timing.get("eval_s") or own_eval
    processes = int(summary.get("num_processes") or 1)
    units = processes * (int(timing.get("threads") or 1) if timing.get("device") == "cpu" else 1)
    return {"seconds": float(train + evaluate), "device": timing.get("device"), "units": units,
            "timed": "train_s" in timing or "eval_s" in timing}


def measured_runs(runs_dir, eval_file):
    """{variant: [run_cost]} of the finished runs in `runs_dir` (run folders are <variant>-s<seed>)."""
    out = {}
    try:
        names = sorted(os.listdir(runs_dir))
    except OSError:
        return out
    for name in names:
        variant, sep, seed = name.rpartition("-s")
        if not sep or not seed.isdigit():
            continue
        cost = run_cost(os.path.join(runs_dir, name), eval_file)
        if cost is not None:
            out.setdefault(variant, []).append(cost)
    return out


class Rates:
    """Per-run seconds and device units by variant, from the measured runs (None: nothing measured)."""

    def __init__(self, measured):
        self.measured = measured
        every = [c for costs in measured.values() for c in costs]
        self.count = len(every)
        self.timed = sum(c["timed"] for c in every)
        self.devices = sorted({c["device"] for c in every if c["device"]})
        self.fallback = self._mean(every) if every else None

    @staticmethod
    def _mean(costs):
        n = len(costs)
        return (sum(c["seconds"] for c in costs) / n, sum(c["seconds"] * c["units"] for c in costs) / n)

    def of(self, variant):
        """(seconds, seconds × units) of one run of `variant`."""
        costs = self.measured.get(variant)
        return self._mean(costs) if costs else self.fallback


def rates(runs_dir, eval_file):
    return Rates(measured_runs(runs_dir, eval_file))


def estimate(variant_runs, rate, slots):
    """(wall seconds, device-unit seconds) of `variant_runs` ({variant: runs to do}) on `slots` slots;
    the wall time schedules the mean run (progress.time_left, as the progress line does)."""
    total = sum(variant_runs.values())
    if not total:
        return 0.0, 0.0
    seconds = sum(rate.of(v)[0] * n for v, n in variant_runs.items())
    units = sum(rate.of(v)[1] * n for v, n in variant_runs.items())
    return time_left(seconds / total, [], total, slots), units


def hours_text(rate, unit_seconds):
    """'0.42 GPU hours', '1.3 CPU core-hours', or 'run-hours' where no device was recorded."""
    kind = {("gpu",): "GPU hours", ("cpu",): "CPU core-hours"}.get(tuple(rate.devices), "run-hours")
    return f"{unit_seconds / 3600:.2g} {kind}"


def source_text(rate, runs_dir):
    """Where the per-run cost comes from, in words."""
    how = "timed by the comparison" if rate.timed == rate.count else (
        "train.py's and eval.py's own times, start-up not included" if not rate.timed
        else f"{rate.timed} timed by the comparison, the others train.py's and eval.py's own times")
    return f"measured from {rate.count} finished run(s) in {runs_dir}: {how}"


def plan_line(plan, todo_dirs, commands, runs_dir, slots):
    """The cost line of a fixed plan: its runs still to do, their wall time on `slots` slots and their
    device hours, or that nothing is measured yet."""
    by_variant = {}
    for name, _, run_dir, _ in plan:
        if run_dir in todo_dirs:
            by_variant[name] = by_variant.get(name, 0) + 1
    todo = sum(by_variant.values())
    head = f"cost: {todo} of {len(plan)} run(s) to train and evaluate"
    if not todo:
        return head + ": nothing to run"
    rate = rates(runs_dir, commands.eval_file)
    if rate.fallback is None:
        return f"{head}; {NO_MEASURE} (the estimate comes once a run is done)"
    wall, units = estimate(by_variant, rate, slots)
    per_run = sum(n * rate.of(v)[0] for v, n in by_variant.items()) / todo
    return (f"{head}: about {duration(wall)} of wall time for the runs on {slots_text(slots)}, "
            f"{hours_text(rate, units)} (per run {seconds_text(per_run)}; {source_text(rate, runs_dir)})")


# ---- --until-settled ----------------------------------------------------------------------------------
def settle_lines(looks, missing, slots, paths=None):
    """The cost lines of an --until-settled comparison (comparison/settle.Looks after `now()`): the runs
    expected (the plug-in simulation of settle.simulated_seeds) and at most, their wall time and device
    hours, then the seeds per head."""
    kwargs = {} if paths is None else {"paths": paths}
    design, cap = looks.design, looks.cap
    sim, simulated = settle.simulated_seeds(looks.pairs, looks.differences, looks.decisions, design, cap, **kwargs)
    most = _most_seeds(looks, cap)
    done = looks.finished_seeds()
    steps = [n for n in design.looks if n <= cap]
    expected_runs = _runs_by_look(sim, done, steps, cap)
    max_runs = _runs_by_look({v: np.full(1, n) for v, n in most.items()}, done, steps, cap)
    e_total, m_total = expected_runs.sum(axis=1).mean(), int(max_runs.sum())
    head = (f"cost (--until-settled, looks {' '.join(map(str, design.looks))}"
            + (f", this run up to {cap} seeds" if cap < design.looks[-1] else "") + "): "
            + _runs_text(e_total, m_total, simulated) + f", {len(missing)} of them for the next look")
    rate = rates(looks.runs_dir, looks.commands.eval_file)
    seeds = _seeds_line(looks, sim, simulated, most)
    if not m_total:
        return [f"cost (--until-settled): nothing left to run ({looks.why_done()})", seeds]
    if rate.fallback is None:
        return [f"{head}; {NO_MEASURE} (the estimate comes once a run is done)", seeds]
    run_s = _mean_run(rate, most)
    walls = _walls(expected_runs, run_s, slots)
    unit_s = {v: rate.of(v)[1] for v in most}
    e_units = float(np.mean(sum(unit_s[v] * _count(sim[v], done[v], cap) for v in most)))
    m_units = float(sum(unit_s[v] * _count(np.full(1, most[v]), done[v], cap)[0] for v in most))
    wall_max = _walls(max_runs, run_s, slots)[0]
    return [f"{head}: about {duration(walls.mean())} expected and at most {duration(wall_max)} of wall time for the "
            f"runs on {slots_text(slots)}, {hours_text(rate, e_units)} expected, at most {hours_text(rate, m_units)} "
            f"(per run {seconds_text(run_s)}; {source_text(rate, looks.runs_dir)})", seeds]


def _runs_text(expected, most, simulated):
    """'14.2 run(s) expected, up to 24', or 'up to 24' where a head has no 2 paired seeds to simulate from."""
    if all(simulated.values()):
        return f"{expected:.1f} run(s) expected, up to {most}"
    if not any(simulated.values()):
        return f"up to {most} run(s) (how many to expect is known once each head has 2 paired seeds)"
    return f"up to {most} run(s), {expected:.1f} or more expected (a head without 2 paired seeds counts at the most)"


def _most_seeds(looks, cap):
    """{variant: seeds it ends with at most}: a stopped head its own, the others the cap."""
    most = {head: looks.decisions[head].interval.n if looks.decisions[head].stop else cap for head, _ in looks.pairs}
    for head, ref in looks.pairs:
        most[ref] = max(most.get(ref, 0), most[head])
    return most


def _count(final, done, cap):
    """(paths,) runs to do of one variant ending with `final` seeds: those below it not finished."""
    missing = np.concatenate([[0], np.cumsum([s not in done for s in range(cap)])])
    return missing[np.minimum(final, cap)]


def _runs_by_look(final, done, steps, cap):
    """(paths, looks) runs each look trains: seeds in [previous look, this look) below a variant's final count."""
    columns, previous = [], 0
    for n in steps:
        columns.append(sum(_count(np.minimum(f, n), done[v], cap) - _count(np.minimum(f, previous), done[v], cap)
                           for v, f in final.items()))
        previous = n
    return np.stack(columns, axis=1)


def _walls(runs_by_look, run_s, slots):
    """(paths,) wall seconds: each look's runs scheduled on the slots (progress.time_left), looks in turn."""
    memo = {}

    def wall(n):
        if n not in memo:
            memo[n] = time_left(run_s, [], int(n), slots)
        return memo[n]

    return np.array([sum(wall(n) for n in row) for row in runs_by_look])


def _mean_run(rate, most):
    """Seconds of the mean run, the variants weighted by their most seeds."""
    total = sum(most.values())
    return sum(rate.of(v)[0] * n for v, n in most.items()) / max(total, 1)


def _seeds_line(looks, sim, simulated, most):
    """'seeds per variant (expected, ...; at most): sparsemax 9.4 of 12, ...'."""
    parts = []
    for head, ref in looks.pairs:
        parts.append(f"{head} {np.mean(sim[head]):.1f} of {most[head]}" if simulated[head]
                     else f"{head} up to {most[head]}")
    for ref in dict.fromkeys(ref for _, ref in looks.pairs):
        parts.append(f"{ref} (reference) " + (f"{np.mean(sim[ref]):.1f} of {most[ref]}"
                                              if all(simulated[h] for h, r in looks.pairs if r == ref)
                                              else f"up to {most[ref]}"))
    return ("seeds in all, expected (plug-in: the per-seed differences so far taken as the truth) of at most: "
            + ", ".join(parts))
