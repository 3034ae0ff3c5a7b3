"""Optimizer and learning-rate schedule from timm, configured by `OptimConfig`.

- `timm.optim.create_optimizer_v2` with `filter_bias_and_bn=True` puts every parameter with
  ndim <= 1 (biases, Affine alpha/beta, LayerNorm, LayerScale vectors, a learned entmax alpha)
  in a group without weight decay, as in DeiT/ResMLP. Parameters that do not require gradients
  (model.freeze=backbone) are left out.
- optim.layer_decay: timm's layer-wise lr decay (`layer_decay=`, groups from the model's
  group_matcher); each group's `lr_scale` multiplies the scheduled lr.
- Linear scaling rule (Goyal et al. 2017): lr = optim.lr * global_batch / optim.lr_base_batch.
- Warmup + cosine (`timm.scheduler.CosineLRScheduler`, t_in_epochs=False) is stepped once per
  optimizer update and sized from the true number of updates, so grad accumulation and the
  number of processes do not stretch or squash it.
"""
import math

from timm.optim import create_optimizer_v2
from timm.scheduler import CosineLRScheduler


def scaled_lr(optim_cfg, global_batch):
    return optim_cfg.lr * global_batch / optim_cfg.lr_base_batch


def build_optimizer(model, optim_cfg, global_batch):
    kwargs = {}
    if optim_cfg.name in ("lamb", "adamw"):
        kwargs["betas"] = tuple(optim_cfg.betas)
    if optim_cfg.layer_decay is not None:
        kwargs["layer_decay"] = optim_cfg.layer_decay
    return create_optimizer_v2(
        model,
        opt=optim_cfg.name,
        lr=scaled_lr(optim_cfg, global_batch),
        weight_decay=optim_cfg.weight_decay,
        momentum=optim_cfg.momentum,
        filter_bias_and_bn=True,
        **kwargs,
    )


def schedule_lengths(optim_cfg, updates_per_epoch):
    """(total optimizer updates, warmup updates) for the whole run."""
    total = max(1, optim_cfg.epochs * updates_per_epoch)
    warmup = min(total - 1, int(math.ceil(optim_cfg.warmup_epochs * updates_per_epoch)))
    return total, max(0, warmup)


def build_scheduler(optimizer, optim_cfg, updates_per_epoch):
    """Warmup (linear from warmup_lr) then cosine to min_lr, indexed by optimizer update."""
    total, warmup = schedule_lengths(optim_cfg, updates_per_epoch)
    return CosineLRScheduler(
        optimizer,
        t_initial=max(1, total - warmup),
        lr_min=optim_cfg.min_lr,
        warmup_t=warmup,
        warmup_lr_init=optim_cfg.warmup_lr,
        warmup_prefix=True,  # cosine starts after warmup and ends exactly at the last update
        t_in_epochs=False,
        cycle_limit=1,
    )
