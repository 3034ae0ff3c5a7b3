"""Perturbed argmax ("perturbmax") and its perturbed Fenchel-Young loss (Berthet, Blondel, Teboul,
Cuturi, Vert & Bach, NeurIPS 2020, "Learning with Differentiable Perturbed Optimizers").

    p_sigma(z) = E[argmax(z + sigma Z)]   (one-hot argmax),   estimated by M draws of Z;
    F(z) = E[max_i (z_i + sigma Z_i)],    L(z; q) = F(z) - sigma E[Z_1] - <z, q>,   grad_z L = p_sigma(z) - q.

With Gumbel noise and sigma = 1, p_sigma is exactly softmax (the Gumbel-max trick) and L is the
cross-entropy in expectation (for soft targets too: F(z) - E[Z_1] is then logsumexp(z)). The
reported per-row loss is that Monte-Carlo estimate as it is, unclamped: a confidently right row's
estimate is negative in about half the draws, and clamping those at 0 would bias the mean upward.
L is the perturbed Fenchel-Young loss F(z) + Omega(q) - <z, q>
with Omega(e_y) = -sigma E[Z_1] (exact for one-hot targets; for soft targets it differs from the
FY loss by a term of q only, so gradients are the same). Its Monte-Carlo gradient is the mean of
the draws' one-hot argmaxes minus q, the gradient of the Monte-Carlo estimate of F itself.

Mapping backward (Berthet et al., Prop. 3.1): J^T g = E[<g, argmax(z + sigma Z)> grad nu(Z)] / sigma
with nu = -log density: Z for Gaussian noise, 1 - exp(-Z) for Gumbel noise.

Determinism. Training: the noise comes from a torch.Generator on the logits' device, seeded on the
host from (seed, step) (`draw_seed`): no host read of device data, fixed shapes (M, R, K), so the
sync-guard tests cover it. OutputHead passes torch's current seed (train.py sets it before every
micro-batch from the run seed, update, micro-batch and rank) and its count of calls since that seed
as the step, so a resumed run draws what an uninterrupted one does. Evaluation (`ids` given): row r's
noise is keyed noise of (seed EVAL_SEED, ids[r]) (models/keyed_noise.py), where the evaluation loop
passes each example's index in its split: an example's probabilities and loss do not depend on the
batch it is in, the batch size or the process count, and eval.py reproduces training's evaluation.
-inf logits never win a draw (an all -inf row maps to zeros).

Resolution: sigma * noise must be resolvable next to the logits in the compute dtype, or perturbed
values tie and ties break by class index instead of at random (at sigma = 1e-9 in float32, tied
logits give [1, 0, 0]). Logits are assumed within +-LOGIT_SCALE; sigma below `sigma_floor(dtype)`
(RESOLUTION_STEPS spacings of the dtype there; float32 is the compute dtype of fp32/bf16/fp16
logits) is refused at config load and at every call (a host-side check on the dtype: no sync).

Sparse? Its support (the classes that won at least one draw) is a random set whose size grows
with M; under Gaussian or Gumbel noise every finite class has a positive probability, so its zeros
are sampling artefacts, not structure, and are not a prediction set: the head is declared dense.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from common.errors import UserError

from . import head_checks
from .head_checks import (  # noqa: F401  (LOGIT_SCALE, NOISES, RESOLUTION_STEPS: re-exported)
    LOGIT_SCALE,
    NOISES,
    RESOLUTION_STEPS,
    check_noise,
    check_samples,
    check_sigma,
    check_sigma_float64,
)
from .head_targets import RowGradientLoss, compute_dtype, finite_or_inf, masked_dot, row_loss
from .keyed_noise import keyed_noise, row_keys
from .mappings import rows_backward, rows_forward

EULER_GAMMA = 0.5772156649015329  # E[Z] of the standard Gumbel
EVAL_SEED = 0


def sigma_floor(dtype: torch.dtype = torch.float32) -> float:
    """Smallest sigma whose noise `dtype` resolves next to logits up to +-LOGIT_SCALE (head_checks.sigma_floor)."""
    return head_checks.sigma_floor(torch.finfo(dtype).eps)


def check_sigma_for(sigma, x: Tensor) -> float:
    """sigma checked for x's compute dtype: the declared range, or float64's lower floor for float64 x."""
    return (check_sigma_float64 if x.dtype == torch.float64 else check_sigma)(sigma)


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


def check_ids(ids, rows: int):
    """The rows' identities as a flat int64 tensor (None stays None), checked against the row count."""
    if ids is None:
        return None
    if not isinstance(ids, Tensor) or ids.dtype.is_floating_point or ids.numel() != rows:
        raise UserError(f"perturbmax ids must be an integer tensor with one identity per row ({rows}), got "
                        f"{tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__}")
    return ids.reshape(-1)


NOISE_CHUNK = 1 << 22  # keyed noise without a backward is drawn this many elements at a time (memory)


def _from_noise(z: Tensor, sigma: float, samples: int, eps: Tensor):
    """(mean one-hot argmax (R, K), mean max (R,)) of rows z (R, K) under noise eps (M, R, K)."""
    perturbed = z.unsqueeze(0) + sigma * eps
    best, winner = perturbed.max(-1)  # (M, R)
    counts = torch.zeros_like(z).scatter_add_(-1, winner.transpose(0, 1), torch.ones_like(best).transpose(0, 1))
    alive = (z > float("-inf")).any(-1, keepdim=True)  # an all -inf row: no winner, zeros
    return counts.div_(samples).mul_(alive), best.mean(0)


def _draws(z: Tensor, sigma: float, samples: int, noise: str, seed: int, step: int, ids=None, keep_noise=True):
    """(mean one-hot argmax (R, K), mean max (R,), noise (M, R, K)) of rows z (R, K): the noise of one
    (seed, step) draw, or with `ids` (R,) the keyed noise of (seed, ids[r]) for each row. Keyed noise
    that no backward needs (`keep_noise` False: noise None) is drawn a block of rows at a time, which
    gives the same numbers (each row's noise is its own) in bounded memory: a whole split at once."""
    if ids is None:
        eps = draw_noise((samples,) + tuple(z.shape), noise, seed, step, z)
        return (*_from_noise(z, sigma, samples, eps), eps)
    keys = row_keys(seed, check_ids(ids, z.shape[0]))
    if keep_noise:
        eps = keyed_noise(keys, samples, z.shape[-1], noise, z.dtype)
        return (*_from_noise(z, sigma, samples, eps), eps)
    block = max(1, NOISE_CHUNK // max(1, samples * z.shape[-1]))  # host shapes: no device read
    parts = [_from_noise(z[s:s + block], sigma, samples, keyed_noise(keys[s:s + block], samples, z.shape[-1],
                                                                     noise, z.dtype))
             for s in range(0, z.shape[0], block)]
    if not parts:
        return (*_from_noise(z, sigma, samples, z.new_zeros((samples,) + tuple(z.shape))), None)
    return torch.cat([p for p, _ in parts]), torch.cat([f for _, f in parts]), None


def _grad_nu(eps: Tensor, noise: str) -> Tensor:
    return eps if noise == "gaussian" else 1.0 - torch.exp(-eps)


def _perturbmax_rows(rows: Tensor, sigma: float, samples: int, noise: str, seed: int, step: int, ids, keep_noise):
    p, _, eps = _draws(rows, sigma, samples, noise, seed, step, ids, keep_noise)
    return p, (rows, eps) if keep_noise else ()


def _perturbmax_backward(rows: Tensor, eps: Tensor, g_rows: Tensor, sigma: float, noise: str) -> Tensor:
    winner = (rows.unsqueeze(0) + sigma * eps).argmax(-1, keepdim=True)  # (M, R, 1)
    g_win = g_rows.unsqueeze(0).expand_as(eps).gather(-1, winner)  # <g, one-hot argmax>
    dx = (g_win * _grad_nu(eps, noise)).mean(0) / sigma
    return dx * (rows > float("-inf"))  # a masked class gets no gradient


class PerturbmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int, sigma: float, samples: int, noise: str, seed: int, step: int, ids):
        ctx.sigma, ctx.noise = sigma, noise
        # no backward, no saved noise: keyed draws in blocks of rows (an inference context has no flags)
        keep = bool(getattr(ctx, "needs_input_grad", (True,))[0])
        return rows_forward(ctx, x, dim,
                            lambda rows: _perturbmax_rows(rows, sigma, samples, noise, seed, step, ids, keep))

    @staticmethod
    def backward(ctx, g: Tensor):
        dx = rows_backward(ctx, g, lambda rows, eps, g_rows: _perturbmax_backward(rows, eps, g_rows, ctx.sigma,
                                                                                   ctx.noise))
        return dx, None, None, None, None, None, None, None


def perturbmax(x: Tensor, sigma: float = 1.0, samples: int = 16, noise: str = "gumbel", dim: int = -1,
               seed: int = EVAL_SEED, step: int = 0, ids: Optional[Tensor] = None) -> Tensor:
    """Monte-Carlo perturbed argmax along `dim`: the frequency with which each class wins
    argmax(x + sigma Z) over `samples` draws of (seed, step), or with `ids` (one integer per row,
    e.g. the examples' dataset indices) of (seed, the row's id): then independent of the batch."""
    return PerturbmaxFunction.apply(x, dim, check_sigma_for(sigma, x), check_samples(samples), check_noise(noise),
                                    int(seed), int(step), ids)


class _PerturbedFYLoss(RowGradientLoss):
    @staticmethod
    def forward(ctx, z: Tensor, target: Tensor, sigma: float, samples: int, noise: str, seed: int, step: int, ids):
        zf = compute_dtype(z)
        p, f, _ = _draws(zf, sigma, samples, noise, seed, step, ids, keep_noise=False)  # the loss keeps p - q only
        shift = sigma * (EULER_GAMMA if noise == "gumbel" else 0.0)
        # unclamped: the estimate's mean is the loss (a per-row clamp at 0 would bias it upward)
        if target.dtype.is_floating_point:
            loss = finite_or_inf(f - shift - masked_dot(zf, target))
            grad = p - target  # out of place: p is not mutated after its use (models/losses.py)
        else:
            loss = finite_or_inf(f - shift - zf.gather(1, target.unsqueeze(1)).squeeze(1))
            grad = p.scatter_add(1, target.unsqueeze(1), torch.full_like(p[:, :1], -1.0))
        RowGradientLoss.save_row_gradient(ctx, grad, z)
        return loss


def perturbmax_loss(logits: Tensor, target: Tensor, sigma: float = 1.0, samples: int = 16, noise: str = "gumbel",
                    seed: int = EVAL_SEED, step: int = 0, label_smoothing: float = 0.0, ignore_index: int = -100,
                    reduction: str = "mean", ids: Optional[Tensor] = None) -> Tensor:
    """Perturbed Fenchel-Young loss: MC estimate of E[max(z + sigma Z)] - sigma E[Z] - <z, q> (unbiased,
    so it may be negative on a row); gradient: mean one-hot argmax of the draws - q. Classes last.
    `ids`: one integer per row (logits' leading shape), as in `perturbmax`."""
    return row_loss(_PerturbedFYLoss, logits, target, label_smoothing, ignore_index, reduction,
                    check_sigma_for(sigma, logits), check_samples(samples), check_noise(noise), int(seed), int(step),
                    ids, class_indices=True)


__all__ = ["perturbmax", "perturbmax_loss", "NOISES", "EVAL_SEED", "LOGIT_SCALE", "RESOLUTION_STEPS", "draw_seed",
           "sigma_floor", "check_sigma", "check_sigma_for", "check_samples", "check_noise"]
