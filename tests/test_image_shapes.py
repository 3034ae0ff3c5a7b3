"""Images of any shape and mode through the real ImageFolder path, with every recipe (pad and rrc,
train and eval): portrait, landscape, square and elongated images, in modes RGB, L, LA, RGBA,
palette (P, with and without transparency), 1-bit, 16-bit grayscale and CMYK JPEG."""
import os

import numpy as np
import pytest
import torch
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = [(40, 48), (48, 40), (32, 32), (20, 64), (97, 13)]  # (width, height): portrait, landscape, ...
MODES = ["RGB", "L", "LA", "RGBA", "P", "P+transparency", "1", "I;16", "CMYK"]


def _image(mode, size, rng):
    w, h = size
    rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    if mode == "I;16":
        return Image.fromarray(rng.integers(0, 65536, (h, w), dtype=np.uint16))
    if mode == "RGBA":
        return Image.fromarray(np.dstack([rgb, rgb[..., :1]]))
    if mode == "P+transparency":
        im = Image.fromarray(rgb).convert("P")
        im.info["transparency"] = 0
        return im
    return Image.fromarray(rgb).convert(mode)


def make_mixed_folder(root, classes=("a", "b"), per_class=9, seed=0):
    """ROOT/{train,val}/<class>/* with every shape and mode above (CMYK as JPEG, the rest PNG)."""
    rng = np.random.default_rng(seed)
    k = 0
    for split in ("train", "val"):
        for c in classes:
            os.makedirs(os.path.join(root, split, c), exist_ok=True)
            for i in range(per_class):
                mode, size = MODES[k % len(MODES)], SHAPES[k % len(SHAPES)]
                k += 1
                ext = "jpg" if mode == "CMYK" else "png"
                _image(mode, size, rng).save(os.path.join(root, split, c, f"{i:02d}.{ext}"))
    return root


def _config(root, crop, size=24):
    import configs

    return configs.load_config(os.path.join(ROOT, "configs", "small_images.yaml"),
                               [f"data.root={root}", f"data.train_crop={crop}", f"data.image_size={size}",
                                "data.num_workers=0", "data.batch_size=4", "data.eval_batch_size=5",
                                "data.calib_fraction=0"])


@pytest.mark.parametrize("crop", ["pad", "rrc"])
def test_every_shape_and_mode_gives_square_batches(tmp_path, crop):
    import data
    import models

    root = make_mixed_folder(str(tmp_path / "mixed"))
    cfg = _config(root, crop)
    size = cfg.data.image_size
    model = models.create_classifier(cfg.model, cfg.head, 2, img_size=cfg.data.image_size).eval()
    for split in ("train", "val"):
        ds = data.build_dataset(cfg.data, split)
        assert len(ds) == 18
        if split == "train":
            loader = data.build_train_loader(ds, cfg.data, seed=0, epoch=0, rank=0, world_size=1)
        else:
            loader = data.build_eval_loader(ds, cfg.data, rank=0, world_size=1)
        seen = 0
        for images, labels in loader:
            assert images.shape[1:] == (3, size, size) and images.dtype == torch.float32
            assert torch.isfinite(images).all()
            with torch.no_grad():
                assert model(images).shape == (len(images), 2)  # the model takes them as they are
            seen += len(labels)
        assert seen == (16 if split == "train" else 18)  # train: whole batches of 4


def test_pad_eval_centre_crops_a_non_square_image(tmp_path):
    """A 40x48 (portrait) image: resize the shorter side to 24 (24x28), then keep the centre 24x24."""
    from torchvision.transforms import functional as TF

    from data.transforms import build_eval_transform

    cfg = _config(str(tmp_path), "pad")
    im = _image("RGB", (40, 48), np.random.default_rng(1))
    x = build_eval_transform(cfg.data, None)(im)
    resized = TF.resize(im, 24, interpolation=TF.InterpolationMode.BICUBIC)
    assert resized.size == (24, 28)
    top = 2  # torchvision's CenterCrop: round((28 - 24) / 2)
    reference = TF.normalize(TF.to_tensor(resized)[:, top:top + 24, :], cfg.data.mean, cfg.data.std)
    assert x.shape == (3, 24, 24) and torch.allclose(x, reference, atol=1e-6)


def test_a_transform_of_the_wrong_size_is_named_as_the_cause(tmp_path):
    from torchvision import transforms as T

    from common.errors import UserError
    from data.imagefolder import ImageFolderDataset
    from data.loaders import _BatchFetcher

    path = str(tmp_path / "x.png")
    _image("RGB", (40, 48), np.random.default_rng(2)).save(path)
    ds = ImageFolderDataset([(path, 0)], ["a"])
    fetcher = _BatchFetcher(ds, T.Compose([T.Resize(24), T.ToTensor()]), replace_corrupt=False, image_size=24)
    out = fetcher[([0], None)]
    assert "error" in out
    with pytest.raises(UserError, match=r"eval transform turned a 40x48 image into 24x28, not data.image_size=24"):
        raise UserError(out["error"])
