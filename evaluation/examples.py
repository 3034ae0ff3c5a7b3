"""The per-example record file eval.py writes beside its JSON: `<output stem>.examples.safetensors`.

One row per sample of the evaluated split, in dataset order (row i is sample i of the split, the
same order for every checkpoint evaluated on it, so files of two heads pair sample by sample):

    label         int64    true class
    pred          int64    predicted class (top-1 by logit)
    p_y           float32  the head's probability of the true class (0 is possible for sparse heads)
    max_prob      float32  the confidence: the head's probability of pred (its largest, except for perturbmax's
                           draws and Taylor softmax: evaluation/metrics.example_records)
    support_size  int64    classes with probability > 0
    loss          float32  the head's Fenchel-Young loss of the true class
    top5_hit      bool     true class among the 5 highest logits
    pool_support  int64    (model.pool=hopfield only) patches the image's pooling uses (weight > 0)

Metadata (strings): head, split, dataset, weights, checkpoint, n. safetensors: no pickle on load.
"""
from common.weights import read_safetensors, read_safetensors_metadata, save_safetensors

from .metrics import RECORD_FIELDS
from .pool_support import POOL_SUPPORT_FIELD

OPTIONAL_FIELDS = (POOL_SUPPORT_FIELD,)  # saved when the records have them



def save_examples(records, path, **metadata):
    """Write the records (metrics.RECORD_FIELDS and any OPTIONAL_FIELDS -> (N,) tensors) atomically
    with string metadata."""
    fields = RECORD_FIELDS + tuple(k for k in OPTIONAL_FIELDS if k in records)
    tensors = {k: records[k].detach().cpu().contiguous() for k in fields}
    meta = {k: str(v) for k, v in metadata.items()}
    meta["n"] = str(int(tensors["label"].numel()))
    save_safetensors(tensors, path, metadata=meta)


def load_examples(path):
    """-> (records dict of CPU tensors, metadata dict of strings); one line naming a damaged file."""
    return read_safetensors(path, what="per-example records file"), read_safetensors_metadata(path)
