"""What an epoch iterates: the loader a data config asks for (the PIL/device path, DALI, or cached
features: the same sample order each way, exact under resume) and the Mixup/CutMix batch transform.
`import data` names these lazily (data/__init__.py): the package itself stays torch-free."""
from timm.data import Mixup

from common.errors import UserError

from .dali_loader import DaliEvalLoader, DaliTrainLoader, resolve_backend
from .feature_loaders import FeatureEvalLoader, FeatureTrainLoader
from .features import check_feature_config
from .loaders import EvalLoader, TrainLoader
from .registry import is_features


def build_train_loader(dataset, cfg, *, seed, epoch, rank, world_size, start_batch=0, device="cpu"):
    """One epoch of training batches for one rank (TrainLoader, or DaliTrainLoader for data.backend
    dali/auto; FeatureTrainLoader for cached features); the same sample order either way, exact under resume."""
    kind = TrainLoader
    if is_features(cfg):
        kind = FeatureTrainLoader
    elif resolve_backend(cfg, device) == "dali":
        kind = DaliTrainLoader
    return kind(dataset, cfg, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                start_batch=start_batch, device=device)


def build_eval_loader(dataset, cfg, *, rank, world_size, device="cpu"):
    """Deterministic eval batches; rank r gets r::world_size, no padding (EvalLoader or DaliEvalLoader)."""
    kind = EvalLoader
    if is_features(cfg):
        kind = FeatureEvalLoader
    elif resolve_backend(cfg, device) == "dali":
        kind = DaliEvalLoader
    return kind(dataset, cfg, rank=rank, world_size=world_size, device=device)


def build_mixup(cfg, num_classes):
    """timm.data.Mixup (Mixup: Zhang et al. 2018; CutMix: Yun et al. 2019) with label smoothing,
    producing soft targets (rows summing to 1), or None when mixup and cutmix are both off
    (label smoothing alone is then applied by the loss). Needs an even batch size."""
    if cfg.mixup <= 0 and cfg.cutmix <= 0:
        return None
    if is_features(cfg):
        check_feature_config(cfg)  # refuses Mixup/CutMix in one line
    if cfg.batch_size % 2:
        raise UserError(f"Mixup/CutMix needs an even data.batch_size, got {cfg.batch_size}")
    return Mixup(mixup_alpha=cfg.mixup, cutmix_alpha=cfg.cutmix, prob=cfg.mixup_prob,
                 switch_prob=cfg.mixup_switch_prob, mode="batch", label_smoothing=cfg.label_smoothing,
                 num_classes=num_classes)
