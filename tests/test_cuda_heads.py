"""On a real GPU (skipped without one; run by scripts/gpu_check.sh): every head's probabilities,
loss and gradients on CUDA, taken by the device path under CUDA's own sync checker
(torch.cuda.set_sync_debug_mode("error")), equal the CPU path's in float64.

The CPU suite proves the device path free of host reads with a dispatch-mode guard
(tests/test_no_sync.py); this is the same claim checked by CUDA itself.
"""
import pytest
import torch

from models.heads import HEAD_NAMES, OutputHead
from models.mappings import threshold_path
from models.registry import HEADS

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SETTINGS = {"entmax_bisect": dict(alpha=1.3, learn_alpha=True), "sparse_softmax": dict(k=5)}


def _run(head, logits, target, soft):
    z = logits.clone().requires_grad_()
    probs = head(z)
    loss = head.loss(z, target, label_smoothing=0.0 if soft else 0.1)
    loss.backward()
    return probs.detach(), loss.detach(), z.grad


@pytest.mark.parametrize("soft", [False, True], ids=["hard", "soft"])
@pytest.mark.parametrize("name", HEAD_NAMES)
def test_device_path_matches_cpu_without_syncs(name, soft):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 100, generator=g, dtype=torch.float64) * 3
    logits[0, 10:] = float("-inf")  # a masked row
    if soft:  # no mass on the masked classes: there a Fenchel-Young loss is +inf (-<z, q> with z = -inf)
        target = torch.softmax(torch.randn(64, 100, generator=g, dtype=torch.float64), -1)
        target[0, 10:] = 0.0
        target[0] /= target[0].sum()
    else:
        target = torch.randint(0, 10, (64,), generator=g)
    head_cpu = OutputHead(name, **SETTINGS.get(name, {})).double().train()
    head_gpu = OutputHead(name, **SETTINGS.get(name, {})).double().train().cuda()
    head_gpu.load_state_dict(head_cpu.state_dict())
    expected = _run(head_cpu, logits, target, soft)
    z, t = logits.cuda(), target.cuda()
    _run(head_gpu, z, t, soft)  # first call: lazy CUDA init may sync, which is not the step's doing
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with threshold_path("device"):
            got = _run(head_gpu, z, t, soft)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    if HEADS[name].draws:  # a random head: CUDA's generator draws other noise than the CPU's
        for e, o, what in zip(expected, got, ("probabilities", "loss", "gradient")):
            assert o.shape == e.shape and torch.isfinite(o).all(), f"{name} {what}"
        torch.testing.assert_close(got[0].sum(-1).cpu(), expected[0].sum(-1), msg=f"{name} rows sum to 1")
        return
    for e, o, what in zip(expected, got, ("probabilities", "loss", "gradient")):
        torch.testing.assert_close(o.cpu(), e, rtol=1e-6, atol=1e-8, msg=f"{name} {what}")


@pytest.mark.parametrize("smoothing", [0.0, 0.1], ids=["indices", "dense"])
@pytest.mark.parametrize("name", [n for n in HEAD_NAMES if not HEADS[n].draws])
def test_compiled_loss_has_the_eager_gradient_on_cuda(name, smoothing):
    """train.compile (auto: on CUDA) compiles the model with the head's loss: its loss and gradient
    must be the eager ones. A wrong gradient there trains without learning."""
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(64, 10, generator=g) * 3).cuda()
    target = torch.randint(0, 10, (64,), generator=g).cuda()
    head = OutputHead(name, **SETTINGS.get(name, {})).cuda().train()

    def loss_of(z):
        return head.loss(z, target, label_smoothing=smoothing)

    results = []
    for fn in (loss_of, torch.compile(loss_of)):
        z = logits.clone().requires_grad_()
        loss = fn(z)
        loss.backward()
        results.append((loss.detach(), z.grad))
    (eager_loss, eager_grad), (compiled_loss, compiled_grad) = results
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6, msg=f"{name}: compiled loss")
    torch.testing.assert_close(compiled_grad, eager_grad, rtol=1e-4, atol=1e-6, msg=f"{name}: compiled gradient")
    assert eager_grad.abs().sum() > 0


def test_compiled_forward_loss_has_the_eager_gradients_on_cuda():
    """training/run.py's forward_loss (model + head's loss as one compiled function) against eager, on
    every parameter of a tiny ResMLP."""
    from configs.schema import HeadConfig, ModelConfig
    from models import create_classifier
    from training.run import build_forward_loss

    torch._dynamo.reset()
    torch.manual_seed(0)
    model = create_classifier(ModelConfig(name="resmlp_tiny"), HeadConfig(), 10, img_size=16).cuda().train()
    images, target = torch.randn(32, 3, 16, 16).cuda(), torch.randint(0, 10, (32,)).cuda()
    grads = []
    for setting in ("false", "true"):
        model.zero_grad(set_to_none=True)
        forward_loss = build_forward_loss(setting, model, model.output_head, 0.0, torch.device("cuda"))
        forward_loss(images, target).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    eager, compiled = grads
    for n in eager:
        torch.testing.assert_close(compiled[n], eager[n], rtol=1e-3, atol=1e-5, msg=f"compiled gradient of {n}")
    assert eager["head.weight"].abs().sum() > 0 or eager["head.bias"].abs().sum() > 0
