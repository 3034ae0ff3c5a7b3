"""A small synthetic feature folder in scripts/extract_features.py's format (data/features.py), for
tests that need cached features without training and extracting a source model first."""
import json
import os

import torch
from safetensors.torch import save_file

from data import features as F


def write_feature_folder(root, *, classes=4, dim=128, counts=None, seed=0, spread=1.5):
    """Gaussian clusters (dim: resmlp_tiny's width, which the probe's initial weights need), one per class
    (labels cycle 0..classes-1), every split a single shard."""
    counts = counts or {"train": 240, "val": 80, "calib": 40}
    g = torch.Generator().manual_seed(seed)
    centres = spread * torch.randn(classes, dim, generator=g)
    for split, n in counts.items():
        labels = torch.arange(n) % classes
        feats = centres[labels] + torch.randn(n, dim, generator=g)
        os.makedirs(os.path.join(root, split), exist_ok=True)
        save_file({"features": feats.contiguous(), "labels": labels, "index": torch.arange(n),
                   "view": torch.zeros(n, dtype=torch.int64)}, F.shard_path(root, split, 0))
    names = [f"class{k}" for k in range(classes)]
    meta = {"format": F.FORMAT_VERSION, "complete": True, "source": {"path": "synthetic", "sha256": "0" * 64},
            "source_sha256": "0" * 64, "feature_dim": dim, "num_classes": classes, "classes": names,
            "dataset": "builtin10", "splits": list(counts), "counts": counts, "views": 1, "augment": False,
            "shard_size": max(counts.values()), "seed": seed, "ood": None,
            "config": {"model": {"name": "resmlp_tiny"}, "data": {"calib_fraction": 0.1 if "calib" in counts else 0.0}}}
    with open(os.path.join(root, F.META_FILE), "w") as f:
        json.dump(meta, f)
    with open(os.path.join(root, "classes.json"), "w") as f:
        json.dump({"classes": names}, f)
    return root
