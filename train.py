"""Train a ResMLP classifier with a swappable output head (softmax / sparsemax / entmax).

    python train.py --config configs/quickstart.yaml [key.sub=value ...] [--resume auto|PATH] [--overwrite]
    python train.py --help-config [--config FILE] [key.sub=value ...]   # every config key, or FILE resolved
    accelerate launch --multi_gpu --num_processes 8 train.py --config configs/imagenet/resmlp_s12.yaml
    accelerate launch --num_machines 2 --machine_rank R --main_process_ip HOST ... train.py ...

Accelerate owns devices, distribution (DDP), mixed precision (train.mixed_precision: no | bf16 |
fp16) and gradient accumulation (train.grad_accum). The run directory (train.output_dir) gets
config.yaml, metrics.jsonl, epochs.csv, model.safetensors, model_ema.safetensors, summary.json,
checkpoints/ and TensorBoard logs (see training/checkpoint/files.py).

This file is the command line; the loop is training/loop.py and reads top to bottom: `setup`
builds the run (training/run.py: accelerator, run dir, data, model, optimizer, schedule, EMA,
resume), `train_step` does one optimizer update (training/train_step.py), `end_of_epoch` evaluates,
exports the weights and checkpoints, `write_summary` closes the run. Checkpoints are saved and
restored in training/checkpoint/ (save.py, restore.py; the files: files.py; the trainer state: state.py).

Exact resume: the training loader is NOT passed through `accelerator.prepare` (its re-sharding
replays the wrong samples mid-epoch); `data.build_train_loader` is already deterministic per
(seed, epoch, position) and sharded per rank, and restarts at any batch. Every random draw of a
step (drop path, Mixup/CutMix, ...) comes from RNGs reseeded from (seed, step, micro-batch, rank),
so a run killed at any step and resumed from its last checkpoint ends bit-identical (CPU).

GPU-first: between log steps the loop never waits on the device. The step's loss, the epoch's
loss sum and the first non-finite step stay on the device and are read at log steps, checkpoint
saves and epoch ends only; under train.nonfinite=stop the run can therefore go on for up to
min(train.log_every, train.save_every) - 1 updates past a non-finite loss before it stops, naming
the first bad update and never saving its weights. train.nonfinite=skip must decide before each
optimizer step, so it reads one flag per update (one device sync per update: a documented cost).
train.compile compiles the forward together with the head's loss (auto: on for CUDA).

Run safety (the run directory is never lost or mixed):
- Before torch loads (training/start_checks.py: by looking, nothing created), the refusals below that
  need neither torch nor the data are one line at once: a train.output_dir that cannot be written
  (exit 74), a live run holding its lock, a run already there without --resume or --overwrite,
  --resume with --overwrite, a source inside the run directory. They are asked again where they decide.
- Run lock: the main process holds RUN_DIR/run.lock (common/runlock.py) from before the first
  look at the directory to the end; a second run gets one line naming the holder. Leftover temp
  files of killed saves are removed under the lock at start.
- Fresh start: a directory that holds a run (weights, logs, summary, checkpoints) is refused
  unless --overwrite (which lists what it deletes); `--resume auto` without a complete checkpoint
  refuses too, unless the directory holds no run.
- Resume: the checkpoint stores the whole resolved config; any change outside
  training.resume_policy.RESUME_ALLOWLIST is refused in one line, or applied for real with
  --resume-with-changes (a new lr/epochs rebuilds the schedule from the current update; the change
  is recorded in metrics.jsonl and in config_history.yaml beside config.yaml). Invalid checkpoints are skipped
  with a warning (sha256 in COMPLETE.json). The epoch's partial loss sums travel in the
  checkpoint in world-independent units (per update, not per rank; the position in updates), so
  epochs.csv is exact after a mid-epoch resume, on another number of processes too.
- Preemption (training/preemption.py): SIGTERM / SIGINT / SIGUSR1 stop the run at the next agreed
  update boundary with a complete checkpoint, exit 143 / 130 / 138; a second signal exits at once
  (137). One process: the flag is a Python bool read after each update. Several: the ranks agree
  every train.log_every updates (and after each epoch end) through one all-reduce on a CPU gloo
  group, never a device read.
- A failed write (disk full, ...) is one line and exit 74 on every rank; the previous checkpoint
  stays intact. train.nonfinite=skip gives up (exit 3) once more than train.max_skipped_fraction
  of the last SKIP_WINDOW updates were skipped; pruning keeps the newest checkpoint saved with
  finite losses.

Exit codes: 0 done; 2 a refused input or start (one line); 3 non-finite loss; 74 a write failed;
130 / 138 / 143 stopped by SIGINT / SIGUSR1 / SIGTERM after saving; 137 a second signal.

Tests inject faults through `main(argv, hooks=...)` or `train(cfg, hooks=...)` (training/loop.py): an
object with `on_loss(step, loss) -> loss` and `after_update(step)` (tests/hooked_train.py); production
passes None and only checks for None.
"""
import argparse

import configs  # (neither torch nor timm: the command line and the config are checked before they load)
from common.cli import run_cli
from common.startup import say_loading
from configs.overrides import parse_command_line
from training import resume_policy as rp
from training.start_checks import check_start


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Overrides: key.sub=value or --key.sub VALUE (value parsed as YAML), e.g. optim.lr=1e-3 "
               "head.name=sparsemax; "
               "python train.py --help-config lists every key",
    )
    parser.add_argument("--config", help="YAML config (may extend another with base:); a run's config.yaml works")
    parser.add_argument("--help-config", action="store_true",
                        help="print every config key with its type, default, range or choices and meaning (with "
                             "--config: that config resolved) and exit")
    parser.add_argument("--resume", default=None, metavar="auto|PATH",
                        help="'auto': newest valid checkpoint of the run directory (a fresh start only when the "
                             "directory holds no run); or a checkpoint path")
    parser.add_argument(rp.RESUME_FLAG, dest="resume_with_changes", action="store_true",
                        help="resume although the config differs from the checkpoint's (outside the keys that may "
                             "change freely); the changes apply from the checkpoint's step and are recorded")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in a run directory that holds a run, deleting it (lists what it deletes)")
    args = parse_command_line(parser, argv, tool="python train.py")
    if args.config is None and not args.help_config:
        parser.error("the following arguments are required: --config")
    return args


def main(argv=None, hooks=None):
    args = parse_args(argv)
    if args.help_config:
        print(configs.config_help(args.config, args.overrides))
        return 0
    cfg = configs.load_config(args.config, args.overrides)
    check_start(cfg, args.resume, args.overwrite)  # the run directory's refusals, before torch's seconds
    say_loading("train.py")
    from training.loop import train  # heavy: torch, timm and Accelerate (seconds), after the checks

    return train(cfg, resume=args.resume, overwrite=args.overwrite, hooks=hooks,
                 accept_changes=args.resume_with_changes)


if __name__ == "__main__":
    run_cli(main)
