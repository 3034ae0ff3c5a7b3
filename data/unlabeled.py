"""Unlabeled images for prediction: their decoded batches (the list of files a user means is
data/image_list.py's `list_images`, made before torch loads).

`ImageBatches`: a DataLoader "dataset" whose item is a whole batch of indices: it decodes each file
(imagefolder.to_rgb: any mode, 16-bit scaled), applies the eval transform and returns the decoded
images, their indices, and the failures (index, reason) instead of raising.
"""
import torch
from PIL import Image

from common.errors import UserError

from .imagefolder import to_rgb
from .loaders import check_transformed_size


def _reason(err):
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


class ImageBatches(torch.utils.data.Dataset):
    """Item = one batch task (an array of indices into `paths`) -> {"index": (n,) int64, "images":
    (n, 3, S, S) float or None, "failed": [(index, reason)]}; undecodable files never raise (a
    transform giving the wrong size is a bug, returned as {"error": message})."""

    def __init__(self, paths, transform, image_size):
        self.paths = paths
        self.transform = transform
        self.image_size = image_size

    def __len__(self):
        return len(self.paths)

    def _decode(self, i):
        with Image.open(self.paths[i]) as im:
            rgb = to_rgb(im, self.paths[i])
            rgb.load()
        return rgb

    def __getitem__(self, task):
        indices, images, failed = [], [], []
        for i in task:
            i = int(i)
            try:
                img = self._decode(i)
            except Exception as err:
                failed.append((i, _reason(err)))
                continue
            x = self.transform(img)
            try:
                check_transformed_size(x, self.image_size, img.size, "eval")
            except UserError as err:  # returned, not raised: a worker would wrap it in a traceback
                return {"error": str(err)}
            indices.append(i)
            images.append(x)
        return {"index": torch.tensor(indices, dtype=torch.int64),
                "images": torch.stack(images) if images else None, "failed": failed}
