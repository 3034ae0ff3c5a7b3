"""Train a ResMLP classifier with a swappable output head (softmax / sparsemax / entmax).

    python train.py --config configs/quickstart.yaml [key.sub=value ...] [--resume auto|PATH] [--overwrite]
    accelerate launch --multi_gpu --num_processes 8 train.py --config configs/imagenet/resmlp_s12.yaml
    accelerate launch --num_machines 2 --machine_rank R --main_process_ip HOST ... train.py ...

Accelerate owns devices, distribution (DDP), mixed precision (train.mixed_precision: no | bf16 |
fp16) and gradient accumulation (train.grad_accum). The run directory (train.output_dir) gets
config.yaml, metrics.jsonl, epochs.csv, model.safetensors, model_ema.safetensors, summary.json,
checkpoints/ and TensorBoard logs (see engine/checkpoint.py).

Exact resume: the training loader is NOT passed through `accelerator.prepare` (its re-sharding
replays the wrong samples mid-epoch); `data.build_train_loader` is already deterministic per
(seed, epoch, position) and sharded per rank, and restarts at any batch. Every random draw of a
step (drop path, Mixup/CutMix, ...) comes from RNGs reseeded from (seed, step, micro-batch, rank),
so a run killed at any step and resumed from its last checkpoint ends bit-identical (CPU).

Fault-injection hooks (for tests; documented here because they are environment variables):
    RESMLP_INJECT_NAN_AT_STEP=N   the loss of optimizer update N (0-based) is made NaN
    RESMLP_KILL_DURING_SAVE=N     SIGKILL in the middle of writing the checkpoint of step N
    RESMLP_STEP_DELAY_S=X         sleep X seconds after each update (lets a test kill mid-epoch)
"""
import argparse
import math
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.abspath(__file__))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine.cli import run_cli  # noqa: E402
from common.errors import UserError  # noqa: E402

EXIT_NONFINITE = 3


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Overrides: key.sub=value (value parsed as YAML), e.g. optim.lr=1e-3 head.name=sparsemax",
    )
    parser.add_argument("--config", required=True, help="YAML config (may extend another with base:)")
    parser.add_argument("--resume", default=None, metavar="auto|PATH",
                        help="'auto': latest valid checkpoint of the run directory (fresh start if none); or a checkpoint path")
    parser.add_argument("--overwrite", action="store_true", help="start over in a run directory that has checkpoints")
    args, rest = parser.parse_known_args(argv)
    bad = [r for r in rest if "=" not in r]
    if bad:
        raise UserError(f"unexpected argument '{bad[0]}': overrides look like key.sub=value, options are --config/--resume/--overwrite")
    args.overrides = rest
    return args


def main(argv=None):
    args = parse_args(argv)
    import configs

    cfg = configs.load_config(args.config, args.overrides)
    return train(cfg, resume=args.resume, overwrite=args.overwrite)


def fingerprint(cfg, num_classes):
    """What a checkpoint must share with the config to be resumable."""
    return {
        "model.name": cfg.model.name, "model.norm": cfg.model.norm, "model.img_size": cfg.model.img_size,
        "head.name": cfg.head.name, "head.alpha": cfg.head.alpha, "head.learn_alpha": cfg.head.learn_alpha,
        "num_classes": num_classes,
    }


def _build_accelerator(cfg, run_dir):
    import torch
    from accelerate import Accelerator

    from engine.logging import tensorboard_available

    if cfg.train.mixed_precision == "fp16" and not torch.cuda.is_available():
        raise UserError("train.mixed_precision=fp16 needs a CUDA GPU; use bf16 (or no) on CPU")
    use_tb = cfg.train.tensorboard and tensorboard_available()
    # Accelerate only sets up gloo multi-process training on CPU when asked for the CPU explicitly.
    cpu_multi_process = not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1
    accelerator = Accelerator(
        cpu=cpu_multi_process,
        mixed_precision=cfg.train.mixed_precision,
        gradient_accumulation_steps=cfg.train.grad_accum,
        log_with="tensorboard" if use_tb else None,
        project_dir=run_dir,
    )
    return accelerator, use_tb


def _prepare_run_dir(cfg, run_dir, resume, overwrite, accelerator, say, fp, global_batch):
    """Resolve the checkpoint to resume from and check it fits this config (before anything in the
    run dir is touched); on a fresh start, clear (or refuse to clear) the run dir."""
    import configs
    from engine import checkpoint as ck

    ckpt = ck.resolve_resume(resume, run_dir, warn=say)
    if ckpt is not None:
        saved = ck.read_trainer_state(ckpt)
        ck.check_fingerprint(saved.get("fingerprint", {}), fp, ckpt)
        if saved.get("global_batch") != global_batch:
            raise UserError(f"checkpoint {ckpt} was trained with a global batch of {saved.get('global_batch')}, this "
                            f"launch has {global_batch} (batch_size x processes x grad_accum); keep it equal to resume")
    else:
        existing = ck.list_checkpoints(os.path.join(run_dir, ck.CHECKPOINT_SUBDIR))
        if existing and resume is None and not overwrite:
            raise UserError(f"{run_dir} already holds checkpoints: pass --resume auto to continue that run, "
                            f"--overwrite to start over, or set train.output_dir")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        os.makedirs(run_dir, exist_ok=True)
        if ckpt is None:
            shutil.rmtree(os.path.join(run_dir, ck.CHECKPOINT_SUBDIR), ignore_errors=True)
            for name in ("metrics.jsonl", "epochs.csv", "summary.json", "model.safetensors", "model_ema.safetensors"):
                if os.path.exists(os.path.join(run_dir, name)):
                    os.remove(os.path.join(run_dir, name))
        configs.save_config(cfg, os.path.join(run_dir, "config.yaml"))
    accelerator.wait_for_everyone()
    return ckpt


def train(cfg, resume=None, overwrite=False):
    """Run (or resume) the training described by `cfg`; returns the process exit status."""
    import torch
    from timm.utils import ModelEmaV3
    from tqdm import tqdm

    import data as data_lib
    from engine import checkpoint as ck
    from evaluation.evaluate import evaluate
    from engine.logging import EpochCSV, MetricsLog, console, format_eval
    from engine.optim import build_optimizer, build_scheduler
    from engine.rng import capture_rng_state, reseed, restore_rng_state
    from models import create_classifier

    # A guard, not a measured fix: arithmetic on denormal floats is slow on CPUs, and flushing them
    # to zero costs nothing (a census of one training step per head found none; the sparse-head
    # slowdowns first blamed on them came from other jobs sharing the cores). Deterministic either way.
    torch.set_flush_denormal(True)
    run_dir = cfg.train.output_dir
    accelerator, use_tb = _build_accelerator(cfg, run_dir)
    main_proc = accelerator.is_main_process
    rank, world = accelerator.process_index, accelerator.num_processes
    device = accelerator.device

    def say(msg):
        console(msg, main_proc)

    seed, accum = cfg.train.seed, cfg.train.grad_accum
    global_batch = cfg.data.batch_size * world * accum
    num_classes = data_lib.num_classes(cfg.data)
    fp = fingerprint(cfg, num_classes)
    ckpt = _prepare_run_dir(cfg, run_dir, resume, overwrite, accelerator, say, fp, global_batch)
    metrics = MetricsLog(run_dir, enabled=main_proc)
    epochs_csv = EpochCSV(run_dir, enabled=main_proc)

    # ---------------------------------------------------------------- data
    with accelerator.main_process_first():  # downloads / dataset caches are written once
        train_set = data_lib.build_dataset(cfg.data, "train")
        val_set = data_lib.build_dataset(cfg.data, "val")

    def train_loader(epoch, start_batch):
        reseed(seed, "loader", epoch, rank)
        return data_lib.build_train_loader(train_set, cfg.data, seed=seed, epoch=epoch, rank=rank, world_size=world,
                                           start_batch=start_batch, device=device)

    batches_per_epoch = len(train_loader(0, 0))
    updates_per_epoch = batches_per_epoch // accum
    if updates_per_epoch < 1:
        raise UserError(f"the training split has {batches_per_epoch} batches per process per epoch, fewer than "
                        f"train.grad_accum={accum}: lower data.batch_size or train.grad_accum")
    val_loader = data_lib.build_eval_loader(val_set, cfg.data, rank=rank, world_size=world, device=device)
    mixup = data_lib.build_mixup(cfg.data, num_classes)
    # Mixup/CutMix already fold label smoothing into their soft targets: never apply it twice.
    label_smoothing = 0.0 if mixup is not None else cfg.data.label_smoothing

    # ---------------------------------------------------------------- model, optimizer, EMA
    reseed(seed, "init")
    raw_model = create_classifier(cfg.model, cfg.head, num_classes)
    optimizer = build_optimizer(raw_model, cfg.optim, global_batch)
    scheduler = build_scheduler(optimizer, cfg.optim, updates_per_epoch)  # stepped by us per update
    model = torch.compile(raw_model) if cfg.train.compile else raw_model
    model, optimizer = accelerator.prepare(model, optimizer)
    head = raw_model.output_head
    ema = ModelEmaV3(raw_model, decay=cfg.train.ema_decay) if cfg.train.ema else None

    state = {"step": 0, "epoch": 0, "batch": 0, "best_top1": None, "best_step": None, "skipped": 0,
             "train_time_s": 0.0, "images": 0, "last_eval": {}, "last_ckpt": None}
    if ckpt is not None:
        saved = ck.read_trainer_state(ckpt)
        ck.load_state_dict_strict(raw_model, ck.load_weights(os.path.join(ckpt, "model.safetensors")), ckpt)
        if ema is not None and os.path.isfile(os.path.join(ckpt, "ema.safetensors")):
            ck.load_state_dict_strict(ema.module, ck.load_weights(os.path.join(ckpt, "ema.safetensors")), ckpt)
        optimizer.load_state_dict(ck.load_torch(os.path.join(ckpt, "optimizer.pt")))
        scheduler.load_state_dict(ck.load_torch(os.path.join(ckpt, "scheduler.pt")))
        scaler_state = ck.load_torch(os.path.join(ckpt, "scaler.pt"))
        if scaler_state is not None and accelerator.scaler is not None:
            accelerator.scaler.load_state_dict(scaler_state)
        rng_state = ck.load_rng(ckpt, rank)
        if rng_state is not None:
            restore_rng_state(rng_state)
        for key in state:
            if key in saved:
                state[key] = saved[key]
        state["last_ckpt"] = ckpt
        metrics.truncate_after(state["step"])  # rows after the checkpoint are re-logged exactly once
        epochs_csv.truncate_after(state["step"])
        say(f"resumed from {ckpt} (step {state['step']}, epoch {state['epoch'] + 1}, batch {state['batch']})")

    if use_tb:
        accelerator.init_trackers("tensorboard")

    # ---------------------------------------------------------------- helpers
    def save_checkpoint(epoch, batch):
        root = os.path.join(run_dir, ck.CHECKPOINT_SUBDIR)
        step = state["step"]
        if main_proc:
            ck.begin_save(root, step)
        accelerator.wait_for_everyone()
        ck.write_rank_files(ck.tmp_dir_for(root, step), rank, capture_rng_state())
        if main_proc:
            trainer_state = {k: v for k, v in state.items() if k != "last_ckpt"}
            trainer_state.update(epoch=epoch, batch=batch, fingerprint=fp, global_batch=global_batch,
                                 world_size=world, config_name=cfg.name)
            ck.write_main_files(
                ck.tmp_dir_for(root, step),
                model_state=raw_model.state_dict(),
                ema_state=ema.module.state_dict() if ema is not None else None,
                optimizer_state=optimizer.state_dict(),
                scheduler_state=scheduler.state_dict(),
                scaler_state=accelerator.scaler.state_dict() if accelerator.scaler is not None else None,
                trainer_state=trainer_state,
            )
        accelerator.wait_for_everyone()
        if main_proc:
            state["last_ckpt"] = ck.commit_save(root, step)
            ck.prune(root, cfg.train.keep_last, keep_steps=[state["best_step"]])
        accelerator.wait_for_everyone()

    def export_weights():
        if main_proc:
            ck.save_weights(raw_model.state_dict(), os.path.join(run_dir, "model.safetensors"))
            if ema is not None:
                ck.save_weights(ema.module.state_dict(), os.path.join(run_dir, "model_ema.safetensors"))

    def all_finite(loss):
        ok = torch.isfinite(loss.detach()).float().reshape(1)
        if world > 1:  # every rank must take the same branch (DDP collectives)
            ok = accelerator.reduce(ok, reduction="sum") / world
        return bool(ok.item() == 1.0)

    inject_nan_at = int(os.environ.get("RESMLP_INJECT_NAN_AT_STEP", "-1"))
    step_delay = float(os.environ.get("RESMLP_STEP_DELAY_S", "0") or 0)

    # ---------------------------------------------------------------- loop
    epochs = cfg.optim.epochs
    total_updates = epochs * updates_per_epoch
    bar = tqdm(total=total_updates, initial=state["step"], disable=not (main_proc and cfg.train.progress),
               dynamic_ncols=True, unit="step", file=sys.stdout)
    model.train()
    window_t, window_imgs = time.perf_counter(), 0
    session_t0 = time.perf_counter()
    time_base = state["train_time_s"]
    while state["epoch"] < epochs:
        epoch = state["epoch"]
        loader_iter = iter(train_loader(epoch, state["batch"]))
        epoch_t0, epoch_loss_sum, epoch_updates = time.perf_counter(), 0.0, 0
        for _ in range(state["batch"] // accum, updates_per_epoch):
            step = state["step"]
            scheduler.step_update(step)  # lr of this update: warmup + cosine indexed by update
            lr = optimizer.param_groups[0]["lr"]
            skip, loss_sum = False, 0.0
            for micro in range(accum):
                reseed(seed, "step", step, micro, rank)
                images, labels = next(loader_iter)
                targets = labels
                if mixup is not None:
                    images, targets = mixup(images, labels)
                with accelerator.accumulate(model):
                    logits = model(images)
                    loss = head.loss(logits.float(), targets, label_smoothing=label_smoothing)  # fp32 loss
                    if step == inject_nan_at:
                        loss = loss * float("nan")
                    if not all_finite(loss):
                        if cfg.train.nonfinite == "stop":
                            bar.close()
                            where = f"step {step} (epoch {epoch + 1}, batch {state['batch'] + micro})"
                            kept = state["last_ckpt"] or "none yet"
                            if main_proc:
                                print(f"error: non-finite loss ({loss.item()}) at {where}; training stopped. Last good "
                                      f"checkpoint: {kept}. Lower optim.lr, set optim.clip_grad, or set "
                                      f"train.nonfinite=skip", file=sys.stderr, flush=True)
                            accelerator.end_training()
                            return EXIT_NONFINITE
                        skip = True
                    if not skip:
                        accelerator.backward(loss)
                        loss_sum += loss.detach().item()
                    if accelerator.sync_gradients:
                        if not skip:
                            if cfg.optim.clip_grad:
                                accelerator.clip_grad_norm_(model.parameters(), cfg.optim.clip_grad)
                            optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
            state["step"] = step = step + 1
            state["batch"] += accum
            if skip:
                state["skipped"] += 1
                if main_proc:
                    console(f"warning: non-finite loss at step {step - 1}: update skipped ({state['skipped']} so far)")
            elif ema is not None:
                ema.update(raw_model, step=step)
            window_imgs += global_batch
            state["images"] += global_batch
            mean_loss = loss_sum / accum if not skip else float("nan")
            if not skip:
                epoch_loss_sum += mean_loss
                epoch_updates += 1
            if step_delay:
                time.sleep(step_delay)
            if step % cfg.train.log_every == 0:
                loss_t = torch.tensor([mean_loss if not skip else 0.0], device=device)
                if world > 1:
                    loss_t = accelerator.reduce(loss_t, reduction="mean")
                now = time.perf_counter()
                ips = window_imgs / max(now - window_t, 1e-9)
                window_t, window_imgs = now, 0
                row = {"kind": "train", "step": step, "epoch": epoch + 1, "loss": loss_t.item() if not skip else mean_loss,
                       "lr": lr, "img_per_s": ips, "skipped": state["skipped"]}
                metrics.write(**row)
                if use_tb:
                    accelerator.log({"train/loss": row["loss"], "train/lr": lr, "train/img_per_s": ips}, step=step)
                bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{lr:.2e}", img_s=f"{ips:.0f}", refresh=False)
            bar.update(1)
            state["train_time_s"] = time_base + time.perf_counter() - session_t0
            if step % cfg.train.save_every == 0 and state["batch"] // accum < updates_per_epoch:
                save_checkpoint(epoch, state["batch"])

        # ------------------------------------------------------------ epoch end
        state["epoch"], state["batch"] = epoch + 1, 0
        epoch_time = time.perf_counter() - epoch_t0
        loss_stats = torch.tensor([epoch_loss_sum, float(epoch_updates)], dtype=torch.float64, device=device)
        if world > 1:
            loss_stats = accelerator.reduce(loss_stats, reduction="sum")
        row = {"epoch": epoch + 1, "step": state["step"],
               "train_loss": loss_stats[0].item() / max(loss_stats[1].item(), 1.0),
               "lr": optimizer.param_groups[0]["lr"],
               "img_per_s": epoch_updates * global_batch / max(epoch_time, 1e-9),
               "time_s": epoch_time, "skipped": state["skipped"]}
        line = (f"epoch {epoch + 1}/{epochs}  step {state['step']}  loss {row['train_loss']:.4f}  "
                f"lr {row['lr']:.2e}  {row['img_per_s']:.0f} img/s")
        if (epoch + 1) % cfg.train.eval_every == 0 or epoch + 1 == epochs:
            evals = {"raw": evaluate(model, val_loader, accelerator)}
            if ema is not None:
                evals["ema"] = evaluate(ema.module, val_loader, accelerator)
            for weights, m in evals.items():
                metrics.write(kind="eval", step=state["step"], epoch=epoch + 1, weights=weights, **m)
                row.update({f"{weights}_{k}": v for k, v in m.items()})
                line += f"  | {weights}: {format_eval(m)}"
                if use_tb:
                    accelerator.log({f"val_{weights}/{k}": v for k, v in m.items() if k != "n"}, step=state["step"])
            state["last_eval"] = evals
            if state["best_top1"] is None or evals["raw"]["top1"] > state["best_top1"]:
                state["best_top1"], state["best_step"] = evals["raw"]["top1"], state["step"]
        epochs_csv.write(row)
        say(line)
        state["train_time_s"] = time_base + time.perf_counter() - session_t0
        export_weights()
        save_checkpoint(epoch + 1, 0)
    bar.close()

    # ---------------------------------------------------------------- summary
    if main_proc:
        if not os.path.exists(os.path.join(run_dir, "model.safetensors")):
            export_weights()
        summary = {
            "final": state["last_eval"],
            "train_time_s": state["train_time_s"],
            "img_per_s": state["images"] / max(state["train_time_s"], 1e-9),
            "epochs": epochs, "steps": state["step"], "skipped_steps": state["skipped"],
            "best": {"top1": state["best_top1"], "step": state["best_step"]},
            "global_batch": global_batch, "num_processes": world,
        }
        ck.write_json(summary, os.path.join(run_dir, "summary.json"))
        final = state["last_eval"].get("ema" if "ema" in state["last_eval"] else "raw") or {}
        top1 = 100 * final.get("top1", float("nan"))
        say(f"done: {state['step']} steps in {state['train_time_s']:.1f}s; final val top1 "
            f"{100 * state['last_eval'].get('raw', {}).get('top1', math.nan):.2f}% (raw)"
            + (f", {top1:.2f}% (ema)" if "ema" in state["last_eval"] else "") + f"; run dir {run_dir}")
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    run_cli(main)
