"""The generated far-OOD sets (data/far_ood.py): declared datasets of any image size, a pure
function of their settings, and what their names say (flat noise; smooth blobs)."""
import torch

import data
from configs.loader import config_from_dict
from data import far_ood


def _val(name, **extra):
    cfg = config_from_dict({"data": {"dataset": name, "builtin_val_size": 40, **extra}})
    return data.build_dataset(cfg.data, "val")


def test_far_sets_are_declared_deterministic_and_of_any_size():
    for kind in far_ood.KINDS:
        name = f"{kind}_ood"
        assert name in data.dataset_names() and not data.dataset_spec(name).files
        ds = _val(name, image_size=24)
        assert len(ds) == 40 and ds.images.shape == (40, 3, 24, 24) and ds.images.dtype == torch.uint8
        assert torch.equal(ds.images, _val(name, image_size=24).images)
        assert not torch.equal(ds.images, _val(name, image_size=24, builtin_seed=1).images)
        assert not torch.equal(far_ood.generate(kind, 8, 16, 0, 1), far_ood.generate(kind, 8, 16, 0, 2))  # train != val


def test_noise_is_flat_and_blobs_are_smooth():
    noise, blobs = (far_ood.generate(k, 64, 32, 0, 2).float() / 255 for k in far_ood.KINDS)
    assert abs(noise.mean() - 0.5) < 0.01 and abs(noise.std() - (1 / 12) ** 0.5) < 0.01  # uniform on [0, 1]

    def step(x):  # mean absolute difference of horizontal neighbours
        return (x[..., 1:] - x[..., :-1]).abs().mean()

    assert step(blobs) < 0.05 < 0.3 < step(noise)
