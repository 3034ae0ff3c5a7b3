"""Probability mappings for output heads: softmax, sparsemax, 1.5-entmax and alpha-entmax.

All four are `torch.autograd.Function`s with closed-form backward passes:

* sparsemax (Martins & Astudillo 2016, "From Softmax to Sparsemax"): Euclidean projection onto
  the simplex, p = [z - tau]_+ ; backward subtracts the mean of the gradient over the support.
* 1.5-entmax (Peters, Niculae & Martins 2019, "Sparse Sequence-to-Sequence Models"):
  p = [z/2 - tau]_+^2 with an exact threshold.
* alpha-entmax (Correia, Niculae & Martins 2019, "Adaptively Sparse Transformers"):
  p = [(alpha-1) z - tau]_+^{1/(alpha-1)}, differentiable in alpha (their closed form for
  dp/dalpha).

For every entmax, s = p^(2-alpha) on the support and dx = s*g - (sum(s*g)/sum(s)) * s.

Conventions shared by all mappings:
* any `dim`, any leading shape;
* -inf logits are masked: they get exact zeros and do not influence the other entries;
  a slice that is entirely -inf maps to all zeros, with a zero (not NaN) gradient;
* fp16/bf16 inputs are computed in fp32 and returned in the input dtype.

Two ways to find the threshold tau, picked by the device of the logits (`threshold_path`):
* the device path (models/thresholds_device.py), for GPUs and other accelerators and always under
  torch.compile: fixed shapes, no data-dependent branch, no host read in forward or backward
  (sort-based exact thresholds; a fixed bisection then Newton for alpha-entmax);
* the CPU path (models/thresholds_cpu.py), for CPU tensors: sort-free iterations that stop as
  soon as they are exact, checked on the host (free on CPU, a sync per check on CUDA), run on one
  intra-op thread for the sizes where threads only add fork/join cost.
Both give the same values and gradients up to rounding; `threshold_path("device")` runs the
device path on CPU tensors, which is how the tests prove it never reads on the host.
"""
from __future__ import annotations

import contextlib
from typing import Optional, Union

import torch
from torch import Tensor

from common.errors import UserError

from . import thresholds_cpu, thresholds_device
from .threshold_common import FLOOR, tsallis_power
from .thresholds_device import default_n_iter

# A tensor alpha with alpha - 1 below this is computed as softmax (alpha = 1): the power
# 1/(alpha - 1) is beyond float precision there; the output differs from the alpha -> 1 limit
# by O(alpha - 1) and the alpha gradient of those rows is 0. A float alpha that close to 1 is
# computed as exact softmax.
SOFTMAX_BELOW = 1e-3

THRESHOLD_PATHS = ("auto", "device", "cpu")
_threshold_path = "auto"


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _compute_dtype(x: Tensor) -> Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


# ---------------------------------------------------------------------------------------------
# Path selection.

def _check_path(path) -> str:
    if path not in THRESHOLD_PATHS:
        raise UserError(f"unknown threshold path {path!r}; valid: {', '.join(THRESHOLD_PATHS)}")
    return path


def set_threshold_path(path: str) -> str:
    """Set the threshold path of all mappings and losses; returns the previous one.

    "auto" (default): the device path for non-CPU tensors and under torch.compile, the CPU path
    for CPU tensors. "device": the device path everywhere (tests use it on CPU tensors).
    "cpu": the CPU path; only for CPU tensors in eager mode: elsewhere it would sync or break the
    graph, so it raises UserError (which torch.compile(fullgraph=True) reports as an "Observed
    exception" carrying the same message).
    """
    global _threshold_path
    previous, _threshold_path = _threshold_path, _check_path(path)
    return previous


@contextlib.contextmanager
def threshold_path(path: str):
    """Context manager form of set_threshold_path: `with threshold_path("device"): ...`."""
    previous = set_threshold_path(path)
    try:
        yield
    finally:
        set_threshold_path(previous)


def uses_device_path(x: Tensor) -> bool:
    """Whether mappings and losses of x take the device path (see set_threshold_path)."""
    if _compiling():
        if _threshold_path == "cpu":
            raise UserError("threshold path 'cpu' cannot be compiled (it stops its loops on values "
                            "read on the host); use threshold_path('auto') or 'device' with torch.compile")
        return True
    if _threshold_path == "auto":
        return not x.is_cpu
    if _threshold_path == "cpu" and not x.is_cpu:
        raise UserError(f"threshold path 'cpu' was forced for a tensor on {x.device}: its loops read "
                        f"values on the host, one sync each; use threshold_path('auto') or 'device'")
    return _threshold_path == "device"


_NO_CONTEXT = contextlib.nullcontext()


def _threads_for(x: Tensor):
    """One intra-op thread for small head work on CPU tensors (thresholds_cpu.one_thread_below).

    Called on every forward and backward: the cheap checks (is_cpu, not device.type) come first."""
    if x.is_cpu and not _compiling() and torch.get_num_threads() > 1:
        return thresholds_cpu.one_thread_below(x.numel())
    return _NO_CONTEXT


def _check_n_iter(n_iter) -> None:
    if n_iter is not None and (isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1):
        raise UserError(f"n_iter (bisection steps) must be a positive integer or None, got {n_iter!r}")


# ---------------------------------------------------------------------------------------------
# Shared steps of the forward kernels.

def _shift(x: Tensor, dim: int, scale: Union[float, Tensor], device_path: bool):
    """scale * (x - max) clamped at FLOOR, the mask of slices that are entirely -inf, and
    whether there may be such slices (always True on the device path: nothing is read)."""
    m = x.amax(dim, keepdim=True)
    dead = m == float("-inf")
    # An all -inf slice has m = -inf; clamping m to the lowest finite value keeps x - m = -inf
    # there (not NaN) and leaves every other slice unchanged: one op instead of a where.
    z = x - m.clamp_(min=torch.finfo(m.dtype).min)
    if not (isinstance(scale, float) and scale == 1.0):
        z = z * scale
    z = z.clamp_(min=FLOOR)
    # An all -inf slice would start the CPU iterations with an empty support (0/0 steps, then
    # MAX_STEPS passes and the sort fallback for the whole batch). A constant slice converges at
    # once; its tau is replaced by +inf afterwards (_dead_tau). The device path fills always.
    may_be_dead = device_path or bool(dead.any())
    if may_be_dead:
        z.masked_fill_(dead, 0.0)
    return z, dead, may_be_dead


def _threshold(z: Tensor, dim: int, kind: str, device_path: bool, beta=None, n_iter: Optional[int] = None):
    """(tau, d, cand): see thresholds_cpu.threshold; the device path gives (tau, None, None)."""
    if device_path:
        return thresholds_device.threshold(z, dim, kind, beta, n_iter), None, None
    return thresholds_cpu.threshold(z, dim, kind, beta, n_iter)


def _dead_tau(tau: Tensor, dead: Tensor) -> Tensor:
    # All -inf slice: tau = +inf puts every entry outside the support (zeros, zero gradient).
    return tau.masked_fill(dead, float("inf"))


def _device_path_of(x: Tensor, device_path: Optional[bool]) -> bool:
    return uses_device_path(x) if device_path is None else device_path


# ---------------------------------------------------------------------------------------------
# Forward kernels (fp32/fp64 in); shared by the mappings and the losses. device_path None means
# "as uses_device_path(x) says".

def softmax_forward(x: Tensor, dim: int) -> Tensor:
    m = x.amax(dim, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    e = (x - m).exp_()
    s = e.sum(dim, keepdim=True)
    # An all -inf slice has s == 0: e is all zeros there, divide by 1 instead of 0.
    return e.div_(torch.where(s > 0, s, torch.ones_like(s)))


def sparsemax_kernel(x: Tensor, dim: int, device_path: Optional[bool] = None):
    """(p, d, tau) with d = p = [zs - tau]_+, zs = x - max clamped."""
    device_path = _device_path_of(x, device_path)
    zs, dead, may_be_dead = _shift(x, dim, 1.0, device_path)
    tau, d, _ = _threshold(zs, dim, "sparsemax", device_path)
    tau = _dead_tau(tau, dead)
    if d is None or may_be_dead:
        d = (zs - tau).clamp_(min=0.0)
    return d, d, tau


def entmax15_kernel(x: Tensor, dim: int, device_path: Optional[bool] = None):
    """(p, d, tau) with d = [zs - tau]_+, p = d^2, zs = (x - max) / 2 clamped."""
    device_path = _device_path_of(x, device_path)
    zs, dead, may_be_dead = _shift(x, dim, 0.5, device_path)
    tau, d, _ = _threshold(zs, dim, "entmax15", device_path)
    tau = _dead_tau(tau, dead)
    if d is None or may_be_dead:
        d = (zs - tau).clamp_(min=0.0)
    return d * d, d, tau


def entmax_alpha_kernel(x: Tensor, alpha, dim: int, n_iter: Optional[int] = None,
                        need_log: bool = False, need_s: bool = False,
                        device_path: Optional[bool] = None):
    """alpha-entmax for alpha > 1 (float or tensor broadcastable to x with size 1 along dim).

    Returns (p, spd, tau, splogp): p normalized to sum 1, spd = sum_i p_i d_i (keepdim) with
    d = [zs - tau]_+, zs = (alpha - 1)(x - max) clamped, which is sum p^alpha (p = d^beta / S with
    S = 1 up to rounding), and with need_log, splogp = sum p^alpha log p (else None).
    With need_s a fifth value: s = p / d on the support, 0 elsewhere. It is proportional to
    p^(2-alpha) per slice (p^(alpha-1) = d / S^(alpha-1)), and the backward formulas only use
    s / sum(s): this avoids a pow (and a where) over the full tensor in the backward."""
    device_path = _device_path_of(x, device_path)
    if isinstance(alpha, Tensor):
        am1 = alpha.to(x.dtype) - 1.0
    else:
        am1 = float(alpha) - 1.0
    beta = 1.0 / am1
    zs, dead, may_be_dead = _shift(x, dim, am1, device_path)
    tau, _, cand = _threshold(zs, dim, "alpha", device_path, beta, n_iter)
    tau = _dead_tau(tau, dead)
    if cand is not None and not may_be_dead:
        # pow only on the candidate block (pow is costly on CPU), then scattered back.
        d_c = (cand.values - cand.tau).clamp_(min=0.0)
        p_c = tsallis_power(d_c, cand.beta)[0]
        s = p_c.sum(-1, keepdim=True)
        p_c = p_c.div_(s)
        K = zs.size(dim)
        p = cand.scatter(p_c).reshape(*cand.lead, K).movedim(-1, dim)
        pd = p_c * d_c
        spd = pd.sum(-1, keepdim=True).reshape(*cand.lead, 1).movedim(-1, dim)
        splogp = None
        if need_log:
            # sum p^alpha log p on the block: p^alpha = p d / S^(alpha-1) ~ p d.
            splogp = (pd * p_c.clamp(min=torch.finfo(p_c.dtype).tiny).log()).sum(-1, keepdim=True)
            splogp = splogp.reshape(*cand.lead, 1).movedim(-1, dim)
        if need_s:
            s_c = p_c.div_(d_c.clamp_(min=torch.finfo(d_c.dtype).tiny))  # p_c is no longer needed
            s_full = cand.scatter(s_c).reshape(*cand.lead, K).movedim(-1, dim)
            return p, spd, tau, splogp, s_full
        return p, spd, tau, splogp
    d = (zs - tau).clamp_(min=0.0)
    p = tsallis_power(d, beta)[0]
    s = p.sum(dim, keepdim=True)
    p = p.div_(torch.where(s > 0, s, torch.ones_like(s)))
    pd = p * d
    splogp = None
    if need_log:
        splogp = (pd * p.clamp(min=torch.finfo(p.dtype).tiny).log()).sum(dim, keepdim=True)
    if need_s:
        # d is not needed after this: reuse it. 0 / tiny = 0 off the support.
        d_safe = d.clamp_(min=torch.finfo(d.dtype).tiny)
        s_full = p / d_safe if p is d else torch.div(p, d_safe, out=d)
        return p, pd.sum(dim, keepdim=True), tau, splogp, s_full
    return p, pd.sum(dim, keepdim=True), tau, splogp


def sparsemax_forward(x: Tensor, dim: int) -> Tensor:
    return sparsemax_kernel(x, dim)[0]


def entmax15_forward(x: Tensor, dim: int) -> Tensor:
    return entmax15_kernel(x, dim)[0]


def entmax_alpha_forward(x: Tensor, alpha, dim: int, n_iter: Optional[int] = None) -> Tensor:
    return entmax_alpha_kernel(x, alpha, dim, n_iter)[0]


# ---------------------------------------------------------------------------------------------
# Backward kernels (branch-free: shared by both paths).

def _softmax_backward(p: Tensor, g: Tensor, dim: int) -> Tensor:
    pg = p * g
    return pg.sub_(p * pg.sum(dim, keepdim=True))


def _sparsemax_backward(p: Tensor, g: Tensor, dim: int) -> Tensor:
    """g minus its mean over the support, on the support (arithmetic only: cheap on CPU)."""
    s = p.ceil()  # support indicator: p in [0, 1]
    gs = g * s
    n = s.sum(dim, keepdim=True).clamp_(min=1.0)
    mean = gs.sum(dim, keepdim=True).div_(n)
    return gs.sub_(s.mul_(mean))


def _entmax_backward(s: Tensor, g: Tensor, dim: int) -> Tensor:
    """dx = s*g - (sum(s*g)/sum(s)) * s with s = p^(2-alpha) on the support."""
    sg = s * g
    ss = s.sum(dim, keepdim=True)
    coef = sg.sum(dim, keepdim=True) / torch.where(ss > 0, ss, torch.ones_like(ss))
    return sg.sub_(coef * s)


def _grad_like(dx: Tensor, x: Tensor) -> Tensor:
    return dx if dx.dtype == x.dtype else dx.to(x.dtype)


def _check_alpha_value(alpha: float) -> float:
    alpha = float(alpha)
    if not alpha >= 1.0:
        raise UserError(f"entmax alpha must be >= 1 (1 = softmax, 2 = sparsemax), got {alpha}")
    return alpha


# ---------------------------------------------------------------------------------------------
# autograd Functions (one per mapping; device_path is decided once per call by the caller).

class SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int):
        with _threads_for(x):
            p = softmax_forward(_compute_dtype(x), dim)
        ctx.dim = dim
        ctx.save_for_backward(p)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        (p,) = ctx.saved_tensors
        with _threads_for(p):
            return _grad_like(_softmax_backward(p, g.to(p.dtype), ctx.dim), g), None


class SparsemaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int, device_path: bool):
        with _threads_for(x):
            p = sparsemax_kernel(_compute_dtype(x), dim, device_path)[0]
        ctx.dim = dim
        ctx.save_for_backward(p)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        (p,) = ctx.saved_tensors
        with _threads_for(p):
            return _grad_like(_sparsemax_backward(p, g.to(p.dtype), ctx.dim), g), None, None


class Entmax15Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int, device_path: bool):
        with _threads_for(x):
            p, d, _ = entmax15_kernel(_compute_dtype(x), dim, device_path)
        ctx.dim = dim
        ctx.save_for_backward(d)  # s = p^(1/2) = d
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        (d,) = ctx.saved_tensors
        with _threads_for(d):
            return _grad_like(_entmax_backward(d, g.to(d.dtype), ctx.dim), g), None, None


def entmax_alpha_grad_dot(g: Tensor, p: Tensor, s: Tensor, alpha: Tensor, dim: int) -> Tensor:
    """sum_i g_i dp_i/dalpha (Correia et al. 2019, Prop. 1) per slice (keepdim); zero where
    alpha - 1 <= SOFTMAX_BELOW. s is proportional to p^(2-alpha) on the support (only s / sum s
    enters). Expanded into row sums so that only 3 products touch the full tensor (CPU-cheap)."""
    am1 = alpha - 1.0
    am1_safe = torch.where(am1 > 0, am1, torch.ones_like(am1))
    # p log p with 0 log 0 = 0: p = 0 times the finite log(tiny) is 0, no where needed.
    plogp = p.clamp(min=torch.finfo(p.dtype).tiny).log_().mul_(p)
    ent = plogp.sum(dim, keepdim=True)
    ss = s.sum(dim, keepdim=True)
    g_skewed = (g * s).sum(dim, keepdim=True) / torch.where(ss > 0, ss, torch.ones_like(ss))
    gp = (g * p).sum(dim, keepdim=True)
    g_plogp = plogp.mul_(g).sum(dim, keepdim=True)
    # dp = (p - skewed) / am1^2 - (plogp - skewed * ent) / am1, dotted with g
    dot = (gp - g_skewed) / am1_safe**2 - (g_plogp - g_skewed * ent) / am1_safe
    return dot * (am1 > SOFTMAX_BELOW).to(dot.dtype)


class EntmaxBisectFunction(torch.autograd.Function):
    """alpha-entmax with alpha a float > 1 + SOFTMAX_BELOW, or a tensor (broadcastable to x,
    size 1 along dim) that gets a gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, alpha: Union[float, Tensor], dim: int, n_iter: Optional[int],
                device_path: bool):
        xf = _compute_dtype(x)
        a = None
        with _threads_for(x):
            if isinstance(alpha, Tensor):
                a = alpha.to(xf.dtype)
                if a.dim() < xf.dim():
                    a = a.view((1,) * (xf.dim() - a.dim()) + tuple(a.shape))
                is_one = a <= 1.0 + SOFTMAX_BELOW
                # alpha - 1 <= SOFTMAX_BELOW is softmax (the power 1/(alpha-1) is numerically
                # useless there): computed on every call on the device path (no data-dependent
                # branch), only when present on the CPU path.
                need_softmax = device_path or bool(is_one.any())
                a_safe = torch.where(is_one, torch.full_like(a, 1.5), a)
            else:
                need_softmax = False
                a_safe = alpha
            p, _, _, _, s = entmax_alpha_kernel(xf, a_safe, dim, n_iter, need_s=True,
                                                device_path=device_path)
            if need_softmax:
                p_soft = softmax_forward(xf, dim)
                p = torch.where(is_one, p_soft, p)
                s = torch.where(is_one, p_soft, s)  # p^(2 - 1) = p
        ctx.dim = dim
        ctx.alpha_shape = alpha.shape if a is not None else None
        ctx.save_for_backward(p, s, a)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        p, s, a = ctx.saved_tensors
        dim = ctx.dim
        with _threads_for(p):
            g = g.to(p.dtype)
            dx = _entmax_backward(s, g, dim) if ctx.needs_input_grad[0] else None
            d_alpha = None
            if a is not None and ctx.needs_input_grad[1]:
                d_alpha = entmax_alpha_grad_dot(g, p, s, a, dim)
                d_alpha = d_alpha.sum_to_size(a.shape).reshape(ctx.alpha_shape)
            if dx is not None:
                dx = _grad_like(dx, g)
        return dx, d_alpha, None, None, None


# ---------------------------------------------------------------------------------------------
# Public functional API (names as in the `entmax` package).

def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax with the same conventions as the sparse mappings (all -inf slice -> zeros)."""
    return SoftmaxFunction.apply(x, dim)


def sparsemax(x: Tensor, dim: int = -1) -> Tensor:
    """Sparsemax (Martins & Astudillo 2016): Euclidean projection of x onto the simplex."""
    return SparsemaxFunction.apply(x, dim, uses_device_path(x))


def entmax15(x: Tensor, dim: int = -1) -> Tensor:
    """1.5-entmax (Peters et al. 2019) with an exact threshold."""
    return Entmax15Function.apply(x, dim, uses_device_path(x))


def entmax_bisect(x: Tensor, alpha: Union[float, Tensor] = 1.5, dim: int = -1,
                  n_iter: Optional[int] = None) -> Tensor:
    """alpha-entmax (Correia et al. 2019) for alpha >= 1; alpha may be a per-slice tensor.

    A float alpha of 1, 1.5 or 2 dispatches to the exact softmax, 1.5-entmax or sparsemax; an
    alpha within SOFTMAX_BELOW of 1 is computed as softmax. The threshold comes from Newton steps
    run to rounding level (CPU path, n_iter=None) or from `n_iter` bisection steps then 4 Newton
    steps (n_iter given, or on the device path: 12 in fp32, 20 in fp64 by default).
    A tensor alpha is differentiable; it must be broadcastable to x with size 1 along `dim`
    (e.g. shape (B, 1) or a scalar).
    """
    _check_n_iter(n_iter)
    if not isinstance(alpha, Tensor):
        alpha = _check_alpha_value(alpha)
        if alpha - 1.0 <= SOFTMAX_BELOW:
            return softmax(x, dim)
        if alpha == 2.0:
            return sparsemax(x, dim)
        if alpha == 1.5:
            return entmax15(x, dim)
    # A float alpha stays a Python number: a tensor made from it on the logits' device would be
    # a host-to-device copy (a sync on CUDA) on every call.
    return EntmaxBisectFunction.apply(x, alpha, dim, n_iter, uses_device_path(x))


__all__ = ["softmax", "sparsemax", "entmax15", "entmax_bisect", "default_n_iter",
           "threshold_path", "set_threshold_path", "uses_device_path", "THRESHOLD_PATHS"]
