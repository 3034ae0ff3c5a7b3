"""head.name=perturbmax (models/perturbmax.py): the Monte-Carlo perturbed argmax and its perturbed
Fenchel-Young loss (Berthet et al. 2020), checked against their closed forms for Gumbel noise at
sigma = 1 (softmax and cross-entropy), within the Monte-Carlo error of the draws."""
import math

import pytest
import torch
import torch.nn.functional as F

from common.errors import UserError
from models.heads import OutputHead
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
    head = OutputHead("perturbmax", samples=16).eval()
    keyed = perturbmax(z, samples=16, seed=EVAL_SEED, ids=torch.arange(6))  # eval: rows keyed by position
    assert torch.equal(head(z), head(z)) and torch.equal(head(z), keyed)
    y = torch.arange(6)
    assert torch.equal(head.loss(z, y), head.loss(z, y))  # eval: the fixed draw, no step taken
    head.train()
    steps = head.draw_step
    first, second = head.loss(z, y), head.loss(z, y)
    assert head.draw_step == steps + 2 and not torch.equal(first, second)  # a new draw per training step
    torch.manual_seed(123)
    again = OutputHead("perturbmax", samples=16).train()
    torch.manual_seed(123)
    twin = OutputHead("perturbmax", samples=16).train()
    assert torch.equal(again.loss(z, y), twin.loss(z, y))  # same run seed, same step: same draw


def test_training_draws_follow_torchs_seed_so_a_resumed_run_draws_the_same():
    """train.py reseeds torch before every micro-batch from (run seed, update, micro-batch, rank): the
    draws must depend on that seed alone, not on how many steps this process (or head) has taken."""
    z, y = _z(), torch.arange(6)
    long_lived = OutputHead("perturbmax", samples=16).train()
    per_update = []
    for update in range(3):
        torch.manual_seed(1000 + update)  # what reseed(seed, "step", update, micro, rank) does
        per_update.append(long_lived.loss(z, y))
    resumed = OutputHead("perturbmax", samples=16).train()  # a new process at update 2
    torch.manual_seed(1002)
    assert torch.equal(resumed.loss(z, y), per_update[2])
    assert not torch.equal(per_update[0], per_update[1])  # and each update draws anew


@pytest.mark.parametrize("settings,needle", [(dict(sigma=0.0), "head.sigma"), (dict(samples=0), "head.samples"),
                                             (dict(noise="uniform"), "head.noise")])
def test_bad_settings_are_one_line_user_errors(settings, needle):
    with pytest.raises(UserError, match=needle):
        OutputHead("perturbmax", **settings)


# ---- the loss estimate is unbiased --------------------------------------------------------------------
MARGINS = torch.arange(-5.0, 10.0)  # the true class's logit minus the best other one
REPEATS = 1000  # independent rows per margin: the mean's standard error from their spread


def _margin_rows(K=10):
    """(margins x REPEATS, K) float64 logits with class 0 at each margin above the best of 9 random
    others, and the base rows (margins, K)."""
    others = torch.randn(len(MARGINS), K - 1, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    base = torch.cat([(others.max(-1).values + MARGINS.double()).unsqueeze(1), others], 1)
    return base.repeat_interleave(REPEATS, 0), base


def _estimates(z, target, noise, keyed, **kw):
    """Per-row loss estimates at M = 16 from the training draw (one generator) or the keyed eval draw."""
    ids = torch.arange(z.shape[0]) if keyed else None
    loss = perturbmax_loss(z, target, samples=16, noise=noise, seed=4, step=1, reduction="none", ids=ids, **kw)
    per_margin = loss.view(len(MARGINS), REPEATS)
    return per_margin.mean(1), per_margin.std(1) / math.sqrt(REPEATS)


def _cross_entropy(base, q):
    """-sum q log softmax(z), written out in float64."""
    return (torch.logsumexp(base, -1, keepdim=True) - base).mul(q).sum(-1)


def test_gumbel_loss_estimate_is_unbiased_for_cross_entropy(one_thread):
    """At sigma = 1 with Gumbel noise the mean of the M = 16 estimate is the cross-entropy, for hard,
    soft and label-smoothed targets, within 3 standard errors at every margin from -5 to +9 (a
    per-draw clamp at 0 made it +0.13 above at large margins); the eval draw's too (hard targets)."""
    z, base = _margin_rows()
    K = z.shape[1]
    hard = torch.zeros(len(z), dtype=torch.long)
    soft_base = torch.softmax(torch.randn(len(MARGINS), K, generator=torch.Generator().manual_seed(2)), -1).double()
    smoothed = F.one_hot(torch.zeros(len(MARGINS), dtype=torch.long), K).double() * 0.9 + 0.1 / K
    for target, q, kw, keyed in ((hard, F.one_hot(hard[::REPEATS], K).double(), {}, False),
                                 (soft_base.repeat_interleave(REPEATS, 0), soft_base, {}, False),
                                 (hard, smoothed, {"label_smoothing": 0.1}, False),
                                 (hard, F.one_hot(hard[::REPEATS], K).double(), {}, True)):
        mean, se = _estimates(z, target, "gumbel", keyed, **kw)
        exact = _cross_entropy(base, q)
        assert ((mean - exact).abs() <= 3 * se).all(), (mean - exact) / se


def _gaussian_expected_max(row):
    """E[max_i (z_i + Z_i)], Z i.i.d. N(0, 1), by 1-D quadrature: the integral of x d/dx prod Phi(x - z_i)."""
    from scipy import integrate

    z = row.tolist()

    def density(x):
        cdf = [0.5 * math.erfc((v - x) / math.sqrt(2)) for v in z]
        pdf = [math.exp(-0.5 * (x - v) ** 2) / math.sqrt(2 * math.pi) for v in z]
        return x * sum(pdf[i] * math.prod(cdf[:i] + cdf[i + 1:]) for i in range(len(z)))
    return integrate.quad(density, min(z) - 12, max(z) + 12, limit=200, epsabs=1e-10)[0]


def test_gaussian_loss_estimate_is_unbiased(one_thread):
    """Gaussian noise: the mean of the M = 16 estimate is E[max(z + Z)] - z_y (quadrature), within 3
    standard errors at every margin from -5 to +9, for the training and the eval draws."""
    z, base = _margin_rows()
    exact = torch.tensor([_gaussian_expected_max(row) for row in base], dtype=torch.float64) - base[:, 0]
    for keyed in (False, True):
        mean, se = _estimates(z, torch.zeros(len(z), dtype=torch.long), "gaussian", keyed)
        assert ((mean - exact).abs() <= 3 * se).all(), ((mean - exact) / se, keyed)


# ---- evaluation draws follow the example --------------------------------------------------------------
def test_eval_draws_follow_the_example_not_the_batch(one_thread):
    """In eval mode a row's probabilities and loss are a function of (its logits, its id): batch
    sizes 1, 7, 128 and 256 over the split, and two ranks' r::2 shards, give every example the same
    numbers as the whole split in one call (ids from data.samplers.eval_example_ids, as evaluate()
    makes them)."""
    from data.samplers import eval_batches, eval_example_ids
    from evaluation.metrics import example_records

    n, K = 260, 10
    z = torch.randn(n, K, generator=torch.Generator().manual_seed(0)) * 3
    y = torch.randint(0, K, (n,), generator=torch.Generator().manual_seed(1))
    head = OutputHead("perturbmax", samples=16).eval()
    whole = example_records(z, y, head, ids=torch.arange(n))
    for world, batch in ((1, 1), (1, 7), (1, 128), (1, 256), (2, 1), (2, 7), (2, 128)):
        parts, done = {}, torch.zeros(n, dtype=torch.bool)
        for rank in range(world):
            seen = 0
            for idx, _ in eval_batches(n, rank=rank, world_size=world, batch_size=batch)[:24]:  # batch 1: 24 rows
                ids = eval_example_ids(seen, len(idx), rank, world)
                assert torch.equal(ids, torch.from_numpy(idx))
                seen += len(idx)
                done[idx] = True
                for key, value in example_records(z[idx], y[idx], head, ids=ids).items():
                    parts.setdefault(key, torch.empty_like(whole[key]))[idx] = value
        for key in ("max_prob", "p_y", "support_size", "pred"):
            assert torch.equal(parts[key][done], whole[key][done]), (key, world, batch)
        torch.testing.assert_close(parts["loss"][done], whole["loss"][done], rtol=1e-6, atol=1e-6)
    # and a row's noise is its own: the same example under another id draws anew
    assert not torch.equal(head(z, ids=torch.arange(n)), head(z, ids=torch.arange(n) + n))


def test_keyed_draws_without_a_backward_come_in_blocks_with_the_same_numbers(monkeypatch):
    """A whole split's probabilities (eval.py's prediction sets, OOD) are drawn a block of rows at a time
    when nothing needs the noise for a backward: the same numbers as one draw, in bounded memory."""
    import models.perturbmax as pm

    z, ids = _z(rows=50, K=8), torch.arange(50) + 7
    y = torch.arange(50) % 8
    whole, loss = perturbmax(z.clone().requires_grad_(), ids=ids).detach(), perturbmax_loss(z, y, ids=ids,
                                                                                            reduction="none")
    monkeypatch.setattr(pm, "NOISE_CHUNK", 16 * 8 * 3)  # blocks of 3 rows
    assert torch.equal(perturbmax(z, ids=ids), whole)
    torch.testing.assert_close(perturbmax_loss(z, y, ids=ids, reduction="none"), loss, rtol=0, atol=1e-12)


def test_sigma_below_the_dtypes_resolution_is_refused():
    """Tied logits at sigma = 1e-9 in float32 would give [1, 0, 0] (ties broken by index): refused in one
    line, at config load and at the call; float64 resolves it, and at the floor the ties are shared."""
    from models.perturbmax import sigma_floor

    tied = torch.zeros(2000, 3)
    for call in (lambda: OutputHead("perturbmax", sigma=1e-9), lambda: perturbmax(tied, sigma=1e-9),
                 lambda: perturbmax_loss(tied, torch.zeros(2000).long(), sigma=1e-9)):
        with pytest.raises(UserError, match=r"head.sigma must be a finite number >= 0.0012 .*float32 cannot resolve"):
            call()
    p = perturbmax(tied.double(), sigma=1e-9, samples=64).mean(0)  # float64: resolvable
    assert ((p - 1 / 3).abs() < 0.01).all()
    p = perturbmax(tied + 100.0, sigma=sigma_floor(torch.float32), samples=64).mean(0)  # at the floor, |z| = 100
    assert ((p - 1 / 3).abs() < 0.01).all()


def test_evaluate_gives_each_example_the_same_numbers_at_any_batch_size(one_thread):
    """evaluation.evaluate (train.py's and eval.py's loop) passes each example's index to the head:
    batch sizes 1, 7, 128 and 256 give the same per-example probabilities."""
    from evaluation.evaluate import evaluate

    class Tiny(torch.nn.Module):
        num_classes = 10

        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 10)
            self.output_head = OutputHead("perturbmax", samples=16)

        def forward(self, x):
            return self.fc(x)

    torch.manual_seed(0)
    model, x = Tiny(), torch.randn(260, 6) * 3
    y = torch.randint(0, 10, (260,))
    # batch 1 over the first 30 examples only (the loop's cost is per batch)
    out = {b: evaluate(model, [(x[s:s + b], y[s:s + b]) for s in range(0, 30 if b == 1 else 260, b)],
                       keep_examples=True).records for b in (1, 7, 128, 256)}
    for b in (1, 7, 128):
        for key in ("max_prob", "p_y", "pred", "support_size"):
            assert torch.equal(out[b][key], out[256][key][:len(out[b][key])]), (b, key)


def test_the_torch_free_sigma_floor_reads_torchs_own_epsilons():
    """head_checks declares the sigma floor without torch (the config check runs before torch loads):
    its machine epsilons must be torch's, so the declared range is the one the dtype needs."""
    from models import head_checks
    from models.perturbmax import sigma_floor

    assert head_checks.EPS == {name: torch.finfo(getattr(torch, name)).eps for name in ("float32", "float64")}
    assert head_checks.check_sigma.range == f"[{sigma_floor(torch.float32):g}, inf)"
    assert head_checks.check_sigma_float64.range == f"[{sigma_floor(torch.float64):g}, inf)"
