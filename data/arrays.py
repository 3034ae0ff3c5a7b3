"""ArrayDataset: a split held as one uint8 tensor, the form of every dataset declared in_memory
(data/registry.py), which the in-memory path augments on the device as whole batches."""
import numpy as np
import torch
from PIL import Image


class ArrayDataset:
    """A split held as one uint8 tensor (N, 3, H, W) + int64 labels: the in-memory fast path uses
    `images`/`labels` directly; indexing gives (transform(PIL image), label) like any dataset."""

    def __init__(self, images, labels, num_classes, transform=None, name=""):
        self.images = images
        self.labels = labels
        self.num_classes = num_classes
        self.transform = transform
        self.name = name
        self.native_size = images.shape[-1]

    def __len__(self):
        return len(self.labels)

    def subset(self, indices):
        idx = torch.as_tensor(np.asarray(indices, dtype=np.int64))
        return ArrayDataset(self.images[idx], self.labels[idx], self.num_classes, self.transform, self.name)

    def load(self, i, replace_corrupt=True):
        """-> (PIL image, label, []) (same signature as ImageFolderDataset.load; nothing is corrupt here)."""
        return Image.fromarray(self.images[i].permute(1, 2, 0).numpy()), int(self.labels[i]), []

    def __getitem__(self, i):
        img, label, _ = self.load(i)
        return (self.transform(img) if self.transform is not None else img), label
