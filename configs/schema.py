"""Typed training configuration: one dataclass per section (contract in /work/contracts.md).

Every YAML key maps onto a field here; `configs.loader` rejects unknown keys (suggesting the
closest valid one) and wrong types (naming the key and the expected type).
"""
from dataclasses import dataclass, field
from typing import Optional, Tuple

from data.config import DataConfig


@dataclass
class ModelConfig:
    name: str = "resmlp_tiny"  # any models.resmlp.MODEL_NAMES entry
    norm: str = "affine"  # affine (the paper) | layernorm (baseline) | batchnorm
    drop_path: float = 0.0  # stochastic depth rate, uniform over blocks as in the paper
    init_values: Optional[float] = None  # LayerScale init; None -> depth rule (0.1 / 1e-5 / 1e-6)
    img_size: int = 32


@dataclass
class HeadConfig:
    # softmax | sparsemax | entmax15 | entmax_bisect | normmax | sparse_softmax | taylor_softmax | am_softmax
    name: str = "softmax"
    alpha: float = 1.5  # entmax_bisect only: alpha in (1, 2]
    learn_alpha: bool = False  # entmax_bisect only: alpha = 1 + sigmoid(alpha_logit) is trained
    gamma: float = 2.0  # normmax only: gamma > 1 (Santos et al. 2024 use 2)
    k: int = 5  # sparse_softmax only: classes kept, 1 <= k <= num_classes (5: the top-5 metric)
    order: int = 2  # taylor_softmax only: even order >= 2 (2: 1 + x + x^2/2)
    scale: float = 30.0  # am_softmax only: s > 0, logits = s * cos (Wang et al. 2018 use 30)
    margin: float = 0.35  # am_softmax only: m >= 0 subtracted from the true cosine in training (paper: 0.35)


@dataclass
class OptimConfig:
    name: str = "lamb"  # lamb | adamw | sgd (timm.optim.create_optimizer_v2)
    # Linear scaling rule (Goyal et al. 2017): the lr actually used is
    # lr * global_batch / lr_base_batch, global_batch = batch_size * processes * grad_accum.
    lr: float = 5e-3
    lr_base_batch: int = 2048
    weight_decay: float = 0.2  # not applied to biases, Affine/norm params, LayerScale, alpha (1-D)
    betas: Tuple[float, float] = (0.9, 0.999)
    momentum: float = 0.9  # sgd only
    clip_grad: Optional[float] = None  # max global grad norm; None = no clipping
    epochs: int = 400
    warmup_epochs: float = 5
    min_lr: float = 1e-5
    warmup_lr: float = 1e-6


@dataclass
class TrainConfig:
    seed: int = 0
    mixed_precision: str = "no"  # no | bf16 | fp16
    grad_accum: int = 1  # micro-batches per optimizer update
    eval_every: int = 1  # epochs (and always after the last one)
    log_every: int = 10  # optimizer updates
    save_every: int = 500  # optimizer updates (and always at each epoch end)
    keep_last: int = 2  # checkpoints kept besides the best one
    output_dir: str = "runs/{name}"  # "{name}" is replaced by the config name
    ema: bool = True
    ema_decay: float = 0.99996
    nonfinite: str = "stop"  # stop | skip
    compile: bool = False  # torch.compile the model
    tensorboard: bool = True  # TensorBoard through Accelerate's trackers, when installed
    progress: bool = True  # tqdm bar on the main process


@dataclass
class Config:
    name: str = "run"
    model: ModelConfig = field(default_factory=ModelConfig)
    head: HeadConfig = field(default_factory=HeadConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


# Closed vocabularies checked at load time (the model/head/dataset names are checked by their
# owners' builders, which list the valid names).
CHOICES = {
    "model.norm": ("affine", "layernorm", "batchnorm"),
    "head.name": ("softmax", "sparsemax", "entmax15", "entmax_bisect",
                  "normmax", "sparse_softmax", "taylor_softmax", "am_softmax"),
    "optim.name": ("lamb", "adamw", "sgd"),
    "train.mixed_precision": ("no", "bf16", "fp16"),
    "train.nonfinite": ("stop", "skip"),
}
