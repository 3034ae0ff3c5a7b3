"""The built-in out-of-distribution sets (builtin10_ood / builtin100_ood): deterministic, loadable by
name through build_dataset, and made of outlines that are not poses of any in-distribution shape."""
import hashlib
import math

import pytest
import torch

import data
from configs.schema import DataConfig
from data import builtin


@pytest.fixture
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _digests(images):
    return {hashlib.sha1(x.numpy().tobytes()).hexdigest() for x in images}


def test_ood_split_is_deterministic_balanced_and_new(tmp_path, one_thread):
    a = builtin.generate(10, 200, 32, 0, 2, family="ood")
    b = builtin.generate(10, 200, 32, 0, 2, family="ood")
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    in_dist = builtin.generate(10, 200, 32, 0, 2)
    assert not _digests(a[0]) & _digests(in_dist[0])
    cfg = DataConfig(dataset="builtin10_ood", builtin_train_size=100, builtin_val_size=200, cache_dir=str(tmp_path))
    ds = data.build_dataset(cfg, "val")
    assert data.num_classes(cfg) == 10 and ds.num_classes == 10
    assert torch.equal(ds.images, a[0]) and torch.equal(ds.labels, a[1])
    assert torch.bincount(ds.labels, minlength=10).tolist() == [20] * 10
    assert any("builtin10_ood" in f for f in (p.name for p in tmp_path.iterdir()))  # own cache file
    again = data.build_dataset(cfg, "val")  # served from the caches: same bytes
    assert torch.equal(again.images, a[0])
    # the in-distribution dataset of the same configuration is untouched by the OOD cache
    in_cfg = DataConfig(dataset="builtin10", builtin_train_size=100, builtin_val_size=200, cache_dir=str(tmp_path))
    assert torch.equal(data.build_dataset(in_cfg, "val").images, in_dist[0])
    cfg100 = DataConfig(dataset="builtin100_ood", builtin_val_size=200, cache_dir=str(tmp_path))
    ds100 = data.build_dataset(cfg100, "val")
    assert ds100.num_classes == 100 and ds100.images.shape == (200, 3, 32, 32)
    assert not _digests(ds100.images) & _digests(builtin.generate(100, 200, 32, 0, 2)[0])
    with pytest.raises(ValueError, match="family"):
        builtin.generate(10, 10, 32, 0, 2, family="odd")


def _pose_masks(name, grid, rotations, log_aspects, log_scales):
    """Masks (P, H, W) of `name` under every pose of the grid, each centred on its centroid."""
    yy, xx = grid
    masks = []
    for theta in rotations:
        cos, sin = math.cos(theta), math.sin(theta)
        for la in log_aspects:
            for ls in log_scales:
                sx, sy = math.exp(ls + la / 2), math.exp(ls - la / 2)
                shift_y = shift_x = 0.0
                for _ in range(2):  # render, then re-render shifted so the centroid sits at the origin
                    x, y = xx + shift_x, yy + shift_y
                    m = builtin.shape_sdf(name, (cos * x + sin * y) / sx, (-sin * x + cos * y) / sy) < 0
                    w = m.sum()
                    shift_x, shift_y = shift_x + float((m * xx).sum() / w), shift_y + float((m * yy).sum() / w)
                masks.append(m)
    return torch.stack(masks)


def _best_iou(fixed, posed):
    inter = (fixed[None] & posed).flatten(1).sum(1)
    union = (fixed[None] | posed).flatten(1).sum(1)
    return float((inter / union).max())


def test_ood_outlines_are_not_poses_of_in_distribution_shapes(one_thread):
    """Best overlap (IoU) of each OOD outline with any in-distribution shape, over the relative poses
    the renderer can produce (rotation within +-60 deg, aspect and scale ratios), must stay below
    both 0.75 and the overlap of the two closest in-distribution shapes (disk and square, ~0.8):
    an OOD outline is further from every class than the classes are from each other."""
    size = 64
    coords = (torch.arange(size) + 0.5) / size * 4 - 2
    grid = torch.meshgrid(coords, coords, indexing="ij")
    rotations = torch.linspace(-2 * builtin.MAX_ROTATION, 2 * builtin.MAX_ROTATION, 13).tolist()
    log_aspects = [-0.3, 0.0, 0.3]
    log_scales = torch.linspace(math.log(2 / 3), math.log(1.5), 5).tolist()
    posed = {name: _pose_masks(name, grid, rotations, log_aspects, log_scales) for name in builtin.SHAPES}
    canonical = {name: _pose_masks(name, grid, [0.0], [0.0], [0.0])[0]
                 for name in builtin.SHAPES + builtin.OOD_SHAPES}
    closest_in_dist = max(_best_iou(canonical[a], posed[b]) for a in builtin.SHAPES for b in builtin.SHAPES
                          if a != b)
    assert closest_in_dist > 0.75  # disk vs square: the yardstick is meaningful
    for ood_name in builtin.OOD_SHAPES:
        assert ood_name not in builtin.SHAPES
        worst = max(_best_iou(canonical[ood_name], posed[name]) for name in builtin.SHAPES)
        assert worst < min(0.75, closest_in_dist), ood_name
