"""One optimizer update of a training run (`train_step`) and what a non-finite loss does to it.

GPU-first: the step reads nothing from the device. Its loss, its finiteness and the first
non-finite update stay on the device (`run.losses`: training/run.py's DeviceLosses);
`stop_if_nonfinite` reads them, and training/loop.py calls it at log steps, saves and epoch ends only.
train.nonfinite=skip must decide before each optimizer step, so it reads one flag per update (the
one documented host read). Every random draw of a step comes from RNGs reseeded from (seed, step,
micro-batch, rank), so a resumed run replays it exactly.
"""
import torch

from training import resume_policy as rp
from training.checkpoint import files as ck
from training.logging import console
from training.rng import reseed

# train.max_skipped_fraction is measured over the last SKIP_WINDOW updates (train.nonfinite=skip).
SKIP_WINDOW = 100
NO_BAD_STEP = -1  # run.losses.first_bad_step while every update so far had a finite loss


class NonFiniteLoss(Exception):
    """A non-finite loss under train.nonfinite=stop (or too many skipped updates under skip); the
    message names the step and the newest verified checkpoint."""


def train_step(run, batches, hooks=None):
    """One optimizer update over train.grad_accum micro-batches, with no host read (but under
    train.nonfinite=skip, see the module docstring): the loss and its finiteness stay on the device."""
    cfg, state, accelerator, learner, losses = run.cfg, run.state, run.accelerator, run.learner, run.losses
    accum, step = cfg.train.grad_accum, state.step
    learner.scheduler.step_update(step + state.schedule_offset)  # lr of this update: warmup + cosine indexed by update
    micro_losses = []
    for micro in range(accum):
        reseed(cfg.train.seed, "step", step, micro, run.rank)
        images, targets = next(batches)
        if run.mixup is not None:
            images, targets = run.mixup(images, targets)
        with accelerator.accumulate(learner.model):
            loss = learner.forward_loss(images, targets)
            if hooks is not None:
                loss = hooks.on_loss(step, loss)
            micro_losses.append(loss.detach())
            accelerator.backward(loss)  # on every rank, finite or not: DDP's all-reduce needs them all
            if accelerator.sync_gradients:
                loss = torch.stack(micro_losses).mean()
                finite = torch.isfinite(loss)
                if cfg.train.nonfinite == "skip" and not finite_on_every_rank(run, finite):  # the one host read
                    finite = torch.zeros_like(finite)  # skipped on every rank: no rank counts it in the epoch's sums
                    learner.optimizer.zero_grad(set_to_none=True)
                    count_skipped_update(run, step)
                else:
                    if cfg.optim.clip_grad:
                        accelerator.clip_grad_norm_(learner.model.parameters(), cfg.optim.clip_grad)
                    learner.optimizer.step()
                    learner.optimizer.zero_grad(set_to_none=True)
                    if learner.ema is not None:
                        learner.ema.update(learner.raw_model, step=step + 1)
    losses.last = loss
    losses.epoch += torch.stack([torch.where(finite, loss, 0.0).double(), finite.double()])
    losses.first_bad_step = torch.where(finite | (losses.first_bad_step != NO_BAD_STEP), losses.first_bad_step, step)
    state.step += 1
    state.batch += accum
    state.images += run.global_batch


def finite_on_every_rank(run, finite):
    """Whether the loss is finite on every rank (all ranks must take the same branch)."""
    ok = finite.float().reshape(1)
    if run.world > 1:
        ok = run.accelerator.reduce(ok, reduction="sum") / run.world
    return bool(ok.item() == 1.0)


def count_skipped_update(run, step):
    """train.nonfinite=skip, after an update was skipped (host-only: the skip decision was read
    already). Raises NonFiniteLoss once more than train.max_skipped_fraction of the last
    SKIP_WINDOW updates were skipped (every rank took the same decision, so all raise together)."""
    state, limit = run.state, run.cfg.train.max_skipped_fraction
    state.skipped += 1
    state.recent_skips = [s for s in state.recent_skips if s > step - SKIP_WINDOW] + [step]
    if run.main_proc:
        console(f"warning: non-finite loss at step {step}: update skipped ({state.skipped} so far, "
                f"{len(state.recent_skips)} in the last {SKIP_WINDOW} updates)")
    if len(state.recent_skips) > limit * SKIP_WINDOW:
        raise NonFiniteLoss(
            f"{len(state.recent_skips)} of the last {SKIP_WINDOW} updates had a non-finite loss and were skipped "
            f"(train.max_skipped_fraction={limit:g}); training stopped at step {step} and saved nothing after its "
            f"last checkpoint. {kept_checkpoint_advice(run)}")


def kept_checkpoint_advice(run):
    """The end of a non-finite-loss error: the newest checkpoint that verifies and was saved with
    finite losses (hashing its files: error path only), and how to go on from it."""
    kept = ck.newest_verified_checkpoint(run.run_dir) if run.main_proc else None
    fixes = "lower optim.lr or set optim.clip_grad"
    if kept is None:
        return f"No verified checkpoint with a finite loss is kept: {fixes} and start over with --overwrite"
    return (f"Newest verified checkpoint with a finite loss: {kept}; {fixes}, then continue from it with "
            f"--resume {kept} {rp.RESUME_FLAG}")


def stop_if_nonfinite(run):
    """Under train.nonfinite=stop, raise NonFiniteLoss if any update since the start of the session
    had a non-finite loss on any rank. Reads the device: call at log steps, saves and epoch ends only."""
    if run.cfg.train.nonfinite != "stop":
        return
    bad = run.losses.first_bad_step.reshape(1)
    if run.world > 1:
        bad = run.accelerator.gather(bad)
    bad = [b for b in bad.tolist() if b != NO_BAD_STEP]
    if bad:
        raise NonFiniteLoss(
            f"non-finite loss at step {min(bad)} (found at step {run.state.step}, the next check); training "
            f"stopped and nothing after step {min(bad)} was saved. {kept_checkpoint_advice(run)}, "
            f"or set train.nonfinite=skip")
