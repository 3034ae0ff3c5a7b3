#!/usr/bin/env python
"""The cost of a teacher per training step (train.distill) and the saving of a linear probe
(model.freeze=backbone), against the plain step of the same model measured in the same run.

Each variant is a train.py run set up in a temporary directory (training/run.py's setup) on
the built-in data; train.py's own train_step (training/train_step.py) runs on the same pre-drawn
batches. Steps of all variants are interleaved in a new shuffled order each round and the median is
reported, so the ratios hold on a shared machine. On
CPU the time is the process CPU time at one thread (other processes do not inflate it); on CUDA
wall time around synchronised steps. The teacher is the student's architecture (the cheapest
teacher worth having: the ratio to the plain step is then about 1 + forward / (forward + backward)),
or --teacher-model for a bigger one.

    python scripts/bench_distill.py [--quick] [--model resmlp_tiny] [--teacher-model NAME] [--batch 64]
"""
import argparse
import os
import random
import statistics
import tempfile
import time

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

import torch
from accelerate.state import AcceleratorState, GradientState
from safetensors.torch import save_file

import configs
from configs.schema import HeadConfig, ModelConfig
from models import create_classifier
from training.run import setup
from training.train_step import train_step


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="3 rounds of 3 steps")
    p.add_argument("--model", default="resmlp_tiny")
    p.add_argument("--teacher-model", default=None, help="the teacher's architecture (default: the student's)")
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=5, help="steps per variant per round")
    p.add_argument("--head", default="softmax")
    return p.parse_args(argv)


def write_weights(path, model_name, image_size, num_classes=10):
    torch.manual_seed(1)
    net = create_classifier(ModelConfig(name=model_name), HeadConfig(), num_classes, img_size=image_size)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, path)


def variants(args, tmp):
    student = os.path.join(tmp, "student.safetensors")
    write_weights(student, args.model, args.image_size)
    teacher = student
    if args.teacher_model:
        teacher = os.path.join(tmp, "teacher.safetensors")
        write_weights(teacher, args.teacher_model, args.image_size)
    kd = [f"train.teacher={teacher}"] if not args.teacher_model else [
        f"train.teacher={args.teacher_model}", f"train.teacher_weights={teacher}"]
    return {
        "plain": [],
        "distill soft": ["train.distill=soft", "train.distill_tau=2", *kd],
        "distill hard": ["train.distill=hard", *kd],
        "probe (frozen backbone)": [f"model.pretrained={student}", "model.freeze=backbone"],
    }


def build_run(args, tmp, name, overrides):
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    data = {
        "name": "bench", "model": {"name": args.model}, "head": {"name": args.head},
        "data": {"dataset": "builtin10", "image_size": args.image_size, "batch_size": args.batch, "num_workers": 0,
                 "builtin_train_size": args.batch * 8, "builtin_val_size": 64},
        "optim": {"epochs": 1000, "warmup_epochs": 0},
        "train": {"output_dir": os.path.join(tmp, name.split()[0] + name.split()[-1]), "log_every": 10 ** 6,
                  "save_every": 10 ** 6, "log_with": "none", "progress": False, "ema": False, "compile": "false"},
    }
    configs.loader.apply_overrides(data, overrides)
    run = setup(configs.config_from_dict(data), resume=None, overwrite=False)
    run.lock.release()
    run.learner.model.train()
    batches = [tuple(t.clone() for t in b) for _, b in zip(range(4), run.train_loader(0, 0))]
    return run, batches


def timed_steps(run, batches, steps, device):
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = clock()
    for i in range(steps):
        train_step(run, iter([batches[i % len(batches)]]))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (clock() - t0) / steps


def main(argv=None):
    args = parse_args(argv)
    if args.quick:
        args.rounds, args.steps = 3, 3
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        runs = {name: build_run(args, tmp, name, o) for name, o in variants(args, tmp).items()}
        device = next(iter(runs.values()))[0].accelerator.device
        for run, batches in runs.values():  # warm-up: optimizer state, allocator
            timed_steps(run, batches, 2, device)
        times = {name: [] for name in runs}
        for _ in range(args.rounds):
            order = list(runs)
            random.shuffle(order)
            for name in order:
                times[name].append(timed_steps(*runs[name], args.steps, device))
    anchor = statistics.median(times["plain"])
    teacher = args.teacher_model or args.model
    print(f"{args.model} student, {teacher} teacher, batch {args.batch}, {args.image_size} px, head {args.head}, "
          f"{device.type}{' (CPU time, 1 thread)' if device.type == 'cpu' else ''}; median of {args.rounds} rounds")
    print(f"{'variant':<26}{'ms/step':>10}{'÷ plain':>10}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<26}{1000 * med:>10.1f}{med / anchor:>10.2f}")


if __name__ == "__main__":
    main()
