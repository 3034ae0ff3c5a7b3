"""What the launch actually gave this run, said in the run's first log lines.

A launch can quietly differ from what the user asked for: `accelerate launch --num_processes 2`
without `--multi_gpu` on a CPU machine starts one process (with twice the steps), and `accelerate
launch` prints "`--mixed_precision` was set to a value of 'no'" although the config's
`train.mixed_precision` is what the Accelerator uses. These lines say what runs, and why.
"""
import os

# Set by `accelerate launch` for every script it starts (accelerate/utils/launch.py).
LAUNCH_PRECISION_ENV = "ACCELERATE_MIXED_PRECISION"


def single_process_warning(num_processes, env=None, command="train.py"):
    """One warning line when `accelerate launch` was asked for several processes but this run got
    one; None otherwise. The launcher sets MASTER_PORT only when it was asked for more than one
    process, and WORLD_SIZE only when it actually started several."""
    env = os.environ if env is None else env
    asked_several = LAUNCH_PRECISION_ENV in env and "MASTER_PORT" in env and "WORLD_SIZE" not in env
    if num_processes > 1 or not asked_several:
        return None
    return ("warning: accelerate launch was asked for several processes but started one (it does all the work "
            "alone); on a CPU machine or a single GPU add --multi_gpu: accelerate launch --multi_gpu "
            f"--num_processes N {command} ... (python -m accelerate.commands.launch ... where the accelerate command "
            "is not on PATH, e.g. under pyenv before `pyenv rehash`)")


def precision_line(configured, used, env=None):
    """'precision: bf16 (train.mixed_precision)', noting when accelerate launch said otherwise."""
    env = os.environ if env is None else env
    line = f"precision: {used} (train.mixed_precision={configured})"
    launched = env.get(LAUNCH_PRECISION_ENV)
    if launched is not None and launched != used:
        line += (f"; accelerate launch's mixed_precision '{launched}' does not apply: the config's setting wins "
                 f"(the launcher's 'was set to a value of' notice can be ignored)")
    return line


def busy_cores_warning(device_type, threads, load=None, cores=None, env=None):
    """One line when a CPU run starts on cores that are already busy (1-minute load above the core
    count) with torch at its default threads (OMP_NUM_THREADS unset): its threads then fight the
    other jobs for the cores. None otherwise."""
    env = os.environ if env is None else env
    if device_type != "cpu" or "OMP_NUM_THREADS" in env or threads <= 1:
        return None
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # not on this platform
            return None
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if load <= cores:
        return None
    return (f"warning: the machine is already busy (load {load:.1f} on {cores} cores) and torch uses {threads} "
            f"threads, which then compete with the other jobs (about 2x slower than one thread, as measured in "
            f"docs/training.md, CPU threads); start it with OMP_NUM_THREADS=1")


def launch_lines(*, num_processes, device, configured_precision, used_precision, backend, backend_why,
                 env=None, threads=1):
    """The run's first log lines: processes and device, precision, data backend, and any warning."""
    lines = [f"launch: {num_processes} process(es) on {device.type}; "
             + precision_line(configured_precision, used_precision, env),
             f"data backend: {backend} ({backend_why})"]
    for warning in (single_process_warning(num_processes, env), busy_cores_warning(device.type, threads, env=env)):
        if warning:
            lines.append(warning)
    return lines
