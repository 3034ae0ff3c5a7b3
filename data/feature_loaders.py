"""Loaders of cached features (data.dataset=features, data/features.py): the same batches as the
image path's TrainLoader and EvalLoader (the samplers' positions), gathered from one on-device
tensor per split; no workers, no transform. Apart from data/features.py so that the dataset (which
the registry declares) and its loaders (which read the samplers) import no circle."""
import numpy as np
import torch

from .loaders import epoch_train_batches
from .samplers import eval_batches


class FeatureTrainLoader:
    """A rank's training batches of one epoch: the same (indices) as data.TrainLoader (the samplers'
    `epoch_train_batches`), gathered from the epoch's view on the device; no workers, no transform."""

    def __init__(self, dataset, cfg, *, seed, epoch, rank, world_size, start_batch=0, device="cpu"):
        self.tasks = epoch_train_batches(dataset, cfg, seed=seed, epoch=epoch, rank=rank, world_size=world_size,
                                         start_batch=start_batch)
        self.device = torch.device(device)
        self.features, self.labels = _on_device(dataset, self.device, epoch)
        self.start_batch, self.epoch = start_batch, epoch
        self.batches_per_epoch = len(self.tasks)
        self.uses_memory_path = True

    def __len__(self):
        return self.batches_per_epoch

    def __iter__(self):
        """The epoch's sample order goes to the device here, in one copy (iter() runs outside a
        training step, next() inside one: see data/loaders.py's memory path)."""
        tasks = self.tasks[self.start_batch:]
        if not tasks:
            return iter(())
        order = torch.from_numpy(np.concatenate([np.asarray(i, dtype=np.int64) for i, _ in tasks])).to(self.device)
        bounds = np.cumsum([0] + [len(i) for i, _ in tasks]).tolist()
        return ((self.features.index_select(0, order[a:b]), self.labels.index_select(0, order[a:b]))
                for a, b in zip(bounds, bounds[1:]))


class FeatureEvalLoader:
    """Eval batches as data.EvalLoader: rank r gets positions r::world_size, no padding (view 0)."""

    skipped = 0

    def __init__(self, dataset, cfg, *, rank, world_size, device="cpu"):
        self.tasks = eval_batches(len(dataset), rank=rank, world_size=world_size, batch_size=cfg.eval_batch_size)
        self.device = torch.device(device)
        self.features, self.labels = _on_device(dataset, self.device, 0)
        self.num_samples = sum(len(t[0]) for t in self.tasks)

    def __len__(self):
        return len(self.tasks)

    def __iter__(self):
        for indices, _ in self.tasks:
            lo, hi = int(indices[0]), int(indices[-1]) + 1
            step = int(indices[1] - indices[0]) if len(indices) > 1 else 1
            yield self.features[lo:hi:step], self.labels[lo:hi:step]


def _on_device(dataset, device, epoch):
    """The view of `epoch` and the labels on `device`, cached on the dataset (one device copy)."""
    cache = dataset.__dict__.setdefault("_device_cache", {})
    key = (str(device), epoch % dataset.views.shape[0])
    if key not in cache:
        cache.clear()
        cache[key] = (dataset.view(epoch).to(device), dataset.labels.to(device))
    return cache[key]
