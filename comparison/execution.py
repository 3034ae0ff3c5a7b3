"""Local execution of a plan's missing steps: train.py then eval.py per run, one run after another
(output on the terminal; every step in one worker process, comparison/worker_slots.py) or --jobs N
at once (each slot pinned to its share of the machine, with its worker; output in RUN_DIR/compare.log),
always through a runner that forwards signals to the steps (common.children.ChildProcesses, or
comparison.worker_slots.InProcess around one)."""
import os
import shlex
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from common import rundir
from common.errors import UserError
from common.io import ensure_folder, writing
from comparison import cost, slot_env
from comparison.commands import is_trained
from comparison.ledger import check_request
from comparison.slot_env import device_env
from comparison.worker_slots import InProcess, WorkerSlot, can_run

RERUN = "rerun the same command (finished runs are kept, interrupted ones resume)"  # after a failed step


def runner(args, children):
    """What runs the train.py / eval.py steps: `children` (signals forwarded), or with --features,
    one job and no --launcher, this process (a probe trains in far less time than a Python start takes)."""
    return InProcess(children) if args.features and args.jobs == 1 and not args.launcher else children


def run_todo(todo, commands, requests, jobs, children, progress=None):
    """Train and evaluate `todo` [(tag, run_dir, overrides, trained)], one run after another or `jobs`
    at once, through `children` (common.children.ChildProcesses: signals are forwarded);
    -> (trained, evaluated)."""
    for _, run_dir, _, _ in todo:
        check_request(run_dir, requests[run_dir])
    if todo and jobs > 1:
        return run_parallel(todo, commands, jobs, children, progress)
    trained_now = evaluated_now = 0
    gpus = bool(todo) and slot_env.count_gpus() > 0
    # one worker runs every step (one Python start, not two per run), unless the steps run in this
    # process already (InProcess)
    worker = WorkerSlot(children, device_env(0, 1)) if not isinstance(children, InProcess) else None
    try:
        for tag, run_dir, ov, trained in todo:
            if not trained:
                print(f"{tag}: training", flush=True)
                start = time.perf_counter()
                run_step(children, commands.train(ov), f"training {run_dir}", worker)
                trained_now += 1
                if not is_trained(run_dir):
                    raise UserError(f"train.py finished without writing {run_dir}/summary.json")
                cost.record_step(run_dir, "train", time.perf_counter() - start, device_env(0, 1), gpus)
            print(f"{tag}: evaluating", flush=True)
            start = time.perf_counter()
            run_step(children, commands.evaluate(run_dir), f"evaluating {run_dir}", worker)
            unread = commands.evaluation(run_dir)  # (a loop of looks would otherwise evaluate it forever)
            if unread is not None:
                raise UserError(f"eval.py finished, but {unread.reason}; fix that and {RERUN}")
            evaluated_now += 1
            cost.record_step(run_dir, "eval", time.perf_counter() - start, device_env(0, 1), gpus)
            if progress:
                print(progress.line(), flush=True)
    finally:
        if worker is not None:
            worker.close()
    return trained_now, evaluated_now


def run_step(children, cmd, what, worker=None):
    """One step on the terminal (through `worker` when it can run it); a signal stops the comparison
    with the step's exit status."""
    print(f"$ {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    # in the caller's directory (relative run paths mean the same), with the threads of a one-job slot
    # set (all the cores, torch's default): a busy-cores warning of train.py is for a user who started
    # it, not for a step of this comparison
    if worker is not None and can_run(cmd):
        status = worker.run(cmd)
    else:
        status = children.run(cmd, env=device_env(0, 1))
    children.check_stopped(f"{what} stopped (exit {status})", status)
    if status != 0:
        raise UserError(f"{what} failed (exit {status}); fix the error above and {RERUN}")


def run_parallel(todo, commands, jobs, children, progress=None):
    """Train and evaluate `todo` [(tag, run_dir, overrides, trained)] with `jobs` runs at once, each
    in its slot's environment (device_env) with its output in RUN_DIR/compare.log.
    Returns (trained, evaluated); UserError naming every failed run at the end (StoppedBySignal,
    with the first stopped child's exit code, once every child has saved after a signal)."""
    slots = list(range(jobs))
    workers = {slot: WorkerSlot(children, device_env(slot, jobs)) for slot in slots}  # started when used
    gpus = slot_env.count_gpus() > 0
    lock = threading.Lock()
    counts = {"trained": 0, "evaluated": 0}
    failures, stopped = [], []

    def say(msg):
        with lock:
            print(msg, flush=True)

    def one(item):
        tag, run_dir, overrides, trained = item
        if children.stopped:
            return
        with lock:
            slot = slots.pop(0)
        if progress:
            progress.started(tag)
        try:
            env = workers[slot].env
            pinned = {k: env[k] for k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS") if k in env}
            log = os.path.join(run_dir, rundir.COMPARE_LOG)
            steps = ([("training", commands.train(overrides))] if not trained else []) \
                + [("evaluating", commands.evaluate(run_dir))]
            with writing(log):
                ensure_folder(run_dir)
                out = open(log, "a")
            with out:
                for what, cmd in steps:
                    say(f"{tag}: {what} (slot {slot}, {' '.join(f'{k}={v}' for k, v in pinned.items())}; log {log})")
                    out.write(f"$ {' '.join(shlex.quote(c) for c in cmd)}\n")
                    out.flush()
                    start = time.perf_counter()
                    if can_run(cmd):  # one Python start per slot, not two per run (comparison/worker.py)
                        status = workers[slot].run(cmd, log)
                    else:
                        status = children.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
                    if children.stopped:
                        with lock:
                            stopped.append((f"{run_dir} ({what} exit {status}; see {log})", status))
                        return
                    if status != 0:
                        with lock:
                            failures.append(f"{run_dir} ({what} exit {status}; see {log})")
                        return
                    if what == "training" and not is_trained(run_dir):
                        with lock:
                            failures.append(f"{run_dir} (train.py wrote no summary.json; see {log})")
                        return
                    unread = commands.evaluation(run_dir) if what == "evaluating" else None
                    if unread is not None:
                        with lock:
                            failures.append(f"{run_dir} (eval.py finished, but {unread.reason}; see {log})")
                        return
                    cost.record_step(run_dir, "train" if what == "training" else "eval", time.perf_counter() - start,
                                     env, gpus)  # the step's wall time on its slot: the next plan's estimate
                    with lock:
                        counts["trained" if what == "training" else "evaluated"] += 1
            say(f"{tag}: done" + (f"; {progress.line(tag)}" if progress else ""))
        finally:
            with lock:
                slots.append(slot)

    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, todo))
    finally:
        for worker in workers.values():
            worker.close()
    if stopped:
        children.check_stopped(f"stopped {'; '.join(s for s, _ in stopped)}",
                               next((code for _, code in stopped if code), 0))
    children.check_stopped("stopped between runs")
    if failures:
        raise UserError(f"{len(failures)} run(s) failed: {'; '.join(failures)}; fix and {RERUN}")
    return counts["trained"], counts["evaluated"]
