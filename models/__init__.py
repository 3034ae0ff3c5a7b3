"""Models: the ResMLP family (models/resmlp.py) and the swappable output heads (models/heads.py)."""
from .errors import UserError


def create_classifier(model_cfg, head_cfg, num_classes):
    """Build the configured ResMLP and attach its output head as `model.output_head`.

    `model(x)` returns logits, exactly as a timm model; `model.output_head(logits)` gives the
    head's probabilities and `model.output_head.loss(logits, target)` its Fenchel-Young loss.
    A learned entmax alpha therefore lives in the model's state dict and optimizer like any weight.
    """
    import timm

    from . import resmlp  # noqa: F401  (registers the resmlp_* names with timm)
    from .heads import build_output_head

    if model_cfg.name not in resmlp.MODEL_NAMES:
        raise UserError(f"unknown model '{model_cfg.name}'; valid names: {', '.join(resmlp.MODEL_NAMES)}")
    model = timm.create_model(
        model_cfg.name,
        num_classes=num_classes,
        img_size=model_cfg.img_size,
        norm=model_cfg.norm,
        drop_path_rate=model_cfg.drop_path,
        init_values=model_cfg.init_values,
    )
    model.output_head = build_output_head(head_cfg.name, alpha=head_cfg.alpha, learn_alpha=head_cfg.learn_alpha)
    return model
