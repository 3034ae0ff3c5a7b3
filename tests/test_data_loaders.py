"""Loaders: in-memory vs PIL path, determinism under resume / workers, rank sharding, Mixup."""
import dataclasses

import numpy as np
import pytest
import torch

import data
from configs.schema import DataConfig
from data.samplers import train_batches


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny batches are many small ops: with other test processes on the 2 cores, one thread is
    several times faster than two fighting for them."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def builtin_ds(tmp_path_factory):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    cfg = DataConfig(dataset="builtin10", builtin_train_size=240, builtin_val_size=70,
                     cache_dir=str(tmp_path_factory.mktemp("cache")), batch_size=16, eval_batch_size=32, num_workers=0)
    out = cfg, data.build_dataset(cfg, "train"), data.build_dataset(cfg, "val")
    torch.set_num_threads(n)
    return out


def collect(loader):
    return [(x.clone(), y.clone()) for x, y in loader]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)


def test_in_memory_vs_pil_path_same_semantics(builtin_ds):
    cfg, tr, va = builtin_ds
    mem = dataclasses.replace(cfg, in_memory=True)
    pil = dataclasses.replace(cfg, in_memory=False)
    lm = data.build_train_loader(tr, mem, seed=1, epoch=0, rank=0, world_size=1)
    lp = data.build_train_loader(tr, pil, seed=1, epoch=0, rank=0, world_size=1)
    assert lm.uses_memory_path and not lp.uses_memory_path and len(lm) == len(lp) == 240 // 16
    (xm, ym), (xp, yp) = next(iter(lm)), next(iter(lp))
    assert xm.shape == xp.shape == (16, 3, 32, 32) and xm.dtype == xp.dtype == torch.float32
    assert torch.equal(ym, yp)  # same sample order on both paths
    lo, hi = (0 - 0.485) / 0.229, (1 - 0.406) / 0.225
    for x in (xm, xp):
        assert x.min() >= lo - 1e-4 and x.max() <= hi + 1e-4 and x.std() > 0.3
    # eval: no augmentation, so both paths give the same tensors (up to float rounding)
    em = collect(data.build_eval_loader(va, mem, rank=0, world_size=1))
    ep = collect(data.build_eval_loader(va, pil, rank=0, world_size=1))
    for (a, ya), (b, yb) in zip(em, ep):
        assert torch.equal(ya, yb) and torch.allclose(a, b, atol=1e-5)
    # the training crop is a shifted (maybe flipped) window of the image: with padding 0 and
    # no flip it is exactly the eval tensor, on both paths
    plain = dataclasses.replace(cfg, crop_padding=0, hflip=0.0)
    for mode in (True, False):
        c = dataclasses.replace(plain, in_memory=mode)
        x, y = next(iter(data.build_train_loader(tr, c, seed=1, epoch=0, rank=0, world_size=1)))
        idx = train_batches(len(tr), seed=1, epoch=0, rank=0, world_size=1, batch_size=16)[0][0]
        mean, std = torch.tensor(cfg.mean).view(1, 3, 1, 1), torch.tensor(cfg.std).view(1, 3, 1, 1)
        ref = (tr.images[torch.as_tensor(idx)].float() / 255 - mean) / std
        assert torch.equal(y, tr.labels[torch.as_tensor(idx)]) and torch.allclose(x, ref, atol=1e-5)


def test_augmentation_is_random_but_seeded(builtin_ds):
    cfg, tr, _ = builtin_ds
    a = collect(data.build_train_loader(tr, cfg, seed=0, epoch=0, rank=0, world_size=1))
    b = collect(data.build_train_loader(tr, cfg, seed=0, epoch=0, rank=0, world_size=1))
    c = collect(data.build_train_loader(tr, cfg, seed=0, epoch=1, rank=0, world_size=1))
    assert_same_batches(a, b)
    assert not torch.equal(a[0][1], c[0][1])  # new epoch, new order


@pytest.mark.parametrize("in_memory,aug", [(True, {}), (False, {"auto_augment": "rand-m9-mstd0.5-inc1"})])
def test_resume_at_start_batch_and_worker_independence(builtin_ds, in_memory, aug):
    cfg, tr, _ = builtin_ds
    cfg = dataclasses.replace(cfg, in_memory=in_memory, reprob=0.25, **aug)
    full = collect(data.build_train_loader(tr, cfg, seed=3, epoch=2, rank=0, world_size=1))
    torch.manual_seed(123)  # the caller's RNG state must not matter...
    resumed = collect(data.build_train_loader(tr, cfg, seed=3, epoch=2, rank=0, world_size=1, start_batch=9))
    assert_same_batches(full[9:], resumed)
    state = torch.get_rng_state()
    if not in_memory:
        w2 = dataclasses.replace(cfg, num_workers=2)
        resumed2 = collect(data.build_train_loader(tr, w2, seed=3, epoch=2, rank=0, world_size=1, start_batch=5))
        assert_same_batches(full[5:], resumed2)
    assert torch.equal(state, torch.get_rng_state())  # ...and the loader must not consume it


def test_two_rank_sharding_matches_one_process_double_batch(builtin_ds):
    cfg, tr, _ = builtin_ds
    one = collect(data.build_train_loader(tr, dataclasses.replace(cfg, batch_size=32), seed=5, epoch=1, rank=0,
                                          world_size=1))
    r0 = collect(data.build_train_loader(tr, cfg, seed=5, epoch=1, rank=0, world_size=2))
    r1 = collect(data.build_train_loader(tr, cfg, seed=5, epoch=1, rank=1, world_size=2))
    assert len(r0) == len(r1) == len(one) == 240 // 32
    for (x, y), (x0, y0), (x1, y1) in zip(one, r0, r1):
        # rank r holds positions r::2 of the global batch, with identical augmentation
        assert torch.equal(y[0::2], y0) and torch.equal(y[1::2], y1)
        assert torch.equal(x[0::2], x0) and torch.equal(x[1::2], x1)
    # every sample exactly once per epoch across ranks (n divisible by the global batch here)
    idx = np.concatenate([b[0] for r in (0, 1)
                          for b in train_batches(256, seed=5, epoch=1, rank=r, world_size=2, batch_size=16)])
    assert sorted(idx.tolist()) == list(range(256))


def test_uneven_shards_equal_batch_counts_and_repeated_aug():
    for n, ws, bs in ((103, 3, 4), (1000, 2, 16), (97, 4, 8)):
        counts = [len(train_batches(n, seed=0, epoch=0, rank=r, world_size=ws, batch_size=bs)) for r in range(ws)]
        assert len(set(counts)) == 1 and counts[0] == n // ws // bs
        idx = np.concatenate([b[0] for r in range(ws)
                              for b in train_batches(n, seed=0, epoch=0, rank=r, world_size=ws, batch_size=bs)])
        assert len(set(idx.tolist())) == len(idx)  # no sample twice in an epoch
    # repeated augmentation (timm RepeatAugSampler semantics): each index 3x in a row of the global order
    b0 = train_batches(1024, seed=0, epoch=0, rank=0, world_size=3, batch_size=8, repeated_aug=True)
    b1 = train_batches(1024, seed=0, epoch=0, rank=1, world_size=3, batch_size=8, repeated_aug=True)
    b2 = train_batches(1024, seed=0, epoch=0, rank=2, world_size=3, batch_size=8, repeated_aug=True)
    assert len(b0) == len(b1) == len(b2) == (1024 // 256 * 256 // 3) // 8
    assert np.array_equal(b0[0][0], b1[0][0]) and np.array_equal(b0[0][0], b2[0][0])  # 3 views of the same images
    assert len(set(b0[0][1].tolist() + b1[0][1].tolist())) == 16  # with different augmentation seeds
    other = train_batches(1024, seed=1, epoch=0, rank=0, world_size=3, batch_size=8, repeated_aug=True)
    assert not np.array_equal(other[0][0], b0[0][0])  # order depends on the seed, not only the epoch


def test_eval_loader_shards_without_padding(builtin_ds):
    cfg, _, va = builtin_ds
    seen = []
    for r in range(3):
        loader = data.build_eval_loader(va, cfg, rank=r, world_size=3)
        ys = torch.cat([y for _, y in loader])
        assert loader.num_samples == len(ys) == len(range(r, 70, 3))
        assert torch.equal(ys, va.labels[r::3])
        seen.append(len(ys))
    assert sum(seen) == 70


def test_mixup_soft_targets_rows_sum_to_one():
    assert data.build_mixup(DataConfig(), 10) is None
    cfg = DataConfig(mixup=0.8, cutmix=1.0, label_smoothing=0.1, batch_size=8)
    mix = data.build_mixup(cfg, 10)
    x, y = torch.randn(8, 3, 32, 32), torch.arange(8)
    np.random.seed(0)
    xm, t = mix(x.clone(), y)
    assert t.shape == (8, 10) and torch.allclose(t.sum(1), torch.ones(8))
    assert (t > 0).all() and not torch.equal(xm, x)  # smoothing spreads mass; images mixed


def test_randaugment_posterize_level_10_does_not_crash():
    """timm 'inc1' RandAugment can ask for 0 posterize bits, which Pillow >= 11 rejects."""
    from PIL import Image

    from data.transforms import build_train_transform

    tf = build_train_transform(DataConfig(auto_augment="rand-m9-mstd0.5-inc1"), 32)
    ops = [op for t in tf.transforms for s in getattr(t, "transforms", [t]) for op in getattr(s, "ops", [])]
    post = [op for op in ops if "Posterize" in op.name]
    assert post
    img = Image.fromarray(np.full((32, 32, 3), 200, np.uint8))
    assert np.asarray(post[0].aug_fn(img, 0)).max() == 0


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_in_memory_loader_on_cuda_matches_cpu(builtin_ds):
    cfg, tr, _ = builtin_ds
    cfg = dataclasses.replace(cfg, reprob=0.25)
    cpu = collect(data.build_train_loader(tr, cfg, seed=0, epoch=0, rank=0, world_size=1, start_batch=10))
    gpu = collect(data.build_train_loader(tr, cfg, seed=0, epoch=0, rank=0, world_size=1, start_batch=10,
                                          device="cuda"))
    for (a, ya), (b, yb) in zip(cpu, gpu):
        assert b.is_cuda and torch.equal(ya, yb.cpu())
        same = torch.isclose(a, b.cpu(), atol=1e-5)
        assert same.float().mean() > 0.9  # crop/flip identical; erased pixels come from the device RNG
