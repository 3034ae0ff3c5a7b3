"""The environment of a --jobs slot: its share of the machine, so that N runs at once do not fight
over the same GPUs or oversubscribe the CPU cores."""
import os

import torch


def device_env(slot, jobs, environ=None, gpu_count=None, cpu_count=None):
    """Environment of job slot `slot` (0..jobs-1): with GPUs, CUDA_VISIBLE_DEVICES = the visible GPUs
    slot, slot+jobs, ... (round-robin; a slot shares one when there are fewer GPUs than jobs);
    without, OMP_NUM_THREADS = an equal share of the CPU cores (at least 1), never more than an
    OMP_NUM_THREADS the environment already sets (the user's cap is kept, not silently raised)."""
    env = dict(os.environ if environ is None else environ)
    gpu_count = count_gpus() if gpu_count is None else gpu_count
    if gpu_count > 0:
        visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()] \
            or [str(i) for i in range(gpu_count)]
        mine = visible[slot::jobs] or [visible[slot % len(visible)]]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    else:
        cpu_count = count_cores() if cpu_count is None else cpu_count
        share = max(1, cpu_count // jobs)
        asked = env.get("OMP_NUM_THREADS", "").strip()
        if asked.isdigit() and int(asked) >= 1:
            share = min(share, int(asked))
        env["OMP_NUM_THREADS"] = str(share)
    return env


def count_gpus():
    return torch.cuda.device_count()


def count_cores():
    """CPU cores this process may use (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
