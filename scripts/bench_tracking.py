"""What a tracker costs per logged step: a training step of resmlp_tiny that logs every step (train
loss, lr, throughput, as train.py does at train.log_every=1) with each tracker through Accelerate,
against the same step with no tracker, measured in the same run.

    python scripts/bench_tracking.py [--steps 200] [--trackers tensorboard mlflow] [--batch 32]

Prints, per tracker: seconds per step, the ratio to no tracker (the anchor) and the extra
milliseconds per logged step. MLflow writes to a fresh SQLite store in a temporary folder (its
offline default); TensorBoard to event files there. A missing tracker package is skipped, named.
"""
import argparse
import os
import tempfile
import time

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import ProjectConfiguration

from configs.schema import HeadConfig, ModelConfig
from models import create_classifier
from training.trackers import installed, quiet_mlflow


def make_step(batch):
    torch.manual_seed(0)
    model = create_classifier(ModelConfig(name="resmlp_tiny"), HeadConfig(), 10, img_size=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def step():
        loss = model.output_head.loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def time_tracker(name, steps, batch, folder):
    """Seconds per logged step with tracker `name` ('none': no tracker)."""
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    os.makedirs(folder, exist_ok=True)
    if name == "mlflow":
        os.environ["MLFLOW_TRACKING_URI"] = "sqlite:///" + os.path.join(folder, "mlflow.db")
        quiet_mlflow()
    accelerator = Accelerator(cpu=True, log_with=None if name == "none" else [name],
                              project_config=ProjectConfiguration(project_dir=folder, logging_dir=folder))
    accelerator.init_trackers(f"bench_{name}", config={"steps": steps, "batch": batch})
    step = make_step(batch)
    for _ in range(5):  # warm-up: allocator, first tracker writes
        step()
    start = time.perf_counter()
    for i in range(steps):
        loss = step()
        accelerator.log({"train/loss": float(loss), "train/lr": 1e-3, "train/img_per_s": 1.0}, step=i)
    seconds = (time.perf_counter() - start) / steps
    accelerator.end_training()
    return seconds


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--trackers", nargs="+", default=["tensorboard", "mlflow"])
    args = p.parse_args(argv)

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    with tempfile.TemporaryDirectory() as folder:
        anchor = time_tracker("none", args.steps, args.batch, folder)
        print(f"no tracker (anchor): {anchor * 1e3:.2f} ms per step, resmlp_tiny, batch {args.batch}, "
              f"{args.steps} steps, a log every step")
        for name in args.trackers:
            if not installed(name):
                print(f"{name}: not installed (pip install {name}), skipped")
                continue
            seconds = time_tracker(name, args.steps, args.batch, os.path.join(folder, name))
            print(f"{name}: {seconds * 1e3:.2f} ms per step = {seconds / anchor:.3f}x the anchor "
                  f"({(seconds - anchor) * 1e3:+.2f} ms per logged step)")


if __name__ == "__main__":
    main()
