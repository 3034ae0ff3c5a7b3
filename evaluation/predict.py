"""Run a model over an eval split and gather every sample's logits and label, exactly, in order.

`data.build_eval_loader` gives rank r the dataset indices r::world_size with no padding, so shards
may differ by one sample. Each rank's (logits, labels) are padded to the longest shard, gathered,
trimmed with the gathered true lengths, and interleaved back into dataset order (global index of
rank r's i-th sample = r + i·world_size). The result is the same on every rank and identical in
content and order to a one-process run: no duplicates, nothing dropped.
"""
import time
from dataclasses import dataclass

import torch


@dataclass
class Predictions:
    logits: torch.Tensor  # float32 (N, K), CPU, dataset order
    labels: torch.Tensor  # int64 (N,), CPU
    seconds: float        # wall time of the forward loop (slowest rank: ranks meet at barriers)
    img_per_s: float      # N / seconds: end-to-end inference throughput over all processes

    @property
    def n(self):
        return int(self.labels.numel())


def _interleave(chunks):
    """[rank0 tensor, rank1 tensor, ...] (shards r::W) -> tensor in dataset order."""
    world = len(chunks)
    total = sum(c.shape[0] for c in chunks)
    out = chunks[0].new_empty((total,) + tuple(chunks[0].shape[1:]))
    for rank, chunk in enumerate(chunks):
        out[rank::world] = chunk
    return out


def gather_in_order(tensor, accelerator):
    """Gather a per-rank shard (rank r holds indices r::W) into the full tensor in dataset order."""
    if accelerator is None or accelerator.num_processes == 1:
        return tensor
    device = accelerator.device
    local = tensor.to(device)
    length = torch.tensor([local.shape[0]], dtype=torch.long, device=device)
    lengths = accelerator.gather(length).cpu().tolist()
    padded = accelerator.pad_across_processes(local.contiguous(), dim=0)
    gathered = accelerator.gather(padded).cpu()
    width = max(lengths)
    chunks = [gathered[r * width: r * width + n] for r, n in enumerate(lengths)]
    return _interleave(chunks)


@torch.no_grad()
def predict(model, loader, accelerator=None, num_classes=None):
    """Logits and labels of every sample of the loader's dataset, gathered over processes."""
    device = accelerator.device if accelerator is not None else torch.device("cpu")
    model.eval()
    logits_parts, label_parts = [], []
    if accelerator is not None:
        accelerator.wait_for_everyone()
    start = time.perf_counter()
    for images, labels in loader:
        images = images.to(device, non_blocking=True)
        if accelerator is not None:
            with accelerator.autocast():
                logits = model(images)
        else:
            logits = model(images)
        logits_parts.append(logits.float().cpu())
        label_parts.append(labels.cpu().long())
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if accelerator is not None:
        accelerator.wait_for_everyone()
    seconds = time.perf_counter() - start
    width = num_classes if num_classes is not None else getattr(model, "num_classes", 0)
    local_logits = torch.cat(logits_parts) if logits_parts else torch.empty(0, width)
    local_labels = torch.cat(label_parts) if label_parts else torch.empty(0, dtype=torch.long)
    all_logits = gather_in_order(local_logits, accelerator)
    all_labels = gather_in_order(local_labels, accelerator)
    if accelerator is not None and accelerator.num_processes > 1:
        # The slowest rank decides when the whole split is done.
        t = torch.tensor([seconds], dtype=torch.float64, device=device)
        seconds = float(accelerator.gather(t).max())
    n = int(all_labels.numel())
    return Predictions(all_logits, all_labels, seconds, n / seconds if seconds > 0 else float("nan"))
