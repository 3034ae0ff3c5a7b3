"""The one evaluation loop: train.py's periodic eval and eval.py both run `evaluate`.

Each batch's logits become per-example records (`metrics.example_records`); their float64 sums
(top-1 and top-5 hits, loss, support size, count) accumulate on the device with no host read and
are added over ranks with `accelerator.reduce`, so counts are exact (each rank evaluates its own
shard: `data.build_eval_loader` gives rank r the indices r::world_size, no padding; each batch's
dataset indices go to the head, whose random noise (perturbmax) follows the example, not its place
in the batch: the same numbers at any batch size and process count). eval.py also
keeps the records and logits, gathered over ranks in dataset order, for the metrics that need the
whole split (ECE, per-class accuracy, prediction sets) and for the per-example file.

Hopfield pooling (model.pool=hopfield): with keep_examples, a forward hook on the pooling
(evaluation/pool_support.py) adds each image's pooling support (patches with weight > 0) to its
records as `pool_support`, in the same forward pass, and keeps the first images' support maps.

Penultimate features (keep_features, for eval.py's feature-memory OOD scores): a forward pre-hook on
the classifier (evaluation/feature_memory.py FeatureProbe) keeps its input, in the same forward pass.

Precision: the forward runs in float32 with autocast off, whatever train.mixed_precision is, so
training's eval and eval.py give the same numbers on the same weights. Accelerate wraps a prepared
model's forward in autocast and keeps the plain one as `_original_forward` (what its own
`unwrap_model(keep_fp32_wrapper=False)` restores, permanently: training must keep its autocast);
an outer autocast(enabled=False) would not switch the inner one off, so the plain forward is called.
"""
import contextlib
import time
from dataclasses import dataclass
from typing import Optional

import torch

from data.samplers import eval_example_ids

from .feature_memory import FeatureProbe
from .gather import gather_in_order
from .metrics import example_records, means_from_sums, record_sums
from .pool_support import POOL_SUPPORT_FIELD, PoolingProbe, has_hopfield_pool


@dataclass
class Evaluation:
    totals: dict  # {"top1", "top5", "loss", "support_size", "n"} over the whole split (all ranks)
    seconds: float  # wall time of the forward loop (slowest rank: ranks meet at barriers)
    img_per_s: float  # n / seconds over all processes
    records: Optional[dict] = None  # keep_examples: metrics.RECORD_FIELDS -> (N,) CPU tensors, dataset order
    logits: Optional[torch.Tensor] = None  # keep_examples: float32 (N, K), CPU, dataset order
    pooling: Optional[dict] = None  # keep_examples + hopfield pooling: {"num_patches", "heads", "mapping",
    #   "maps": PoolingProbe.maps() of this process's first images, "positions" in its shard}
    features: Optional[torch.Tensor] = None  # keep_features: float32 (N, d) penultimate features, CPU, dataset order


def plain_forward(module):
    """The module's forward without the mixed-precision wrapper Accelerate may have installed."""
    return module.__dict__.get("_original_forward", module.forward)


@torch.no_grad()
def evaluate(module, loader, accelerator=None, keep_examples=False, ignore_labels=False, keep_features=False,
             progress=None):
    """Evaluate the unwrapped classifier `module` (with its `output_head`) over the loader's split.

    progress: told `update(1)` after each batch (eval.py's progress line; a host count, no device read).

    ignore_labels: the split's labels mean nothing to this model (an out-of-distribution set, whose
    labels index other classes, possibly more than the model has): they are replaced by 0 so the
    per-example records can be formed; only the logits and the label-free records (max_prob,
    support_size) are meaningful then."""
    device = accelerator.device if accelerator is not None else torch.device("cpu")
    head, forward = module.output_head, plain_forward(module)
    was_training = module.training
    module.eval()
    sums = torch.zeros(5, dtype=torch.float64, device=device)
    kept = []
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator is not None else (0, 1)
    seen = 0  # examples of this rank so far (host count from the batch shapes: no device read)
    probe = PoolingProbe(module) if keep_examples and has_hopfield_pool(module) else None
    feature_probe = FeatureProbe(module) if keep_features else None
    if accelerator is not None:
        accelerator.wait_for_everyone()
    start = time.perf_counter()
    with probe if probe is not None else contextlib.nullcontext(), feature_probe or contextlib.nullcontext():
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            if ignore_labels:
                labels = torch.zeros_like(labels)
            with torch.autocast(device_type=device.type, enabled=False):
                logits = forward(images).float()
            ids = eval_example_ids(seen, labels.shape[0], rank, world, device)
            seen += labels.shape[0]
            records = example_records(logits, labels, head, ids=ids)
            sums += record_sums(records)
            if probe is not None:
                records[POOL_SUPPORT_FIELD] = probe.take(images)
            if keep_examples:
                kept.append(({k: v.cpu() for k, v in records.items()}, logits.cpu()))
            if feature_probe is not None:
                feature_probe.take()
            if progress is not None:
                progress.update(1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    seconds = time.perf_counter() - start
    if was_training:
        module.train()
    multi = accelerator is not None and accelerator.num_processes > 1
    if multi:
        sums = accelerator.reduce(sums, reduction="sum")
        # The slowest rank decides when the whole split is done.
        seconds = float(accelerator.gather(torch.tensor([seconds], dtype=torch.float64, device=device)).max())
    totals = means_from_sums(sums)
    result = Evaluation(totals, seconds, totals["n"] / seconds if seconds > 0 else float("nan"))
    if keep_examples:
        result.records, result.logits = _gather_examples(kept, head, module, accelerator, probe is not None)
    if feature_probe is not None:
        result.features = gather_in_order(feature_probe.features(module.num_features), accelerator)
    if probe is not None:
        result.pooling = {"num_patches": module.num_patches, "heads": probe.heads, "mapping": probe.mapping,
                          "maps": probe.maps()}
    return result


def _gather_examples(kept, head, module, accelerator, pool_support=False):
    if kept:
        records = {k: torch.cat([r[k] for r, _ in kept]) for k in kept[0][0]}
        logits = torch.cat([lg for _, lg in kept])
    else:  # an empty shard still takes part in the gather
        probe = example_records(torch.zeros(1, module.num_classes), torch.zeros(1, dtype=torch.long), head)
        records = {k: v[:0].cpu() for k, v in probe.items()}
        if pool_support:  # the same fields on every rank
            records[POOL_SUPPORT_FIELD] = torch.zeros(0, dtype=torch.long)
        logits = torch.empty(0, module.num_classes)
    # bool does not travel through every backend's gather: send uint8, cast back
    records = {k: gather_in_order(v.to(torch.uint8) if v.dtype == torch.bool else v, accelerator)
               for k, v in records.items()}
    records["top5_hit"] = records["top5_hit"].bool()
    return records, gather_in_order(logits, accelerator)
