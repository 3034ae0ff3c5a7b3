"""scripts/export.py --format timm: a folder that timm loads as it stands, in timm's Hugging Face Hub layout.

    FOLDER/model.safetensors   the weights in timm's names and shapes (models/convert.py)
    FOLDER/config.json         architecture, num_classes, label_names, pretrained_cfg (this run's
                               evaluation transform: data/transforms.py), and `head`: which head
                               produced the logits and how to turn them into its probabilities
    FOLDER/class_map.txt       the class names, one per line, for timm's --class-map
    FOLDER/README.md           a model card saying the same

`timm.create_model("resmlp_12_224", checkpoint_path="FOLDER/model.safetensors", num_classes=K)` and
`timm.create_model("local-dir:FOLDER", pretrained=True)` load it strictly, without this project.
Only the paper's variants with the Affine norm and average pooling have a timm architecture; the
others are refused in one line naming why. The export checks itself: timm's model on the
converted weights must give this model's logits (within LOGIT_TOLERANCE) or nothing is written.
"""
import os

import timm
import torch

from common import rundir
from common.errors import UserError
from common.io import atomic_write_text, write_json
from common.weights import save_safetensors
from data.classes import class_map_text
from data.registry import is_features
from data.transforms import eval_transform
from models.convert import to_timm_state_dict
from models.resmlp import TIMM_ARCHITECTURES, VARIANTS

from .destinations import TIMM_CARD, TIMM_CONFIG, TIMM_WEIGHTS

LOGIT_TOLERANCE = 1e-5
# How to get a head's probabilities from the logits outside this project, where a package has the mapping.
_PROBABILITIES = {
    "softmax": "logits.softmax(-1)",
    "sparsemax": "entmax.sparsemax(logits, dim=-1)  (pip install entmax)",
    "entmax15": "entmax.entmax15(logits, dim=-1)  (pip install entmax)",
    "entmax_bisect": "entmax.entmax_bisect(logits, alpha={alpha}, dim=-1)  (pip install entmax)",
}


def refusal(cfg, spec) -> str:
    """Why timm has no model for this run, whose head is declared by `spec` (None when it has one)."""
    name = cfg.model.name
    if is_features(cfg.data):
        return "the run is a linear probe on cached features, not a ResMLP"
    if name not in TIMM_ARCHITECTURES:
        return (f"timm has no architecture for {name} (only the paper's variants have one: "
                f"{', '.join(TIMM_ARCHITECTURES)})")
    if cfg.model.norm != "affine":
        return f"timm's ResMLP has the Affine norm only; this run uses model.norm={cfg.model.norm}"
    if spec.cosine_classifier:
        return (f"head '{spec.name}' classifies with a cosine classifier (scale x cosine, no bias), "
                f"which timm's linear head cannot hold")
    if cfg.model.pool != "avg":
        return f"timm's ResMLP pools by averaging; this run uses model.pool={cfg.model.pool}"
    if cfg.data.image_size != VARIANTS[name]["img_size"]:
        return (f"timm's {TIMM_ARCHITECTURES[name]} takes {VARIANTS[name]['img_size']} px images; "
                f"this run's data.image_size is {cfg.data.image_size}")
    return None


def check_exportable(cfg, spec):
    why = refusal(cfg, spec)
    if why:
        raise UserError(f"--format timm cannot export this run: {why}; use --format onnx or torchscript")


def head_block(head) -> dict:
    """config.json's `head`: the logits are the classifier's; the probabilities are the head's mapping."""
    settings = head.hparams()
    recipe = _PROBABILITIES.get(head.name)
    how = (recipe.format(**settings) if recipe else
           f"the '{head.name}' mapping of this project (models/heads.py), or export with "
           f"scripts/export.py --format onnx --head-probabilities")
    return {"name": head.name, "settings": settings, "doc": head.spec.doc, "sparse": head.spec.sparse,
            "logits": "the model's output: the classifier's scores before the head's mapping (top-1 = argmax)",
            "probabilities": how}


def hub_config(cfg, model, classes, head) -> dict:
    """config.json in timm's Hugging Face Hub layout (what timm's save_for_hf writes and
    create_model('local-dir:...') / ('hf-hub:...') read), plus the `head` block."""
    data_cfg = eval_transform(cfg.data).timm_config()
    pretrained_cfg = {**data_cfg, "input_size": list(data_cfg["input_size"]), "mean": list(data_cfg["mean"]),
                      "std": list(data_cfg["std"]), "fixed_input_size": True, "num_classes": len(classes),
                      "first_conv": "stem.proj", "classifier": "head"}
    return {"architecture": TIMM_ARCHITECTURES[cfg.model.name], "num_classes": len(classes),
            "num_features": int(model.num_features), "global_pool": "avg", "label_names": list(classes),
            "pretrained_cfg": pretrained_cfg, "head": head_block(head)}


LICENSE = "apache-2.0"  # this project's licence (LICENSE, CITATION.cff), in the Hub's spelling


def logits_words(head) -> str:
    """What the card says the model returns: timm's usual softmax inputs for the softmax head; for another head,
    logits that its own mapping turns into probabilities (softmax of them is not this head's)."""
    if head["name"] == "softmax":
        return ("The model returns **logits**, as timm's classifiers do: their softmax is the head's "
                f"probabilities (`{head['probabilities']}`), their argmax the top-1.")
    return (f"The model returns **logits**, the classifier's scores before the `{head['name']}` mapping: they are "
            f"not timm's usual softmax inputs (a softmax of them is not this head's distribution). Top-1 is their "
            f"argmax; the head's probabilities are `{head['probabilities']}`.")


def model_card(config) -> str:
    arch, head, pre = config["architecture"], config["head"], config["pretrained_cfg"]
    return f"""---
library_name: timm
license: {LICENSE}
tags: [image-classification, timm, resmlp]
---
# {arch}, {config['num_classes']} classes, head: {head['name']}

ResMLP (Touvron et al. 2021, arXiv:2105.03404) trained with the `{head['name']}` output head
({head['doc']}). Load it with timm alone:

```python
import timm
model = timm.create_model("local-dir:.", pretrained=True).eval()   # this folder
# or: timm.create_model("{arch}", checkpoint_path="model.safetensors", num_classes={config['num_classes']})
```

{logits_words(head)}
{"Their exact zeros mark a prediction set (the support)." if head['sparse'] else ""}

Evaluation transform of the run (also in config.json's pretrained_cfg, which timm's data config
reads): shorter side resized to {pre['input_size'][1]} / {pre['crop_pct']} ({pre['interpolation']}),
centre crop {pre['input_size'][1]}, mean {pre['mean']}, std {pre['std']}. `class_map.txt` lists the
classes in label order (timm's `--class-map`).

Licence: Apache-2.0, the licence of the code that trained and exported the model; the weights may also
be bound by the terms of the data they were trained on.
"""


def build_timm_model(cfg, model, classes):
    """timm's own model with this run's weights, loaded strictly, and checked against `model`."""
    data_cfg = eval_transform(cfg.data).timm_config()
    timm_model = timm.create_model(TIMM_ARCHITECTURES[cfg.model.name], num_classes=len(classes),
                                   pretrained_cfg_overlay=data_cfg).eval()
    state = to_timm_state_dict(model.state_dict())
    timm_model.load_state_dict(state, strict=True)
    size = cfg.data.image_size
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = (timm_model(x) - model(x)).abs().max().item()
    if not diff <= LOGIT_TOLERANCE:
        raise UserError(f"timm's {TIMM_ARCHITECTURES[cfg.model.name]} on the converted weights differs from the run's "
                        f"model by {diff:.2e} in the logits (more than {LOGIT_TOLERANCE}); nothing was written")
    return timm_model, state


def write_folder(folder, cfg, model, classes):
    """Write the four files (each atomically); the caller holds the folder's lock."""
    head = model.output_head
    _, state = build_timm_model(cfg, model, classes)
    config = hub_config(cfg, model, classes, head)
    save_safetensors(state, os.path.join(folder, TIMM_WEIGHTS), metadata={"format": "pt"})
    write_json(config, os.path.join(folder, TIMM_CONFIG))
    atomic_write_text(os.path.join(folder, rundir.CLASS_MAP), class_map_text(classes))
    atomic_write_text(os.path.join(folder, TIMM_CARD), model_card(config))
