"""Models: the ResMLP family (models/resmlp.py) and the swappable output heads (models/heads.py).

    import timm, models          # or: import models, timm / from models import create_classifier
    timm.create_model("resmlp_tiny", num_classes=10)

Registration with timm: `import models` registers the resmlp_* variants with timm whenever timm is
imported, in either order. If timm is already imported, models.resmlp is imported at once; if not,
a one-shot import hook (common/after_import.py) imports it right after timm's own import finishes.

Importing the package itself imports neither torch nor timm: the declarations (models/registry.py,
models/names.py, models/head_checks.py) are read by the config loader, which answers a mistake
before torch loads, and the hook costs nothing until something imports timm. The names below load
their module on first use (PEP 562)."""
import importlib

from common.after_import import run_after_import

_EXPORTS = {
    "convert_state_dict": "convert", "load_pretrained": "convert",
    "OutputHead": "heads",
    "softmax": "mappings", "sparsemax": "mappings", "entmax15": "mappings", "entmax_bisect": "mappings",
    "softmax_loss": "losses", "sparsemax_loss": "losses", "entmax15_loss": "losses", "entmax_bisect_loss": "losses",
    "HEAD_NAMES": "registry", "HPARAMS": "registry",
    "MODEL_NAMES": "names",
    "Affine": "resmlp", "ResMLP": "resmlp", "create_resmlp": "resmlp",
}


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def create_classifier(model_cfg, head_cfg, num_classes, *, img_size):
    """Build the configured ResMLP for `img_size` x `img_size` images (a config's data.image_size) and
    attach its output head as `model.output_head`.

    `model(x)` returns logits, exactly as a timm model; `model.output_head(logits)` gives the
    head's probabilities and `model.output_head.loss(logits, target)` its Fenchel-Young loss.
    A learned entmax alpha therefore lives in the model's state dict and optimizer like any weight.
    With a head flagged cosine_classifier (am_softmax), `model.head` is a CosineLinear (scale * cosine,
    no bias). The head's settings are the config's head section (models/registry.py names them).
    """
    import timm  # the resmlp_* variants register on this import (run_after_import above)

    from .heads import OutputHead
    from .registry import HPARAMS

    # model_cfg.name was checked by the config loader (schema choices); timm.create_model reaches
    # create_resmlp, which names the valid variants for a direct caller
    model = timm.create_model(
        model_cfg.name,
        num_classes=num_classes,
        img_size=img_size,
        norm=model_cfg.norm,
        drop_path_rate=model_cfg.drop_path,
        init_values=model_cfg.init_values,
        global_pool=model_cfg.pool,
        pool_mapping=model_cfg.pool_mapping,
        pool_beta=model_cfg.pool_beta,
        pool_k=model_cfg.pool_k,
    )
    model.output_head = OutputHead(head_cfg.name, **{key: getattr(head_cfg, key) for key in HPARAMS})
    # a cosine_classifier head (am_softmax) swaps the final Linear; sparse_softmax checks head.k
    model.output_head.prepare_classifier(model)
    return model


def _register_with_timm():
    importlib.import_module(".resmlp", __name__)  # its @register_model functions run on import


run_after_import("timm", _register_with_timm)

__all__ = ["create_classifier", *_EXPORTS]
