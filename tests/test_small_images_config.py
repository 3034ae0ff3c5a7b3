"""configs/small_images.yaml: an ImageFolder config with pad-crop and no flip, for small or
orientation-sensitive images (what ImageNet's RandomResizedCrop + flip defaults get wrong)."""
import os

import numpy as np
import torch
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _ramp_image(size=32):
    """Dark on the left, bright on the right: a horizontal flip reverses the ramp."""
    ramp = np.tile(np.linspace(0, 255, size, dtype=np.float64), (size, 1))
    return Image.fromarray(np.stack([ramp] * 3, axis=-1).astype(np.uint8))


def test_small_images_config_pad_crops_without_flipping():
    import configs
    from data.transforms import build_eval_transform, build_train_transform, train_crop_mode

    cfg = configs.load_config(os.path.join(ROOT, "configs", "small_images.yaml"), ["data.root=unused"])
    assert cfg.data.dataset == "imagefolder" and train_crop_mode(cfg.data) == "pad" and cfg.data.hflip == 0.0
    # the same dataset with the defaults would use ImageNet's crop: the config is what changes it
    default = configs.load_config(os.path.join(ROOT, "configs", "small_images.yaml"),
                                  ["data.train_crop=auto", "data.hflip=0.5"])
    assert train_crop_mode(default.data) == "rrc"

    train = build_train_transform(cfg.data, None)
    size, pad = cfg.data.image_size, cfg.data.crop_padding
    torch.manual_seed(0)
    image = _ramp_image()
    reference = build_eval_transform(cfg.data, None)(image)
    assert reference.shape == (3, size, size)
    shifts = set()
    for _ in range(40):
        x = train(image)
        assert x.shape == (3, size, size)
        # away from the zero padding the ramp still rises left to right: never mirrored
        inner = x[0, pad:-pad, pad:-pad]
        assert (inner[:, 1:] >= inner[:, :-1] - 1e-4).all()
        # a pad-crop only shifts: the inner columns equal the eval image's, offset by at most `pad`
        matches = [d for d in range(-pad, pad + 1)
                   if torch.allclose(inner, reference[0, pad:-pad, pad + d:size - pad + d], atol=1e-4)]
        assert matches, "not a shifted copy of the image"
        shifts.add(matches[0])
    assert len(shifts) > 1  # it does shift
