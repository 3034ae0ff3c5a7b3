"""models.create_classifier: the configured ResMLP, built through timm's registry, with its output head attached.
Imported on first use of the name (models/__init__.py), so `import models` stays torch-free."""
import timm  # the resmlp_* variants register on this import (models/__init__.py's run_after_import)

from .heads import OutputHead
from .registry import HPARAMS


def create_classifier(model_cfg, head_cfg, num_classes, *, img_size):
    """Build the configured ResMLP for `img_size` x `img_size` images (a config's data.image_size) and
    attach its output head as `model.output_head`.

    `model(x)` returns logits, exactly as a timm model; `model.output_head(logits)` gives the
    head's probabilities and `model.output_head.loss(logits, target)` its Fenchel-Young loss.
    A learned entmax alpha therefore lives in the model's state dict and optimizer like any weight.
    With a head flagged cosine_classifier (am_softmax), `model.head` is a CosineLinear (scale * cosine,
    no bias). The head's settings are the config's head section (models/registry.py names them).
    """
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
