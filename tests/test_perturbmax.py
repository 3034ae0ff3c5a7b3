"""head.name=perturbmax (models/perturbmax.py): the Monte-Carlo perturbed argmax and its perturbed
Fenchel-Young loss (Berthet et al. 2020), checked against their closed forms for Gumbel noise at
sigma = 1 (softmax and cross-entropy), within the Monte-Carlo error of the draws."""
import math

import pytest
import torch
import torch.nn.functional as F

from common.errors import UserError
from models.heads import build_output_head
from models.perturbmax import EVAL_SEED, perturbmax, perturbmax_loss


def _z(rows=6, K=8, seed=0):
    return torch.randn(rows, K, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _mc_bound(p, M, k=5.0):
    """k standard errors of a frequency over M draws (+ 1/M for the rounding of counts)."""
    return k * torch.sqrt(p * (1 - p) / M) + 1.0 / M


def test_gumbel_sigma_one_converges_to_softmax_within_mc_error():
    z = _z()
    ref = torch.softmax(z, -1)
    errors = []
    for M in (64, 1024, 16384):
        p = perturbmax(z, sigma=1.0, samples=M, noise="gumbel", seed=3, step=1)
        assert torch.allclose(p.sum(-1), torch.ones(6, dtype=z.dtype))
        assert ((p - ref).abs() <= _mc_bound(ref, M)).all(), M
        errors.append(float((p - ref).abs().max()))
    assert errors[-1] < errors[0] / 4  # ~1/sqrt(M)


def test_loss_and_its_gradient_converge_to_cross_entropy():
    z = _z().requires_grad_()
    y = torch.tensor([0, 3, 5, 7, 1, 2])
    ce = F.cross_entropy(z, y, reduction="sum")
    g_ce, = torch.autograd.grad(ce, z)
    M = 16384
    loss = perturbmax_loss(z, y, sigma=1.0, samples=M, noise="gumbel", seed=1, step=2, reduction="sum")
    g, = torch.autograd.grad(loss, z)
    # the max of Gumbel-perturbed logits has s.d. pi / sqrt(6) per draw: 6 rows, 5 standard errors
    assert abs(float(loss - ce)) < 5 * math.pi / math.sqrt(6) * math.sqrt(6 / M)
    assert ((g - g_ce).abs() <= _mc_bound(torch.softmax(z, -1).detach(), M)).all()
    q = torch.softmax(_z(seed=1), -1)  # soft targets: gradient p - q
    g_soft, = torch.autograd.grad(perturbmax_loss(z, q, samples=M, seed=1, step=2, reduction="sum"), z)
    assert ((g_soft - (torch.softmax(z, -1) - q)).abs() <= _mc_bound(torch.softmax(z, -1).detach(), M)).all()


def test_mapping_backward_estimates_the_softmax_jacobian():
    z = _z(rows=3, K=5).requires_grad_()
    w = _z(rows=3, K=5, seed=4)
    g_ref, = torch.autograd.grad((torch.softmax(z, -1) * w).sum(), z)
    g, = torch.autograd.grad((perturbmax(z, samples=200000, seed=5, step=0) * w).sum(), z)
    torch.testing.assert_close(g, g_ref, atol=0.03, rtol=0)


@pytest.mark.parametrize("noise", ["gaussian", "gumbel"])
def test_small_sigma_is_the_one_hot_argmax(noise):
    z = _z()
    p = perturbmax(z, sigma=1e-6, samples=32, noise=noise)
    assert torch.equal(p, F.one_hot(z.argmax(-1), 8).to(p.dtype))
    z[2, :4] = float("-inf")
    z[3] = float("-inf")
    p = perturbmax(z, sigma=1.0, samples=256, noise=noise)
    assert (p[2, :4] == 0).all() and (p[3] == 0).all()
    assert torch.allclose(p[[0, 1, 2, 4, 5]].sum(-1), torch.ones(5, dtype=z.dtype))


def test_deterministic_given_seed_and_step():
    z = _z()
    a = perturbmax(z, samples=16, seed=7, step=3)
    assert torch.equal(a, perturbmax(z, samples=16, seed=7, step=3))
    assert not torch.equal(a, perturbmax(z, samples=16, seed=7, step=4))
    assert not torch.equal(a, perturbmax(z, samples=16, seed=8, step=3))
    head = build_output_head("perturbmax", samples=16).eval()
    assert torch.equal(head(z), head(z)) and torch.equal(head(z), perturbmax(z, samples=16, seed=EVAL_SEED, step=0))
    y = torch.arange(6)
    assert torch.equal(head.loss(z, y), head.loss(z, y))  # eval: the fixed draw, no step taken
    head.train()
    steps = head.draw_step
    first, second = head.loss(z, y), head.loss(z, y)
    assert head.draw_step == steps + 2 and not torch.equal(first, second)  # a new draw per training step
    torch.manual_seed(123)
    again = build_output_head("perturbmax", samples=16).train()
    torch.manual_seed(123)
    twin = build_output_head("perturbmax", samples=16).train()
    assert torch.equal(again.loss(z, y), twin.loss(z, y))  # same run seed, same step: same draw


def test_training_draws_follow_torchs_seed_so_a_resumed_run_draws_the_same():
    """train.py reseeds torch before every micro-batch from (run seed, update, micro-batch, rank): the
    draws must depend on that seed alone, not on how many steps this process (or head) has taken."""
    z, y = _z(), torch.arange(6)
    long_lived = build_output_head("perturbmax", samples=16).train()
    per_update = []
    for update in range(3):
        torch.manual_seed(1000 + update)  # what reseed(seed, "step", update, micro, rank) does
        per_update.append(long_lived.loss(z, y))
    resumed = build_output_head("perturbmax", samples=16).train()  # a new process at update 2
    torch.manual_seed(1002)
    assert torch.equal(resumed.loss(z, y), per_update[2])
    assert not torch.equal(per_update[0], per_update[1])  # and each update draws anew


@pytest.mark.parametrize("settings,needle", [(dict(sigma=0.0), "head.sigma"), (dict(samples=0), "head.samples"),
                                             (dict(noise="uniform"), "head.noise")])
def test_bad_settings_are_one_line_user_errors(settings, needle):
    with pytest.raises(UserError, match=needle):
        build_output_head("perturbmax", **settings)
