"""Gather per-rank eval shards into the whole split, exactly, in dataset order.

`data.build_eval_loader` gives rank r the dataset indices r::world_size with no padding, so shards
may differ by one sample. Each rank's tensors (logits, per-example records) are padded to the
longest shard, gathered, trimmed with the gathered true lengths, and interleaved back into dataset
order (global index of rank r's i-th sample = r + i·world_size). The result is the same on every rank and identical in
content and order to a one-process run: no duplicates, nothing dropped.
"""
import torch


def _interleave(chunks):
    """[rank0 tensor, rank1 tensor, ...] (shards r::W) -> tensor in dataset order."""
    world = len(chunks)
    total = sum(c.shape[0] for c in chunks)
    out = chunks[0].new_empty((total,) + tuple(chunks[0].shape[1:]))
    for rank, chunk in enumerate(chunks):
        out[rank::world] = chunk
    return out


def gather_chunks(tensor, accelerator):
    """[rank 0's rows, rank 1's rows, ...] (CPU) of a per-rank tensor whose length may differ by rank."""
    if accelerator is None or accelerator.num_processes == 1:
        return [tensor]
    device = accelerator.device
    local = tensor.to(device)
    length = torch.tensor([local.shape[0]], dtype=torch.long, device=device)
    lengths = accelerator.gather(length).cpu().tolist()
    padded = accelerator.pad_across_processes(local.contiguous(), dim=0)
    gathered = accelerator.gather(padded).cpu()
    width = max(lengths)
    return [gathered[r * width: r * width + n] for r, n in enumerate(lengths)]


def gather_in_order(tensor, accelerator):
    """Gather a per-rank shard (rank r holds indices r::W) into the full tensor in dataset order."""
    if accelerator is None or accelerator.num_processes == 1:
        return tensor
    return _interleave(gather_chunks(tensor, accelerator))
