"""The device path of every mapping and loss never reads a value on the host.

Everything runs on CPU tensors with the device path forced (models.mappings.threshold_path) under
tests/sync_guard.py, which fails on each op that would make the host wait for the GPU on CUDA.
The first tests prove that the guard itself catches what it must (a later `.item()` or boolean-
mask indexing in the heads fails these tests), the last ones run the heads under it.
"""
import pytest
import torch

from models import head_targets, thresholds_device
from models.heads import (
    OutputHead,
    entmax15,
    entmax15_loss,
    entmax_bisect,
    entmax_bisect_loss,
    softmax,
    softmax_loss,
    sparsemax,
    sparsemax_loss,
)
from models.ksubset import ksubset, ksubset_loss
from models.mappings import threshold_path
from sync_guard import BLOCKED_OPS, HostSyncError, no_host_sync

NEG_INF = float("-inf")


# ------------------------------------------------------------------------------- the guard itself
def _x(shape=(4, 6), seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


HOST_READS = {
    "item": lambda x: x.sum().item(),
    "bool": lambda x: bool((x > 0).any()),
    "python if": lambda x: 1 if (x > 0).all() else 0,
    "float": lambda x: float(x.max()),
    "int": lambda x: int(x.argmax()),
    "bool mask indexing": lambda x: x[x > 0],
    "bool mask assignment": lambda x: x.clone().__setitem__(x > 0, 0.0),
    "bool mask index_put_": lambda x: x.clone().index_put_((x > 0,), torch.zeros(())),
    "nonzero": lambda x: (x > 0).nonzero(),
    "where with one argument": lambda x: torch.where(x > 0),
    "argwhere": lambda x: torch.argwhere(x > 0),
    "masked_select": lambda x: x.masked_select(x > 0),
    "unique": lambda x: torch.unique(x),
    "unique_consecutive": lambda x: torch.unique_consecutive(x),
    "equal": lambda x: torch.equal(x, x),
    "allclose": lambda x: torch.allclose(x, x),
    "repeat_interleave by tensor": lambda x: torch.repeat_interleave(x[0], (x[1] > 0).long()),
    "bincount": lambda x: torch.bincount((x > 0).long().flatten()),
    "masked_fill with a tensor value": lambda x: x.masked_fill(x > 0, x.max()),
    "tolist": lambda x: x.tolist(),
    "numpy": lambda x: x.numpy(),
    "cpu": lambda x: x.cpu(),
    "linalg error check": lambda x: torch.linalg.inv(x[:4, :4]),
}


@pytest.mark.parametrize("name", list(HOST_READS))
def test_guard_catches_host_reads(name):
    x = _x()
    HOST_READS[name](x)  # fine outside the guard
    with pytest.raises(HostSyncError, match="would sync with the GPU"):
        with no_host_sync():
            HOST_READS[name](x)


NO_HOST_READS = {
    "where with three arguments": lambda x: torch.where(x > 0, x, 0.0),
    "masked_fill with a number": lambda x: x.masked_fill(x > 0, 0.0),
    "sort and topk": lambda x: (x.sort(-1).values, x.topk(2, -1).indices),
    "long-index gather": lambda x: x.gather(1, x.argmax(1, keepdim=True)),
    "long-tensor indexing": lambda x: x[x.argmax(0)],
    "repeat_interleave with output_size": lambda x: torch.repeat_interleave(
        x[0], torch.ones(6, dtype=torch.long), output_size=6),
    "reductions stay tensors": lambda x: (x.max(), x.any(), (x > 0).sum(), x.amax(-1)),
    "dtype conversion": lambda x: x.to(torch.float64),
    "slice assignment of a number": lambda x: x.clone().__setitem__((slice(None), 0), 0.0),
    "backward": lambda x: (x.clone().requires_grad_() * 2).sum().backward(),
}


@pytest.mark.parametrize("name", list(NO_HOST_READS))
def test_guard_lets_device_side_ops_through(name):
    with no_host_sync():
        NO_HOST_READS[name](_x())


def test_guard_blocks_tensors_made_from_host_data_when_asked():
    with no_host_sync():
        torch.tensor(1.5)
    with pytest.raises(HostSyncError, match="host data"):
        with no_host_sync(block_host_data=True):
            torch.tensor(1.5)


def test_guard_exclusions_are_by_identity_and_named():
    step = torch.tensor(3.0)
    reason = "the optimizer's step counter is a CPU tensor by design"
    with no_host_sync(allow=[(step, reason)]) as guard:
        assert step.item() == 3.0
        assert float(step) == 3.0
    assert guard.allowed[reason] == 2
    for other in (step.clone(), step.view(1), step + 0):  # equal values, not the same tensor
        with pytest.raises(HostSyncError):
            with no_host_sync(allow=[(step, reason)]):
                other.sum().item()
    with pytest.raises(TypeError, match="reason"):
        with no_host_sync(allow=[step]):
            pass
    with pytest.raises(TypeError, match="reason"):
        with no_host_sync(allow=[(step, " ")]):
            pass


def test_guard_fails_even_when_the_error_is_swallowed():
    def swallowing():
        try:
            _x().sum().item()
        except Exception:
            pass

    with pytest.raises(HostSyncError, match="swallowed"):
        with no_host_sync():
            swallowing()


def test_guard_sees_host_reads_in_backward():
    class ReadsInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * float(g.abs().max())

    x = _x().requires_grad_()
    with pytest.raises(HostSyncError):
        with no_host_sync():
            ReadsInBackward.apply(x).sum().backward()


def test_guard_restores_tensor_methods():
    with no_host_sync():
        pass
    assert _x().tolist() and _x().cpu() is not None and _x().numpy().shape == (4, 6)


def test_guard_catches_an_item_added_to_the_device_threshold(monkeypatch):
    original = thresholds_device.sparsemax_tau_sorted

    def with_item(zs, dim):
        if zs.max().item() > 1.0:  # the kind of check someone might add
            raise AssertionError("unreachable: zs <= 0")
        return original(zs, dim)

    monkeypatch.setattr(thresholds_device, "sparsemax_tau_sorted", with_item)
    x = _x((3, 20)).requires_grad_()
    with threshold_path("device"):
        sparsemax(x)  # still correct without the guard
        with pytest.raises(HostSyncError, match="_local_scalar_dense"):
            with no_host_sync():
                sparsemax(x)


def test_guard_catches_bool_mask_indexing_added_to_a_loss(monkeypatch):
    original = head_targets.dense_target

    def with_mask_indexing(zf, target, label_smoothing, ignore_index):
        q, valid = original(zf, target, label_smoothing, ignore_index)
        q[q < 0] = 0.0  # the kind of clean-up someone might add
        return q, valid

    monkeypatch.setattr(head_targets, "dense_target", with_mask_indexing)
    x = _x((3, 20))
    y = torch.tensor([1, 2, 3])
    with threshold_path("device"):
        with pytest.raises(HostSyncError, match="boolean-mask indexing"):
            with no_host_sync():
                entmax15_loss(x, y, label_smoothing=0.1)


@pytest.mark.parametrize("f", [sparsemax, entmax15, lambda v: entmax_bisect(v, 1.3)])
def test_cpu_path_does_read_on_the_host(f):
    # The CPU fast path stops its loops on host reads: the guard must see them, else the
    # device-path tests below would prove nothing.
    with threshold_path("cpu"):
        with pytest.raises(HostSyncError):
            with no_host_sync():
                f(_x((4, 100)))


# ------------------------------------------------------------------------------- the heads under it
def _logits(K, dtype=torch.float32, seed=1):
    """8 rows: random, -inf masks, one all -inf row, ties, a near one-hot row."""
    x = torch.randn(8, K, generator=torch.Generator().manual_seed(seed)) * 2
    x[1] = NEG_INF
    x[2, : K // 2] = NEG_INF
    x[3, K // 3:] = NEG_INF
    x[4] = 0.5
    x[5, 0] = 50.0
    return x.to(dtype)


def _alphas(rows):
    return {
        "float": 1.3,
        "learned scalar": torch.tensor(1.45, requires_grad=True),
        "learned per row": torch.linspace(1.1, 1.9, rows).unsqueeze(1).requires_grad_(),
        "near one per row": torch.tensor([[1.0005], [1.5], [1.0], [1.2], [1.7], [1.3], [1.6], [1.99]],
                                         requires_grad=True),
    }


def _run_guarded(fn, x, extra_grads=()):
    """fn(x) forward and backward under the guard; returns the gradients (checked finite)."""
    x = x.clone().requires_grad_()
    with threshold_path("device"), no_host_sync(block_host_data=True) as guard:
        out = fn(x)
        # a weighted sum, so that the backward of a mapping is not trivially zero
        scalar = out.float().mul(torch.linspace(-1.0, 1.0, out.size(-1))).sum() if out.dim() > 1 else out.float().sum()
        grads = torch.autograd.grad(scalar, (x,) + tuple(extra_grads))
    assert not guard.violations and not guard.allowed
    for g in grads:
        assert torch.isfinite(g.float()).all()
    return grads


MAPPING_CASES = ["softmax", "sparsemax", "entmax15", "entmax_bisect"]


@pytest.mark.parametrize("name", MAPPING_CASES)
@pytest.mark.parametrize("K", [10, 300, 1100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mappings_forward_backward_without_host_reads(name, K, dtype):
    x = _logits(K, dtype)
    if name != "entmax_bisect":
        f = {"softmax": softmax, "sparsemax": sparsemax, "entmax15": entmax15}[name]
        _run_guarded(f, x)
        _run_guarded(lambda v: f(v.transpose(0, 1), 0), x)  # another dim
        return
    for label, alpha in _alphas(8).items():
        extra = (alpha,) if isinstance(alpha, torch.Tensor) else ()
        grads = _run_guarded(lambda v: entmax_bisect(v, alpha), x, extra)
        if extra:
            assert grads[1].shape == alpha.shape, label
        _run_guarded(lambda v: entmax_bisect(v, alpha, n_iter=6), x, extra)
    a3 = torch.full((2, 1, 3), 1.4, requires_grad=True)  # per-slice alpha along dim 1 of a 3-D input
    _run_guarded(lambda v: entmax_bisect(v.reshape(2, 4, K).transpose(1, 2)[..., :3], a3, dim=1), x, (a3,))


def _targets(x):
    N, K = x.shape
    g = torch.Generator().manual_seed(7)
    y = torch.randint(0, K, (N,), generator=g)
    finite = x.float() > NEG_INF
    y = torch.where(finite.gather(1, y.unsqueeze(1)).squeeze(1), y, finite.float().argmax(1))
    y_ignored = y.clone()
    y_ignored[[0, 6]] = -100
    q = torch.rand(N, K, generator=g) * finite
    q = q / q.sum(-1, keepdim=True).clamp(min=1e-12)
    return {"hard": (y, {}), "hard ignore_index": (y_ignored, {}), "soft": (q, {}),
            "label_smoothing": (y_ignored, {"label_smoothing": 0.1})}


LOSS_CASES = {
    "softmax": lambda z, t, **k: softmax_loss(z, t, **k),
    "sparsemax": lambda z, t, **k: sparsemax_loss(z, t, **k),
    "entmax15": lambda z, t, **k: entmax15_loss(z, t, **k),
}


@pytest.mark.parametrize("name", list(LOSS_CASES) + ["entmax_bisect"])
@pytest.mark.parametrize("K", [10, 1100])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_losses_forward_backward_without_host_reads(name, K, reduction):
    x = _logits(K)
    for target_kind, (target, kw) in _targets(x).items():
        if name in LOSS_CASES:
            _run_guarded(lambda v: LOSS_CASES[name](v, target, reduction=reduction, **kw), x)
            continue
        for label, alpha in _alphas(8).items():
            if isinstance(alpha, torch.Tensor) and alpha.dim() > 0:
                alpha = alpha.detach().view(-1).requires_grad_()  # the loss takes per-row alpha as (N,)
            extra = (alpha,) if isinstance(alpha, torch.Tensor) else ()
            _run_guarded(lambda v: entmax_bisect_loss(v, target, alpha, reduction=reduction, **kw), x, extra)


def test_loss_modules_and_output_heads_without_host_reads():
    x = _logits(50)
    y = _targets(x)["hard ignore_index"][0]
    for loss in (lambda v: softmax_loss(v, y), lambda v: sparsemax_loss(v, y, label_smoothing=0.1),
                 lambda v: entmax15_loss(v, y, reduction="sum"),
                 lambda v: entmax_bisect_loss(v, y, alpha=1.7, ignore_index=-100)):
        _run_guarded(loss, x)
    for name in ("softmax", "sparsemax", "entmax15"):
        head = OutputHead(name)
        _run_guarded(head, x)
        _run_guarded(lambda v: head.loss(v, y, label_smoothing=0.1), x)
    learned = OutputHead("entmax_bisect", alpha=1.3, learn_alpha=True)
    g = _run_guarded(learned, x, (learned.alpha_logit,))
    assert g[1] != 0
    g = _run_guarded(lambda v: learned.loss(v, y), x, (learned.alpha_logit,))
    assert g[1] != 0
    fixed = OutputHead("entmax_bisect", alpha=1.3)
    _run_guarded(fixed, x)
    _run_guarded(lambda v: fixed.loss(v, y), x)


def test_guard_has_the_ops_the_issue_names():
    names = {str(op).split(".")[1] for op in BLOCKED_OPS}
    assert {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "item", "_unique",
            "_unique2", "unique_dim", "unique_consecutive", "equal", "allclose"} <= names


@pytest.mark.parametrize("noise", ["gumbel", "gaussian"])
def test_perturbmax_without_host_reads(noise):
    """The random head: noise from a generator seeded on the host (training) or keyed by the rows'
    ids (evaluation), fixed shapes, no reads."""
    x = _logits(50)
    targets = _targets(x)
    head = OutputHead("perturbmax", samples=8, noise=noise).train()
    _run_guarded(head, x)
    for target, kw in targets.values():
        _run_guarded(lambda v: head.loss(v, target, **kw), x)
    head.eval()
    ids = torch.arange(100, 100 + x.shape[0])
    _run_guarded(lambda v: head.loss(v, targets["hard"][0]), x)
    _run_guarded(lambda v: head(v, ids=ids), x)
    for target, kw in targets.values():
        _run_guarded(lambda v: head.loss(v, target, ids=ids, **kw), x)


def test_ksubset_mapping_and_loss_without_host_reads():
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(6)).requires_grad_()
    x.data[0, :5] = float("-inf")
    idx = torch.arange(12).view(6, 2) + 10
    with threshold_path("device"), no_host_sync(block_host_data=True) as guard:
        out = ksubset(x, 4).mul(torch.linspace(-1, 1, 40)).sum() + ksubset_loss(x, idx, 2)
        (grad,) = torch.autograd.grad(out, x)
    assert not guard.violations and torch.isfinite(grad).all()
