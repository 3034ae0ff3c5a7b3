"""Pooling support of a Hopfield-pooled model (models/hopfield_pool.py): which patches each image's
feature is retrieved from.

With `model.pool=hopfield` the final patch tokens are pooled with weights p = entmax(β X q) over the
N patches; under a sparse mapping some weights are exactly 0. A patch is *used* by an image when
any pooling head gives it a weight > 0, so an image's support is a count in 1..N (softmax: N, up
to underflow). Average pooling has no such weights: nothing here applies to it.

Same forward pass: `PoolingProbe` is a forward hook on `model.pool` that recomputes the weights
from the tokens the pooling received (one einsum and the mapping over N scores per image, the same
function of the same input as the pooling's own, so the same weights); no second pass over the
backbone or the data. evaluation/evaluate.py uses it when it keeps the per-example records
(eval.py), never in training's periodic eval.

Outputs (eval.py): the summary (`support_summary`) in eval.json, the per-image count as the
`pool_support` field of the per-example records, and the support maps of the first few images
(`save_pool_maps`: the image as evaluated, uint8, with its weights) in OUTPUT.pool_maps.safetensors,
which the comparison report draws (comparison/report/plots.py plot_pool_support_maps).
"""
import os
import statistics

import torch

from common.weights import read_safetensors, read_safetensors_metadata, save_safetensors

POOL_SUPPORT_FIELD = "pool_support"  # the per-example record: patches used by the image
MAP_IMAGES = 4  # support maps kept per evaluation (the first images of the split)


def has_hopfield_pool(module):
    return bool(getattr(module, "has_hopfield_pool", False))


def patch_support(weights):
    """Pooling weights (B, heads, N) -> int64 (B,): patches with weight > 0 in at least one head."""
    return (weights > 0).any(dim=1).sum(dim=-1)


class PoolingProbe:
    """Forward hook on `module.pool` (a HopfieldPooling) for one evaluation loop.

    After each forward, `take(images)` returns the batch's support counts (B,) on its device and
    keeps, on the CPU, the images and weights of the first `keep_maps` images seen."""

    def __init__(self, module, keep_maps=MAP_IMAGES):
        self.pool, self.keep_maps = module.pool, int(keep_maps)
        self.num_patches, self.heads, self.mapping = None, self.pool.heads, self.pool.mapping
        self._weights, self._handle = None, None
        self.map_images, self.map_weights, self.map_positions = [], [], []
        self._seen = 0

    def __enter__(self):
        self._handle = self.pool.register_forward_hook(self._hook)
        return self

    def __exit__(self, *exc):
        self._handle.remove()
        return False

    def _hook(self, module, inputs, output):
        self._weights = module.weights(inputs[0]).float()

    def take(self, images):
        weights, self._weights = self._weights, None
        if weights is None:
            raise RuntimeError("the model's forward did not call model.pool: no pooling weights to report")
        self.num_patches = weights.shape[-1]
        need = min(self.keep_maps - len(self.map_positions), weights.shape[0])
        if need > 0:  # the first few images of this process's shard, for the support maps
            self.map_images.append(images[:need].detach().float().cpu())
            self.map_weights.append(weights[:need].cpu())
            self.map_positions.extend(range(self._seen, self._seen + need))
        self._seen += weights.shape[0]
        return patch_support(weights)

    def maps(self):
        """{"images" (K, C, H, W) as the model saw them, "weights" (K, heads, N), "positions" (K,)
        in this process's shard} or None when no image was evaluated."""
        if not self.map_positions:
            return None
        return {"images": torch.cat(self.map_images), "weights": torch.cat(self.map_weights),
                "positions": torch.tensor(self.map_positions, dtype=torch.long)}


def support_summary(support, num_patches, heads, mapping):
    """JSON-ready pooling support of a split from the per-image counts (N,): mean, median, min, max,
    the mean fraction of the patches used, and `hist[i]` = images using i + 1 patches (length N)."""
    counts = [int(c) for c in torch.as_tensor(support).long().tolist()]
    n = len(counts)
    hist = torch.bincount(torch.tensor(counts, dtype=torch.long) - 1, minlength=num_patches).tolist() if n \
        else [0] * num_patches
    mean = statistics.fmean(counts) if n else float("nan")
    return {"mapping": mapping, "heads": int(heads), "num_patches": int(num_patches), "n": n,
            "support_mean": mean, "support_median": float(statistics.median(counts)) if n else float("nan"),
            "support_min": min(counts) if n else None, "support_max": max(counts) if n else None,
            "support_fraction_mean": mean / num_patches if n else float("nan"), "support_hist": hist}


def describe(summary):
    """One line for the terminal: 'pooling support (hopfield, sparsemax): 5.2 of 36 patches ...'."""
    if not summary["n"]:
        return f"pooling support (hopfield, {summary['mapping']}): no image evaluated"
    return (f"pooling support (hopfield, {summary['mapping']}): mean {summary['support_mean']:.2f} of "
            f"{summary['num_patches']} patches (median {summary['support_median']:g}, range "
            f"{summary['support_min']}–{summary['support_max']}) over {summary['n']} images")


def display_images(images, mean, std):
    """Normalised float images (K, C, H, W) -> uint8 (K, H, W, C) as they look, undoing (x/255 - mean)/std."""
    mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    pixels = (images.float() * std + mean) * 255.0
    return pixels.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()


def save_pool_maps(path, maps, *, grid, labels, preds, indices, **metadata):
    """OUTPUT.pool_maps.safetensors: uint8 images (K, H, W, C), float32 weights (K, heads, N), the
    images' dataset indices, labels and predictions; metadata strings (grid, mapping, ...)."""
    tensors = {"images": maps["images"], "weights": maps["weights"].float(), "index": indices.long(),
               "label": labels.long(), "pred": preds.long()}
    meta = {k: str(v) for k, v in metadata.items()}
    meta["grid"] = str(int(grid))
    save_safetensors({k: v.contiguous() for k, v in tensors.items()}, path, metadata=meta)


def load_pool_maps(path):
    """-> ({"images", "weights", "index", "label", "pred"} numpy arrays, metadata dict) or None when absent."""
    if not os.path.isfile(path):
        return None
    return {k: v.numpy() for k, v in read_safetensors(path).items()}, read_safetensors_metadata(path)
