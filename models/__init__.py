"""Models: the ResMLP family (models/resmlp.py) and the swappable output heads (models/heads.py).

Importing the package imports neither torch nor timm: the declarations (models/registry.py,
models/names.py, models/head_checks.py) are read by the config loader, which answers a mistake
before torch loads. The names below load their module on first use (PEP 562); importing
models.resmlp registers the resmlp_* variants with timm."""
import importlib

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
    import timm

    from . import resmlp  # noqa: F401  (registers resmlp_* with timm)
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


__all__ = ["create_classifier", *_EXPORTS]
