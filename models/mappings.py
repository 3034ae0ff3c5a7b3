"""Probability mappings for output heads: softmax, sparsemax, 1.5-entmax and alpha-entmax.

All four are `torch.autograd.Function`s with closed-form backward passes:

* sparsemax (Martins & Astudillo 2016, "From Softmax to Sparsemax"): Euclidean projection onto
  the simplex, p = [z - tau]_+ ; backward subtracts the mean of the gradient over the support.
* 1.5-entmax (Peters, Niculae & Martins 2019, "Sparse Sequence-to-Sequence Models"):
  p = [z/2 - tau]_+^2 with an exact threshold.
* alpha-entmax (Correia, Niculae & Martins 2019, "Adaptively Sparse Transformers"):
  p = [(alpha-1) z - tau]_+^{1/(alpha-1)} for any alpha >= 1 (alpha > 2 too), differentiable in
  alpha (their closed form for dp/dalpha).

For every entmax, s = p^(2-alpha) on the support and dx = s*g - (sum(s*g)/sum(s)) * s.

Conventions shared by all mappings:
* any `dim`, any leading shape (the kernels work on rows (R, K): classes last);
* -inf logits are masked: they get exact zeros and do not influence the other entries;
  a slice that is entirely -inf maps to all zeros, with a zero (not NaN) gradient;
* fp16/bf16 inputs are computed in fp32 and returned in the input dtype.

Two ways to find the threshold tau (`threshold_path`), and ONE place that picks between them:
the threshold functions of the seam below (`sparsemax_threshold`, `entmax15_threshold`,
`tsallis_threshold`, plus `alpha_rows` for what a tensor alpha needs). Kernels, Functions and
losses never see the choice.
* the device path (models/thresholds_device.py), for GPUs and other accelerators and always under
  torch.compile: fixed shapes, no data-dependent branch, no host read in forward or backward
  (sort-based exact thresholds; a fixed bisection then safeguarded Newton for alpha-entmax);
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
from .head_checks import ALPHA_OF  # noqa: F401  (re-exported: the losses read it here)
from .rows import compute_dtype, from_rows, to_rows
from .threshold_common import FLOOR, tsallis_mass
from .thresholds_device import default_n_iter

# A tensor alpha with alpha - 1 below this is computed as softmax (alpha = 1): the power
# 1/(alpha - 1) is beyond float precision there; the output differs from the alpha -> 1 limit
# by O(alpha - 1) and the alpha gradient of those rows is 0. A float alpha that close to 1 is
# computed as exact softmax.
SOFTMAX_BELOW = 1e-3
ALPHA_BELOW_ONE = "entmax alpha must be >= 1 (1 = softmax, 2 = sparsemax, > 2 sparser), got {}"


THRESHOLD_PATHS = ("auto", "device", "cpu")
_threshold_path = "auto"


def _compiling() -> bool:
    return torch.compiler.is_compiling()


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


def threads_for(x: Tensor):
    """One intra-op thread for small head work on CPU tensors (thresholds_cpu.one_thread_below).

    Called on every forward and backward: the cheap checks (is_cpu, not device.type) come first."""
    if x.is_cpu and not _compiling() and torch.get_num_threads() > 1:
        return thresholds_cpu.one_thread_below(x.numel())
    return _NO_CONTEXT


def check_n_iter(n_iter) -> None:
    if n_iter is not None and (isinstance(n_iter, bool) or not isinstance(n_iter, int) or n_iter < 1):
        raise UserError(f"n_iter (bisection steps) must be a positive integer or None, got {n_iter!r}")


def check_alpha_value(alpha: float) -> float:
    alpha = float(alpha)
    if not alpha >= 1.0:
        raise UserError(ALPHA_BELOW_ONE.format(alpha))
    return alpha


# ---------------------------------------------------------------------------------------------
# The seam: the only functions that know which path runs. Inputs are rows (R, K) of shifted,
# scaled, clamped logits zs (threshold_common) and `dead`, the rows that are entirely -inf;
# each returns tau (R, 1) (+inf on dead rows: all zeros, zero gradient) and the solver's
# by-product: d = [zs - tau]_+ or the candidate block of alpha-entmax (None: not produced).

def _solve(zs: Tensor, dead: Tensor, device_solver, cpu_solver):
    if uses_device_path(zs):
        return device_solver(zs).masked_fill_(dead, float("inf")), None
    if bool(dead.any()):
        # an all -inf row would start the CPU iterations with an empty support (0/0 steps, then
        # MAX_STEPS passes and the sort fallback for the whole batch): solve a constant row there
        tau = cpu_solver(zs.masked_fill(dead, 0.0))[0]
        return tau.masked_fill_(dead, float("inf")), None
    return cpu_solver(zs)


def sparsemax_threshold(zs: Tensor, dead: Tensor):
    return _solve(zs, dead, thresholds_device.sparsemax_threshold, thresholds_cpu.sparsemax_threshold)


def entmax15_threshold(zs: Tensor, dead: Tensor):
    return _solve(zs, dead, thresholds_device.entmax15_threshold, thresholds_cpu.entmax15_threshold)


def tsallis_threshold(zs: Tensor, dead: Tensor, beta, n_iter: Optional[int]):
    return _solve(zs, dead, lambda z: thresholds_device.tsallis_threshold(z, beta, n_iter),
                  lambda z: thresholds_cpu.tsallis_threshold(z, beta, n_iter))


def all_rows_count(valid: Tensor) -> bool:
    """Whether a loss may drop its row mask because every row counts: read on the CPU path (the
    usual batch ignores nothing, and the masking ops are a few percent of a small loss there);
    never on the device path, which keeps the mask."""
    return not uses_device_path(valid) and bool(valid.all())


def alpha_rows(a: Tensor):
    """A tensor alpha (R, 1) -> (alpha to compute with, rows within SOFTMAX_BELOW of 1 or None).

    alpha < 1 is refused as a float alpha is on the CPU path (reading it is free there); the
    device path cannot read it without a sync, so those rows come out NaN instead (never a silent
    softmax). Rows near 1 are computed as softmax (see SOFTMAX_BELOW): the device path always
    takes that where, the CPU path only when such rows exist (None otherwise)."""
    if not uses_device_path(a):
        lowest = float(a.detach().min())  # one read for both checks
        if not lowest >= 1.0:
            raise UserError(ALPHA_BELOW_ONE.format(lowest))
        if lowest > 1.0 + SOFTMAX_BELOW:
            return a, None
    near_one = a <= 1.0 + SOFTMAX_BELOW
    below_one = a < 1.0
    return torch.where(near_one, torch.full_like(a, 1.5), a).masked_fill_(below_one, float("nan")), near_one


def with_softmax_rows(p: Tensor, p_soft: Tensor, a: Tensor, near_one: Tensor) -> Tensor:
    """p with the rows near alpha = 1 replaced by their softmax p_soft (NaN where a is NaN)."""
    return torch.where(near_one, p_soft * (a * 0.0 + 1.0), p)


# ---------------------------------------------------------------------------------------------
# Forward kernels: rows (R, K) in fp32/fp64; shared by the mappings and the losses.

def _shift(x: Tensor, scale: Union[float, Tensor]):
    """scale * (x - max) clamped at FLOOR, and the mask of rows that are entirely -inf."""
    m = x.amax(-1, keepdim=True)
    dead = m == float("-inf")
    # An all -inf row has m = -inf; clamping m to the lowest finite value keeps x - m = -inf
    # there (not NaN) and leaves every other row unchanged: one op instead of a where.
    z = x - m.clamp_(min=torch.finfo(m.dtype).min)
    if not (isinstance(scale, float) and scale == 1.0):
        z = z * scale
    return z.clamp_(min=FLOOR), dead


def softmax_rows(x: Tensor) -> Tensor:
    """Softmax of rows (any dim works: only the last is reduced); an all -inf row gives zeros."""
    m = x.amax(-1, keepdim=True).clamp_(min=torch.finfo(x.dtype).min)
    e = (x - m).exp_()
    s = e.sum(-1, keepdim=True)
    return e.div_(torch.where(s > 0, s, torch.ones_like(s)))


def sparsemax_kernel(x: Tensor):
    """(p, d, tau) with d = p = [zs - tau]_+, zs = x - max clamped."""
    zs, dead = _shift(x, 1.0)
    tau, d = sparsemax_threshold(zs, dead)
    if d is None:
        d = (zs - tau).clamp_(min=0.0)
    return d, d, tau


def entmax15_kernel(x: Tensor):
    """(p, d, tau) with d = [zs - tau]_+, p = d^2, zs = (x - max) / 2 clamped."""
    zs, dead = _shift(x, 0.5)
    tau, d = entmax15_threshold(zs, dead)
    if d is None:
        d = (zs - tau).clamp_(min=0.0)
    return d * d, d, tau


def entmax_alpha_kernel(x: Tensor, alpha, n_iter: Optional[int] = None, need_log: bool = False,
                        need_s: bool = False):
    """alpha-entmax of rows x (R, K) for alpha > 1, a float or a tensor (R, 1) or scalar.

    Returns (p, spd, tau, splogp, s): p normalized to sum 1; spd = sum_i p_i d_i (R, 1) with
    d = [zs - tau]_+, zs = (alpha - 1)(x - max) clamped, which is sum p^alpha (p = d^beta / S,
    S = 1 up to rounding); with need_log splogp = sum p^alpha log p (else None); with need_s,
    s = p / d on the support, 0 elsewhere (else None): proportional to p^(2-alpha) per row, and
    the backward formulas only use s / sum(s), which avoids a pow over the full tensor there.
    Everything is computed on the threshold's candidate block when it gave one (pow is costly
    on CPU) and scattered back."""
    am1 = alpha - 1.0 if isinstance(alpha, Tensor) else float(alpha) - 1.0
    beta = 1.0 / am1
    zs, dead = _shift(x, am1)
    tau, block = tsallis_threshold(zs, dead, beta, n_iter)
    d = ((zs if block is None else block.values) - tau).clamp_(min=0.0)
    p = tsallis_mass(d, beta)
    p = p.clone() if p is d else p
    total = p.sum(-1, keepdim=True)
    p = p.div_(torch.where(total > 0, total, torch.ones_like(total)))
    pd = p * d
    splogp = (pd * p.clamp(min=torch.finfo(p.dtype).tiny).log()).sum(-1, keepdim=True) if need_log else None
    s = p / d.clamp_(min=torch.finfo(d.dtype).tiny) if need_s else None  # 0 / tiny = 0 off the support
    full = (lambda t: t) if block is None else block.scatter
    return full(p), pd.sum(-1, keepdim=True), tau, splogp, (None if s is None else full(s))


# ---------------------------------------------------------------------------------------------
# Backward kernels on rows (branch-free: shared by both paths).

def _softmax_backward(p: Tensor, g: Tensor, dim: int) -> Tensor:
    pg = p * g
    return pg.sub_(p * pg.sum(dim, keepdim=True))


def _sparsemax_backward(p: Tensor, g: Tensor) -> Tensor:
    """g minus its mean over the support, on the support (arithmetic only: cheap on CPU)."""
    s = p.ceil()  # support indicator: p in [0, 1]
    gs = g * s
    n = s.sum(-1, keepdim=True).clamp_(min=1.0)
    mean = gs.sum(-1, keepdim=True).div_(n)
    return gs.sub_(s.mul_(mean))


def _entmax_backward(s: Tensor, g: Tensor) -> Tensor:
    """dx = s*g - (sum(s*g)/sum(s)) * s with s = p^(2-alpha) on the support."""
    sg = s * g
    ss = s.sum(-1, keepdim=True)
    coef = sg.sum(-1, keepdim=True) / torch.where(ss > 0, ss, torch.ones_like(ss))
    return sg.sub_(coef * s)


def entmax_alpha_grad_dot(g: Tensor, p: Tensor, s: Tensor, alpha: Tensor) -> Tensor:
    """sum_i g_i dp_i/dalpha (Correia et al. 2019, Prop. 1) per row (R, 1); zero where
    alpha - 1 <= SOFTMAX_BELOW. s is proportional to p^(2-alpha) on the support (only s / sum s
    enters). Expanded into row sums so that only 3 products touch the full tensor (CPU-cheap)."""
    am1 = alpha - 1.0
    am1_safe = torch.where(am1 > 0, am1, torch.ones_like(am1))
    # p log p with 0 log 0 = 0: p = 0 times the finite log(tiny) is 0, no where needed.
    plogp = p.clamp(min=torch.finfo(p.dtype).tiny).log_().mul_(p)
    ent = plogp.sum(-1, keepdim=True)
    ss = s.sum(-1, keepdim=True)
    g_skewed = (g * s).sum(-1, keepdim=True) / torch.where(ss > 0, ss, torch.ones_like(ss))
    gp = (g * p).sum(-1, keepdim=True)
    g_plogp = plogp.mul_(g).sum(-1, keepdim=True)
    # dp = (p - skewed) / am1^2 - (plogp - skewed * ent) / am1, dotted with g
    dot = (gp - g_skewed) / am1_safe**2 - (g_plogp - g_skewed * ent) / am1_safe
    return dot * (am1 > SOFTMAX_BELOW).to(dot.dtype)


def _grad_like(dx: Tensor, x: Tensor) -> Tensor:
    return dx if dx.dtype == x.dtype else dx.to(x.dtype)


# ---------------------------------------------------------------------------------------------
# autograd Functions (one per mapping): rows in, rows out, the input's shape restored.

class SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int):
        with threads_for(x):
            p = softmax_rows(compute_dtype(x).movedim(dim, -1)).movedim(-1, dim)
        ctx.dim = dim
        ctx.save_for_backward(p)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        (p,) = ctx.saved_tensors
        with threads_for(p):
            return _grad_like(_softmax_backward(p, g.to(p.dtype), ctx.dim), g), None


def rows_forward(ctx, x: Tensor, dim: int, forward_rows) -> Tensor:
    """The forward of a mapping's autograd Function, written once: x's `dim` moved last and
    flattened to rows in the compute dtype, forward_rows(rows) -> (p rows, the tuple of tensors its
    backward needs), saved on ctx; p comes back in x's shape and dtype. CPU rows run on one thread
    below the size where more help (threads_for)."""
    rows, shape = to_rows(compute_dtype(x), dim)
    with threads_for(x):
        p, saved = forward_rows(rows)
    ctx.dim, ctx.shape = dim, shape
    ctx.save_for_backward(*saved)
    return from_rows(p, shape, dim).to(x.dtype)


def rows_backward(ctx, g: Tensor, backward_rows) -> Tensor:
    """The backward that pairs with rows_forward: backward_rows(*saved, g rows) -> dx rows; returns
    the gradient for x in g's shape and dtype (the Function appends a None per other input)."""
    saved = ctx.saved_tensors
    g_rows, _ = to_rows(g.to(saved[0].dtype), ctx.dim)
    with threads_for(saved[0]):
        dx = backward_rows(*saved, g_rows)
    return _grad_like(from_rows(dx, ctx.shape, ctx.dim), g)


def _sparsemax_rows(rows: Tensor):
    p = sparsemax_kernel(rows)[0]
    return p, (p,)


def _entmax15_rows(rows: Tensor):
    p, d, _ = entmax15_kernel(rows)
    return p, (d,)  # s = p^(1/2) = d


class SparsemaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int):
        return rows_forward(ctx, x, dim, _sparsemax_rows)

    @staticmethod
    def backward(ctx, g: Tensor):
        return rows_backward(ctx, g, _sparsemax_backward), None


class Entmax15Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int):
        return rows_forward(ctx, x, dim, _entmax15_rows)

    @staticmethod
    def backward(ctx, g: Tensor):
        return rows_backward(ctx, g, _entmax_backward), None


def param_rows(alpha: Tensor, x: Tensor, dim: int):
    """A per-slice parameter (alpha, gamma) broadcastable to x with size 1 along dim ->
    ((R, 1) rows, its broadcast view)."""
    a = alpha.to(x.dtype)
    if a.dim() < x.dim():
        a = a.view((1,) * (x.dim() - a.dim()) + tuple(a.shape))
    shape = list(x.shape)
    shape[dim] = 1
    return a.expand(shape).movedim(dim, -1).reshape(-1, 1), a


class EntmaxBisectFunction(torch.autograd.Function):
    """alpha-entmax with alpha a float > 1 + SOFTMAX_BELOW, or a tensor (broadcastable to x,
    size 1 along dim) that gets a gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, alpha: Union[float, Tensor], dim: int, n_iter: Optional[int]):
        xf = compute_dtype(x)
        rows, shape = to_rows(xf, dim)
        a_rows = a_view = near_one = None
        with threads_for(x):
            a_arg = alpha
            if isinstance(alpha, Tensor):
                a_rows, a_view = param_rows(alpha, xf, dim)
                a_arg, near_one = alpha_rows(a_rows)
            p, _, _, _, s = entmax_alpha_kernel(rows, a_arg, n_iter, need_s=True)
            if near_one is not None:
                p_soft = softmax_rows(rows)
                p = with_softmax_rows(p, p_soft, a_arg, near_one)
                s = torch.where(near_one, p_soft, s)  # p^(2 - 1) = p
        ctx.dim, ctx.shape = dim, shape
        ctx.alpha_shape = None if a_view is None else (a_view.shape, alpha.shape)
        ctx.save_for_backward(p, s, a_rows)
        return from_rows(p, shape, dim).to(x.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        p, s, a_rows = ctx.saved_tensors
        g_rows = to_rows(g.to(p.dtype), ctx.dim)[0]
        dx = d_alpha = None
        with threads_for(p):
            if ctx.needs_input_grad[0]:
                dx = _grad_like(from_rows(_entmax_backward(s, g_rows), ctx.shape, ctx.dim), g)
            if a_rows is not None and ctx.needs_input_grad[1]:
                view_shape, alpha_shape = ctx.alpha_shape
                dot = from_rows(entmax_alpha_grad_dot(g_rows, p, s, a_rows), ctx.shape[:-1] + (1,), ctx.dim)
                d_alpha = dot.sum_to_size(view_shape).reshape(alpha_shape)
        return dx, d_alpha, None, None


# ---------------------------------------------------------------------------------------------
# Public functional API (names as in the `entmax` package).

def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """Softmax with the same conventions as the sparse mappings (all -inf slice -> zeros)."""
    return SoftmaxFunction.apply(x, dim)


def sparsemax(x: Tensor, dim: int = -1) -> Tensor:
    """Sparsemax (Martins & Astudillo 2016): Euclidean projection of x onto the simplex."""
    return SparsemaxFunction.apply(x, dim)


def entmax15(x: Tensor, dim: int = -1) -> Tensor:
    """1.5-entmax (Peters et al. 2019) with an exact threshold."""
    return Entmax15Function.apply(x, dim)


def entmax_bisect(x: Tensor, alpha: Union[float, Tensor] = 1.5, dim: int = -1,
                  n_iter: Optional[int] = None) -> Tensor:
    """alpha-entmax (Correia et al. 2019) for any alpha >= 1 (alpha > 2 too); alpha may be a
    per-slice tensor. alpha < 1 raises UserError (a tensor's on the CPU path; on the device path,
    which reads nothing on the host, those slices come out NaN).

    A float alpha of 1, 1.5 or 2 dispatches to the exact softmax, 1.5-entmax or sparsemax; an
    alpha within SOFTMAX_BELOW of 1 is computed as softmax. The threshold comes from Newton steps
    run to rounding level (CPU path, n_iter=None; alpha > 2: a longer fixed safeguarded search)
    or from `n_iter` bisection steps then 4 safeguarded Newton steps (n_iter given, or on the
    device path: 12 in fp32, 20 in fp64 by default).
    A tensor alpha is differentiable; it must be broadcastable to x with size 1 along `dim`
    (e.g. shape (B, 1) or a scalar).
    """
    check_n_iter(n_iter)
    if not isinstance(alpha, Tensor):
        alpha = check_alpha_value(alpha)
        if alpha - 1.0 <= SOFTMAX_BELOW:
            return softmax(x, dim)
        if alpha == ALPHA_OF["sparsemax"]:
            return sparsemax(x, dim)
        if alpha == ALPHA_OF["entmax15"]:
            return entmax15(x, dim)
    # A float alpha stays a Python number: a tensor made from it on the logits' device would be
    # a host-to-device copy (a sync on CUDA) on every call.
    return EntmaxBisectFunction.apply(x, alpha, dim, n_iter)


def entmax_bisect_steps(z, settings):
    """Bisection steps for alpha-entmax: a learned alpha is a tensor in (1, 2) by construction
    (1 + sigmoid), so beta > 1 and the short count suffices; the device path cannot read a tensor
    alpha to know that and would otherwise take the long count meant for alpha > 2. None: the
    mapping's own choice (a float alpha, read on the host)."""
    if not settings.get("learn_alpha"):
        return None
    return default_n_iter(torch.float64 if z.dtype == torch.float64 else torch.float32, beta=1.0)


__all__ = ["softmax", "sparsemax", "entmax15", "entmax_bisect", "default_n_iter", "entmax_bisect_steps",
           "threshold_path", "set_threshold_path", "uses_device_path", "THRESHOLD_PATHS"]
