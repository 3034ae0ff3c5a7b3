"""Train and eval loaders with exact, worker-count-independent, resumable batches.

Two paths, same semantics:
- memory path (CIFAR/builtin, `in_memory`): the split lives on the training device as one uint8
  tensor; a batch is an index_select plus `BatchAugment` (crop/flip/normalise) there. No workers.
- per-sample path: a torch DataLoader whose "dataset" fetches a whole batch; before transforming
  each sample it reseeds `random`, numpy and torch with the sample's aug seed (restoring the
  caller's RNG states afterwards), so timm's transforms give the same pixels with 0 or N workers.

Skipped batches (start_batch) are never loaded: the batch list is simply sliced.
"""
import random

import numpy as np
import torch
from torch.utils.data import DataLoader

from common.errors import UserError

from .samplers import eval_batches, train_batches
from .transforms import (
    BatchAugment,
    Normalize,
    build_eval_transform,
    build_train_transform,
    in_memory_path,
    resize_uint8,
    train_crop_mode,
    uses_memory_path,
)


def _device_images(dataset, device, size):
    """The dataset's uint8 images on `device` at `size`, cached on the dataset object."""
    cache = dataset.__dict__.setdefault("_device_cache", {})
    key = (str(device), size)
    if key not in cache:
        cache.clear()  # one copy per dataset: don't keep e.g. a CPU and a GPU copy around
        cache[key] = (resize_uint8(dataset.images, size).to(device), dataset.labels.to(device))
    return cache[key]


def check_transformed_size(x, image_size, source_size, kind):
    """A transformed image must be image_size x image_size; otherwise the transform (not the model) is
    at fault, and the batch would fail later with a shape error that points at the model."""
    if image_size is None or tuple(x.shape[-2:]) == (image_size, image_size):
        return
    w, h = source_size
    raise UserError(f"the {kind} transform turned a {w}x{h} image into {x.shape[-1]}x{x.shape[-2]}, not "
                    f"data.image_size={image_size} square: data/transforms.py must resize and crop every "
                    f"image to image_size (please report this with the data.train_crop setting)")


class _BatchFetcher(torch.utils.data.Dataset):
    """DataLoader 'dataset' whose items are whole batches: task = (indices, aug_seeds or None).

    `replace_corrupt` (training): a skipped undecodable image is replaced by the next decodable one,
    keeping batch shapes; off (evaluation): it is dropped, so nothing is counted twice."""

    def __init__(self, dataset, transform, replace_corrupt=True, image_size=None):
        self.dataset = dataset
        self.transform = transform  # the loader's, not dataset.transform: train vs eval is its choice
        self.replace_corrupt = replace_corrupt
        self.image_size = image_size  # what every transformed image must measure (None: unchecked)

    def __len__(self):
        return len(self.dataset)

    def _load(self, i):
        # raw PIL; ImageFolder handles corrupt files (img is None: dropped, eval only)
        img, label, skipped = self.dataset.load(int(i), replace_corrupt=self.replace_corrupt)
        if img is None:
            return None, label, skipped
        x = self.transform(img)
        check_transformed_size(x, self.image_size, img.size, "train" if self.replace_corrupt else "eval")
        return x, label, skipped

    def __getitem__(self, task):
        indices, seeds = task
        images, labels, skipped = [], [], []
        py_state, np_state, torch_state = random.getstate(), np.random.get_state(), torch.get_rng_state()
        try:
            for k, i in enumerate(indices):
                if seeds is not None:
                    s = int(seeds[k])
                    random.seed(s)
                    np.random.seed(s & 0xFFFFFFFF)
                    torch.manual_seed(s & ((1 << 63) - 1))
                img, label, sk = self._load(i)
                skipped.extend(sk)
                if img is None:
                    continue
                images.append(img)
                labels.append(label)
        except UserError as e:  # returned, not raised: a worker would wrap it in a multi-line traceback
            return {"error": str(e)}
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)
            torch.set_rng_state(torch_state)
        if not images:  # every image of this eval batch was undecodable
            return {"images": None, "labels": None, "skipped": skipped}
        return {"images": torch.stack(images), "labels": torch.tensor(labels, dtype=torch.int64), "skipped": skipped}


def epoch_train_batches(dataset, cfg, *, seed, epoch, rank, world_size, start_batch):
    """The rank's batches of one epoch, checked; shared by the PIL and DALI train loaders."""
    if not 0 <= rank < world_size:
        raise UserError(f"rank {rank} out of range for world_size {world_size}")
    tasks = train_batches(len(dataset), seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                          batch_size=cfg.batch_size, repeated_aug=cfg.repeated_aug,
                          num_repeats=cfg.repeated_aug_repeats)
    if not tasks:
        raise UserError(f"the train split has {len(dataset)} samples: fewer than one batch of "
                        f"data.batch_size={cfg.batch_size} x {world_size} process(es); lower data.batch_size")
    if not 0 <= start_batch <= len(tasks):
        raise UserError(f"start_batch {start_batch} out of range: the epoch has {len(tasks)} batches")
    return tasks


class _Loader:
    """Shared iteration over a list of batch tasks (memory or per-sample path)."""

    def __init__(self, dataset, cfg, tasks, device, memory, augment, num_workers):
        self.dataset, self.cfg, self.tasks = dataset, cfg, tasks
        native = getattr(dataset, "native_size", None)
        self.transform = None if memory else (build_train_transform(cfg, native) if augment
                                              else build_eval_transform(cfg, native))
        self.device = torch.device(device)
        self.memory = memory
        self.augment = augment
        self.num_workers = num_workers
        self.skipped_files = set()  # undecodable files met by this loader's iterations

    @property
    def skipped(self):
        """Number of distinct undecodable files skipped by this loader so far (skip_corrupt)."""
        return len(self.skipped_files)

    def _iter_memory(self, tasks):
        """Place the epoch on the device now, when iter() is called, and return the batches' generator.

        iter() runs outside a training step; each next() runs inside one. So everything that moves
        host data to the device happens here, once per epoch: the images (cached), the normalisation
        constants, and the epoch's plan (every batch's sample indices and crop/flip placements, one
        copy each). A step then only slices device tensors: no host-to-device copy from memory that
        Python may free or reuse before an asynchronous copy has read it, and nothing for CUDA's sync
        debug mode to refuse."""
        images, labels = _device_images(self.dataset, self.device, self.cfg.image_size)
        if not tasks:
            return iter(())
        order = torch.from_numpy(np.concatenate([np.asarray(i, dtype=np.int64) for i, _ in tasks])).to(self.device)
        bounds = np.cumsum([0] + [len(i) for i, _ in tasks]).tolist()
        if not self.augment:
            normalize = Normalize(self.cfg.mean, self.cfg.std, self.device)
            return ((normalize(images.index_select(0, order[a:b])), labels.index_select(0, order[a:b]))
                    for a, b in zip(bounds, bounds[1:]))
        aug = BatchAugment(self.cfg, self.device)
        placed = [t.to(self.device) for t in aug.placements(np.concatenate([s for _, s in tasks]))]
        return self._augmented_batches(tasks, bounds, images, labels, order, placed, aug)

    @staticmethod
    def _augmented_batches(tasks, bounds, images, labels, order, placed, aug):
        for (_, seeds), a, b in zip(tasks, bounds, bounds[1:]):
            idx = order[a:b]
            yield aug(images.index_select(0, idx), seeds, [t[a:b] for t in placed]), labels.index_select(0, idx)

    def _iter_samples(self, tasks):
        if not tasks:
            return
        pin = self.device.type == "cuda"
        workers = min(self.num_workers, len(tasks))
        fetcher = _BatchFetcher(self.dataset, self.transform, replace_corrupt=self.augment,  # eval drops bad files
                                image_size=int(self.cfg.image_size))
        loader = DataLoader(fetcher, sampler=tasks, batch_size=None, num_workers=workers,
                            pin_memory=pin, persistent_workers=False,
                            prefetch_factor=4 if workers > 0 else None,
                            generator=torch.Generator().manual_seed(0))  # worker base seed: not from the caller's RNG
        for out in loader:
            if "error" in out:
                raise UserError(out["error"])
            if out["skipped"]:
                self.skipped_files.update(out["skipped"])
                if hasattr(self.dataset, "note_skipped"):
                    self.dataset.note_skipped(out["skipped"])
            if out["images"] is None:
                continue
            yield out["images"].to(self.device, non_blocking=pin), out["labels"].to(self.device, non_blocking=pin)

    def _iter_tasks(self, tasks):
        return self._iter_memory(tasks) if self.memory else self._iter_samples(tasks)


class TrainLoader(_Loader):
    """Batches of one epoch for one rank: (normalised float images, int64 labels) on device.

    `len()` is the full epoch's batch count (equal on every rank); iteration starts at
    `start_batch`. Attributes: epoch, start_batch, batches_per_epoch, uses_memory_path.
    """

    def __init__(self, dataset, cfg, *, seed, epoch, rank, world_size, start_batch=0, device="cpu"):
        tasks = epoch_train_batches(dataset, cfg, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                                    start_batch=start_batch)
        memory = uses_memory_path(cfg)
        super().__init__(dataset, cfg, tasks, device, memory, True, cfg.num_workers)
        self.seed, self.epoch, self.rank, self.world_size, self.start_batch = seed, epoch, rank, world_size, start_batch
        self.batches_per_epoch = len(tasks)
        self.uses_memory_path = memory

    def __len__(self):
        return self.batches_per_epoch

    def __iter__(self):
        return self._iter_tasks(self.tasks[self.start_batch:])


def eval_uses_memory_path(cfg):
    """Eval in memory = normalise only, which is the PIL eval transform in pad-crop mode."""
    return in_memory_path(cfg) and train_crop_mode(cfg) == "pad"


class TaskLoader(_Loader):
    """Batches of the given tasks [(indices, aug_seeds)], in order: with `augment` each sample gets
    the training augmentation drawn from its seed (as in TrainLoader), else the eval transform (as in
    EvalLoader); scripts/extract_features.py computes its views through it. Undecodable images
    (data.skip_corrupt) are replaced under `augment`, dropped otherwise, as in those loaders."""

    def __init__(self, dataset, cfg, tasks, *, augment, device="cpu"):
        memory = uses_memory_path(cfg) if augment else eval_uses_memory_path(cfg)
        super().__init__(dataset, cfg, tasks, device, memory, augment, cfg.num_workers)

    def __len__(self):
        return len(self.tasks)

    def __iter__(self):
        return self._iter_tasks(self.tasks)


class EvalLoader(_Loader):
    """Deterministic eval batches: rank r gets dataset indices r::world_size, no padding.

    With data.skip_corrupt an undecodable image is dropped, not replaced: batches may be shorter
    (or absent), the number of evaluated samples is the number of decodable ones, and `skipped`
    counts the dropped files. (Multi-process `evaluation.predict` re-interleaves shards by position
    and so assumes nothing was dropped; `evaluation.evaluate`'s sums are exact either way.)"""

    def __init__(self, dataset, cfg, *, rank, world_size, device="cpu"):
        tasks = eval_batches(len(dataset), rank=rank, world_size=world_size, batch_size=cfg.eval_batch_size)
        super().__init__(dataset, cfg, tasks, device, eval_uses_memory_path(cfg), False, cfg.num_workers)
        self.num_samples = sum(len(t[0]) for t in tasks)

    def __len__(self):
        return len(self.tasks)

    def __iter__(self):
        return self._iter_tasks(self.tasks)
