"""Deterministic, resumable, rank-sharded sample order.

The epoch's global order is a pure function of (seed, epoch); rank r takes global positions
r, r+W, r+2W, ... (W = world size), so the union over ranks of batch t is batch t of a 1-process
run with a W-times larger batch. Every global position p also gets an augmentation seed
mix(seed, epoch, p), which the loaders use to reseed all RNGs before augmenting that sample: the
augmentation is then independent of worker count, batch composition and resume point.

Repeated augmentation follows timm's RepeatAugSampler (Hoffer et al., 2020; DeiT, Touvron et al.,
2021): each index repeated `num_repeats` times, ranks interleaved, each rank keeping
floor(N // 256 * 256 / W) samples; the shuffle is timm's own code, seeded with mix(seed, epoch).
"""
import numpy as np
import torch
from timm.data.distributed_sampler import RepeatAugSampler

from common.seeding import mix_seed, mix_seed_array


class _Sized:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n


def rank_order(n, *, seed, epoch, rank, world_size, repeated_aug=False, num_repeats=3):
    """-> (dataset indices for this rank, their global positions), both int64 numpy arrays."""
    if repeated_aug:
        sampler = RepeatAugSampler(_Sized(n), num_replicas=world_size, rank=rank, shuffle=True,
                                   num_repeats=num_repeats)
        sampler.set_epoch(mix_seed(seed, epoch, 0x52415547))  # timm seeds its generator with the epoch
        indices = np.fromiter(iter(sampler), dtype=np.int64, count=len(sampler))
    else:
        g = torch.Generator().manual_seed(mix_seed(seed, epoch))
        perm = torch.randperm(n, generator=g).numpy()
        indices = perm[rank::world_size]
    positions = rank + world_size * np.arange(len(indices), dtype=np.int64)
    return indices, positions


def num_train_batches(n, *, world_size, batch_size, repeated_aug=False, num_repeats=3):
    """Batches per epoch of every rank (drop_last: the shortest rank's full batches); no data touched."""
    if repeated_aug:
        per_rank = len(RepeatAugSampler(_Sized(n), num_replicas=world_size, rank=0, num_repeats=num_repeats))
    else:
        per_rank = n // world_size  # the shortest shard
    return per_rank // batch_size


def train_batches(n, *, seed, epoch, rank, world_size, batch_size, repeated_aug=False, num_repeats=3):
    """-> list of (indices, aug_seeds) per batch for this rank; drop_last with a count that is the
    same on every rank (the shortest rank's full batches)."""
    num_batches = num_train_batches(n, world_size=world_size, batch_size=batch_size, repeated_aug=repeated_aug,
                                    num_repeats=num_repeats)
    indices, positions = rank_order(n, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                                    repeated_aug=repeated_aug, num_repeats=num_repeats)
    seeds = mix_seed_array(seed, epoch, 0x415547, last=positions)
    return [(indices[t * batch_size:(t + 1) * batch_size], seeds[t * batch_size:(t + 1) * batch_size])
            for t in range(num_batches)]


def eval_batches(n, *, rank, world_size, batch_size):
    """Rank r gets r::world_size in dataset order, no padding, last batch may be short."""
    idx = np.arange(rank, n, world_size, dtype=np.int64)
    return [(idx[i:i + batch_size], None) for i in range(0, len(idx), batch_size)]


def eval_example_ids(start, count, rank, world_size, device="cpu"):
    """Dataset indices (int64 tensor on `device`) of examples start .. start+count of rank r's
    eval_batches (r::world_size). Undecodable images dropped by data.skip_corrupt shift the later
    ones, as they shift the gathered per-example order."""
    return torch.arange(start, start + count, dtype=torch.int64, device=device) * world_size + rank
