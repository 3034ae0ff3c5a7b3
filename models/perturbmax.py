"""Perturbed argmax ("perturbmax") and its perturbed Fenchel-Young loss (Berthet, Blondel, Teboul,
Cuturi, Vert & Bach, NeurIPS 2020, "Learning with Differentiable Perturbed Optimizers").

    p_sigma(z) = E[argmax(z + sigma Z)]   (one-hot argmax),   estimated by M draws of Z;
    F(z) = E[max_i (z_i + sigma Z_i)],    L(z; q) = F(z) - sigma E[Z_1] - <z, q>,   grad_z L = p_sigma(z) - q.

With Gumbel noise and sigma = 1, p_sigma is exactly softmax (the Gumbel-max trick) and L is the
cross-entropy in expectation. L is the perturbed Fenchel-Young loss F(z) + Omega(q) - <z, q>
with Omega(e_y) = -sigma E[Z_1] (exact for one-hot targets; for soft targets it differs from the
FY loss by a term of q only, so gradients are the same). Its Monte-Carlo gradient is the mean of
the draws' one-hot argmaxes minus q, the gradient of the Monte-Carlo estimate of F itself.

Mapping backward (Berthet et al., Prop. 3.1): J^T g = E[<g, argmax(z + sigma Z)> grad nu(Z)] / sigma
with nu = -log density: Z for Gaussian noise, 1 - exp(-Z) for Gumbel noise.

Determinism: the noise comes from a torch.Generator on the logits' device, seeded on the host from
(seed, step) (`draw_seed`): no host read of device data, fixed shapes (M, R, K), so the sync-guard
tests cover it. OutputHead passes torch's current seed (train.py sets it before every micro-batch
from the run seed, update, micro-batch and rank) and its count of calls since that seed as the step;
in eval mode it uses the fixed draw (seed EVAL_SEED, step 0), so eval.py reproduces training's
evaluation exactly. -inf logits never win a draw (an all -inf row maps to zeros).

Sparse? Its support (the classes that won at least one draw) is a random set whose size grows
with M; under Gaussian or Gumbel noise every finite class has a positive probability, so its zeros
are sampling artefacts, not structure, and are not a prediction set: the head is declared dense.
"""
from __future__ import annotations

import torch
from torch import Tensor

from common.errors import UserError
from common.intervals import RangeCheck
from .head_targets import RowGradientLoss, compute_dtype, finish_rows, masked_dot, row_loss
from .mappings import rows_backward, rows_forward

NOISES = ("gaussian", "gumbel")
EULER_GAMMA = 0.5772156649015329  # E[Z] of the standard Gumbel
EVAL_SEED = 0


check_sigma = RangeCheck("head.sigma", float, "(0, inf)", "the noise scale; 1 = Gumbel-softmax")


check_samples = RangeCheck("head.samples", int, "[1, inf)", "Monte-Carlo draws per row")


def check_noise(noise) -> str:
    if noise not in NOISES:
        raise UserError(f"head.noise must be one of {', '.join(NOISES)}, got {noise!r}")
    return noise


def draw_seed(seed: int, step: int) -> int:
    """The generator seed of draw `step` of run `seed` (host integers only: no device read)."""
    return (int(seed) * 0x9E3779B97F4A7C15 + int(step) * 0xBF58476D1CE4E5B9 + 1) % (1 << 63)


def draw_noise(shape, noise: str, seed: int, step: int, like: Tensor) -> Tensor:
    """Standard Gaussian or Gumbel noise of `shape`, in like's dtype and device, from (seed, step)."""
    g = torch.Generator(device=like.device)
    g.manual_seed(draw_seed(seed, step))
    if noise == "gaussian":
        return torch.randn(shape, generator=g, dtype=like.dtype, device=like.device)
    u = torch.rand(shape, generator=g, dtype=like.dtype, device=like.device)
    tiny = torch.finfo(like.dtype).tiny
    return -torch.log(-torch.log(u.clamp_(min=tiny, max=1.0 - torch.finfo(like.dtype).eps)))


def _draws(z: Tensor, sigma: float, samples: int, noise: str, seed: int, step: int):
    """(mean one-hot argmax (R, K), mean max (R,), noise (M, R, K)) of rows z (R, K)."""
    eps = draw_noise((samples,) + tuple(z.shape), noise, seed, step, z)
    perturbed = z.unsqueeze(0) + sigma * eps
    best, winner = perturbed.max(-1)  # (M, R)
    counts = torch.zeros_like(z).scatter_add_(-1, winner.transpose(0, 1), torch.ones_like(best).transpose(0, 1))
    alive = (z > float("-inf")).any(-1, keepdim=True)  # an all -inf row: no winner, zeros
    p = counts.div_(samples).mul_(alive)
    return p, best.mean(0), eps


def _grad_nu(eps: Tensor, noise: str) -> Tensor:
    return eps if noise == "gaussian" else 1.0 - torch.exp(-eps)


def _perturbmax_rows(rows: Tensor, sigma: float, samples: int, noise: str, seed: int, step: int):
    p, _, eps = _draws(rows, sigma, samples, noise, seed, step)
    return p, (rows, eps)


def _perturbmax_backward(rows: Tensor, eps: Tensor, g_rows: Tensor, sigma: float, noise: str) -> Tensor:
    winner = (rows.unsqueeze(0) + sigma * eps).argmax(-1, keepdim=True)  # (M, R, 1)
    g_win = g_rows.unsqueeze(0).expand_as(eps).gather(-1, winner)  # <g, one-hot argmax>
    dx = (g_win * _grad_nu(eps, noise)).mean(0) / sigma
    return dx * (rows > float("-inf"))  # a masked class gets no gradient


class PerturbmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int, sigma: float, samples: int, noise: str, seed: int, step: int):
        ctx.sigma, ctx.noise = sigma, noise
        return rows_forward(ctx, x, dim, lambda rows: _perturbmax_rows(rows, sigma, samples, noise, seed, step))

    @staticmethod
    def backward(ctx, g: Tensor):
        dx = rows_backward(ctx, g, lambda rows, eps, g_rows: _perturbmax_backward(rows, eps, g_rows, ctx.sigma,
                                                                                   ctx.noise))
        return dx, None, None, None, None, None, None


def perturbmax(x: Tensor, sigma: float = 1.0, samples: int = 16, noise: str = "gumbel", dim: int = -1,
               seed: int = EVAL_SEED, step: int = 0) -> Tensor:
    """Monte-Carlo perturbed argmax along `dim`: the frequency with which each class wins
    argmax(x + sigma Z) over `samples` draws of (seed, step)."""
    return PerturbmaxFunction.apply(x, dim, check_sigma(sigma), check_samples(samples), check_noise(noise),
                                    int(seed), int(step))


class _PerturbedFYLoss(RowGradientLoss):
    @staticmethod
    def forward(ctx, z: Tensor, target: Tensor, sigma: float, samples: int, noise: str, seed: int, step: int):
        zf = compute_dtype(z)
        p, f, _ = _draws(zf, sigma, samples, noise, seed, step)
        shift = sigma * (EULER_GAMMA if noise == "gumbel" else 0.0)
        if target.dtype.is_floating_point:
            loss = finish_rows(f - shift - masked_dot(zf, target))
            grad = p.sub_(target)
        else:
            loss = finish_rows(f - shift - zf.gather(1, target.unsqueeze(1)).squeeze(1))
            grad = p.scatter_add_(1, target.unsqueeze(1), torch.full_like(p[:, :1], -1.0))
        RowGradientLoss.save_row_gradient(ctx, grad, z)
        return loss


def perturbmax_loss(logits: Tensor, target: Tensor, sigma: float = 1.0, samples: int = 16, noise: str = "gumbel",
                    seed: int = EVAL_SEED, step: int = 0, label_smoothing: float = 0.0, ignore_index: int = -100,
                    reduction: str = "mean") -> Tensor:
    """Perturbed Fenchel-Young loss: MC estimate of E[max(z + sigma Z)] - sigma E[Z] - <z, q>;
    gradient: mean one-hot argmax of the draws - q. Classes last."""
    return row_loss(_PerturbedFYLoss, logits, target, label_smoothing, ignore_index, reduction, check_sigma(sigma),
                    check_samples(samples), check_noise(noise), int(seed), int(step), class_indices=True)


__all__ = ["perturbmax", "perturbmax_loss", "NOISES", "EVAL_SEED", "draw_seed", "check_sigma", "check_samples",
           "check_noise"]
