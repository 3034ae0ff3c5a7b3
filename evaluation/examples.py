"""The per-example record file eval.py writes beside its JSON: `<output stem>.examples.safetensors`.

One row per sample of the evaluated split, in dataset order (row i is sample i of the split, the
same order for every checkpoint evaluated on it, so files of two heads pair sample by sample):

    label         int64    true class
    pred          int64    predicted class (top-1 by logit)
    p_y           float32  the head's probability of the true class (0 is possible for sparse heads)
    max_prob      float32  the head's largest probability (the confidence that ECE bins)
    support_size  int64    classes with probability > 0
    loss          float32  the head's Fenchel-Young loss of the true class
    top5_hit      bool     true class among the 5 highest logits

Metadata (strings): head, split, dataset, weights, checkpoint, n. safetensors: no pickle on load.
"""
import os

from safetensors.torch import load_file, safe_open, save_file

from .metrics import RECORD_FIELDS

SUFFIX = ".examples.safetensors"


def examples_path(output_json):
    """Where the records of an eval result saved at `output_json` go."""
    return os.path.splitext(output_json)[0] + SUFFIX


def save_examples(records, path, **metadata):
    """Write the records (metrics.RECORD_FIELDS -> (N,) tensors) atomically with string metadata."""
    tensors = {k: records[k].detach().cpu().contiguous() for k in RECORD_FIELDS}
    meta = {k: str(v) for k, v in metadata.items()}
    meta["n"] = str(int(tensors["label"].numel()))
    tmp = f"{path}.tmp{os.getpid()}"
    save_file(tensors, tmp, metadata=meta)
    os.replace(tmp, path)


def load_examples(path):
    """-> (records dict of CPU tensors, metadata dict of strings)."""
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
    return load_file(path), meta
