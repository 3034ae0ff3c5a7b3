"""Probability mappings for output heads: softmax, sparsemax, 1.5-entmax and alpha-entmax.

All four are `torch.autograd.Function`s with closed-form backward passes:

* sparsemax (Martins & Astudillo 2016, "From Softmax to Sparsemax"): Euclidean projection onto
  the simplex, p = [z - tau]_+ ; backward subtracts the mean of the gradient over the support.
* 1.5-entmax (Peters, Niculae & Martins 2019, "Sparse Sequence-to-Sequence Models"):
  p = [z/2 - tau]_+^2 with an exact threshold (their sort-based Algorithm 2 where sorting is used).
* alpha-entmax (Correia, Niculae & Martins 2019, "Adaptively Sparse Transformers"):
  p = [(alpha-1) z - tau]_+^{1/(alpha-1)}, threshold by Newton steps from the left (or a fixed
  bisection then Newton), differentiable in alpha (their closed form for dp/dalpha).

For every entmax, s = p^(2-alpha) on the support and dx = s*g - (sum(s*g)/sum(s)) * s.

Conventions shared by all mappings:
* any `dim`, any leading shape;
* -inf logits are masked: they get exact zeros and do not influence the other entries;
  a slice that is entirely -inf maps to all zeros, with a zero (not NaN) gradient;
* fp16/bf16 inputs are computed in fp32 and returned in the input dtype;
* algorithms (no full sort in eager mode; on CPU sorting 256x1000 costs ~50x a cross-entropy):
  sparsemax uses Michelot's iteration (exact, finite), 1.5-entmax Newton steps plus the exact
  closed-form root on the found support (verified), alpha-entmax Newton from the left
  (monotone, quadratic) to rounding level. At small widths every op costs about the same
  (dispatch overhead), so the loops are written for few ops per pass; the alpha-entmax backward
  reuses s = p / d from the forward (proportional to p^(2-alpha)) instead of a full-size pow. Large K first gathers the candidates (entries within
  1/(alpha-1) of the max, the only ones that can be in the support) into a small block;
  all inner loops use only adds, clamps and row sums, the cheap ops on CPU;
* under `torch.compile` the branch-free path is used (exact sort-based thresholds, fixed
  bisection + Newton for alpha-entmax): no data-dependent Python control flow, no graph breaks.
"""
from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from common.errors import UserError

# In scaled units (x - max) * (alpha - 1) every entry is outside the support when it is below -1
# (the threshold is always >= max - 1). Clamping there makes -inf and huge negative logits
# harmless (no inf - inf, no overflow when squared) without changing any output.
_FLOOR = -1.5
# A tensor alpha with alpha - 1 below this is computed as softmax (alpha = 1): the power
# 1/(alpha - 1) is beyond float precision there; the output differs from the alpha -> 1 limit
# by O(alpha - 1) and the alpha gradient of those rows is 0. A float alpha == 1 is exact softmax.
SOFTMAX_BELOW = 1e-3


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def _compute_dtype(x: Tensor) -> Tensor:
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _positions(n: int, like: Tensor, dim: int) -> Tensor:
    """1..n shaped to broadcast along `dim` of `like`."""
    shape = [1] * like.dim()
    shape[dim] = n
    return torch.arange(1, n + 1, dtype=like.dtype, device=like.device).view(shape)


def _shift(x: Tensor, dim: int, scale: Union[float, Tensor] = 1.0):
    """scale * (x - max) clamped at _FLOOR, and the mask of slices that are entirely -inf."""
    m = x.amax(dim, keepdim=True)
    dead = m == float("-inf")
    # An all -inf slice has m = -inf; clamping m to the lowest finite value keeps x - m = -inf
    # there (not NaN) and leaves every other slice unchanged: one op instead of a where.
    z = x - m.clamp_(min=torch.finfo(m.dtype).min)
    if not (isinstance(scale, float) and scale == 1.0):
        z = z * scale
    z = z.clamp_(min=_FLOOR)
    if not _compiling() and bool(dead.any()):
        # An all -inf slice would start the eager threshold iterations with an empty support
        # (0/0 steps, then _MAX_STEPS passes and the sort fallback for the whole batch). A
        # constant slice converges at once; its tau is replaced by +inf afterwards (_dead_tau).
        z.masked_fill_(dead, 0.0)
    return z, dead


# ---------------------------------------------------------------------------------------------
# Thresholds. Inputs are scaled, shifted, clamped logits z (max 0 per slice, >= _FLOOR), so the
# threshold tau lies in [-1, 0] and only entries above -1 can be in the support.

def _sparsemax_tau_sorted(zs: Tensor, dim: int) -> Tensor:
    """Exact sparsemax threshold from values sorted in descending order (Martins & Astudillo)."""
    r = _positions(zs.size(dim), zs, dim)
    cs = zs.cumsum(dim).sub_(1.0)
    k_star = (r * zs > cs).sum(dim, keepdim=True)
    return cs.gather(dim, k_star - 1) / k_star.to(zs.dtype)


def _entmax15_tau_sorted(zs: Tensor, dim: int) -> Tensor:
    """Peters et al. 2019, Algorithm 2: exact threshold for p = [z - tau]_+^2 (sorted input)."""
    r = _positions(zs.size(dim), zs, dim)
    mean = zs.cumsum(dim).div_(r)
    mean_sq = (zs * zs).cumsum(dim).div_(r)
    delta = (1.0 - r * (mean_sq - mean * mean)).div_(r).clamp_(min=0.0)
    tau = mean.sub_(delta.sqrt_())
    k_star = (tau <= zs).sum(dim, keepdim=True)
    return tau.gather(dim, k_star - 1)


def _tsallis_power(d: Tensor, beta):
    """d ** beta and d ** (beta - 1) for d >= 0 (the latter zero where d == 0)."""
    if isinstance(beta, float) and beta == 2.0:
        return d * d, d
    if isinstance(beta, float) and beta == 1.0:
        return d, d.ceil()
    # For beta > 1, 0 ** (beta - 1) is 0. A tensor beta equal to 1 (alpha = 2) gets d ** 0 = 1
    # off the support too: that only overestimates f', so Newton still never overshoots.
    d_bm1 = d.pow(beta - 1.0)
    return d_bm1 * d, d_bm1


def _tsallis_tau_fixed(z: Tensor, beta, dim: int, n_iter: int, n_newton: int) -> Tensor:
    """Root of f(tau) = sum [z - tau]_+^beta - 1 with a fixed number of steps (compile-friendly).

    Bisection keeps tau <= root; f is convex and decreasing, so the Newton steps that follow
    approach the root monotonically from the left (never overshoot) and converge quadratically.
    """
    lo = torch.full_like(z.narrow(dim, 0, 1), -1.0)
    width = 1.0
    for _ in range(n_iter):
        width *= 0.5
        mid = lo + width
        f = _tsallis_power((z - mid).clamp_(min=0.0), beta)[0].sum(dim, keepdim=True)
        lo = torch.where(f >= 1.0, mid, lo)
    for _ in range(n_newton):
        p, d_bm1 = _tsallis_power((z - lo).clamp_(min=0.0), beta)
        lo = lo + (p.sum(dim, keepdim=True) - 1.0) / (d_bm1.sum(dim, keepdim=True) * beta)
    return lo


_MAX_STEPS = 100

# Only arithmetic ops and row sums touch full-size tensors in the iterations below: on CPU,
# comparisons, torch.where and transcendental functions cost 5-50x an add over the same tensor.


def _count(d: Tensor) -> Tensor:
    """Number of positive entries per row of d in [0, 1] (tau >= -1 >= z - 1), as a float (R, 1).

    ceil maps (0, 1] to 1; it is the cheapest indicator on CPU (sign and comparisons are not)."""
    return d.ceil().sum(-1, keepdim=True)


def _michelot_tau(c: Tensor):
    """Exact sparsemax threshold of rows of c (R, m) by Michelot's iteration (Michelot 1986):
    tau <- (sum_{c > tau} c - 1) / |{c > tau}| increases monotonically to the exact value and
    stops as soon as the support no longer shrinks. Returns (tau, [c - tau]_+)."""
    tau = torch.full_like(c[:, :1], -1.0)
    d = torch.empty_like(c)
    k_prev = None
    for _ in range(_MAX_STEPS):
        torch.sub(c, tau, out=d).clamp_(min=0.0)
        k = _count(d)
        if k_prev is not None and torch.equal(k, k_prev):
            return tau, d
        tau = torch.addcdiv(tau, d.sum(-1, keepdim=True).sub_(1.0), k)
        k_prev = k
    tau = _sparsemax_tau_sorted(c.sort(-1, descending=True).values, -1)
    return tau, None


_NEWTON_HANDOFF = 1e-3


def _entmax15_tau_iter(c: Tensor) -> Tensor:
    """Exact 1.5-entmax threshold of rows of c (R, m) without sorting.

    With d = [c - tau]_+, f(tau) = sum d^2 - 1 is convex and decreasing. Left of the root
    (f >= 0) take the closed-form root for the current support S,
    tau_c = tau + (A - sqrt(A^2 - k (Q - 1))) / k (A = sum d, Q = sum d^2, k = |S|), which is
    >= the true root and equal to it iff S is the true support; right of the root take a Newton
    step, which lands left of it (convexity). A closed-form step whose support count does not
    change is exact: the row is done.

    That loop costs ~30 ops per pass, which dominates at small widths (per-op overhead), so it
    starts from plain Newton steps (5 ops per pass, monotone from the left) run until they move
    tau by less than _NEWTON_HANDOFF: from there the support is almost always final, and a
    closed-form step plus one confirming count (the same exactness test as the loop's) ends it.
    """
    tau = torch.full_like(c[:, :1], -1.0)
    d = torch.empty_like(c)
    for _ in range(_MAX_STEPS):
        torch.sub(c, tau, out=d).clamp_(min=0.0)
        # f / -f' = (Q - 1) / (2 A) >= 0 left of the root; A > 0 since max(c) = 0 > tau.
        step = (torch.linalg.vecdot(d, d).unsqueeze(-1) - 1.0).div_(d.sum(-1, keepdim=True))
        tau = torch.add(tau, step, alpha=0.5)
        if float(step.max()) <= 2.0 * _NEWTON_HANDOFF:
            break
    # Fast finish (the usual case): one closed-form step on the support S at tau, then one pass
    # to confirm that the support count at the new tau is unchanged, i.e. S was the support.
    torch.sub(c, tau, out=d).clamp_(min=0.0)
    k = _count(d)
    a = d.sum(-1, keepdim=True)
    q = torch.linalg.vecdot(d, d).unsqueeze(-1) - 1.0
    tau_c = tau + (a - torch.addcmul(a * a, k, q, value=-1.0).clamp_(min=0.0).sqrt_()).div_(k)
    torch.sub(c, tau_c, out=d).clamp_(min=0.0)
    if torch.equal(_count(d), k):
        return tau_c, d
    # General loop (a boundary entry within rounding of tau, or a slow Newton phase).
    k_prev = torch.full_like(tau, -1.0)
    closed = torch.zeros_like(tau, dtype=torch.bool)
    tol = 4.0 * torch.finfo(c.dtype).eps
    for _ in range(_MAX_STEPS):
        d = (c - tau).clamp_(min=0.0)
        k = _count(d)
        q = torch.linalg.vecdot(d, d).unsqueeze(-1) - 1.0
        # A boundary entry can flicker in and out of S by rounding; |f| at rounding level is done.
        done = (closed & (k == k_prev)) | (q.abs() <= tol)
        if bool(done.all()):
            return tau, d
        a = d.sum(-1, keepdim=True)
        left = q >= 0
        tau_c = tau + (a - (a * a - k * q).clamp_(min=0.0).sqrt_()) / k
        tau_n = tau + q / (2.0 * a)
        tau = torch.where(done, tau, torch.where(left, tau_c, tau_n))
        closed = left | done
        k_prev = k
    return _entmax15_tau_sorted(c.sort(-1, descending=True).values, -1), None


def _tsallis_tau_iter(c: Tensor, beta) -> Tensor:
    """alpha-entmax threshold of rows of c (R, m): Newton from tau = -1 (left of the root, so the
    iterates increase monotonically and converge quadratically) until the step is at rounding."""
    tau = torch.full_like(c[:, :1], -1.0)
    tol = 8.0 * torch.finfo(c.dtype).eps
    if isinstance(beta, float):
        power = lambda d: _tsallis_power(d, beta)[1]  # noqa: E731  (cheap special cases)
    else:
        bm1 = beta - 1.0  # once, not per pass: at small widths every op costs the same
        power = lambda d: d.pow(bm1)  # noqa: E731
    d = torch.empty_like(c)
    for _ in range(_MAX_STEPS):
        torch.sub(c, tau, out=d).clamp_(min=0.0)
        d_bm1 = power(d)
        # sum d^beta = <d^(beta-1), d>: one fused reduction instead of a product and a sum
        step = (torch.linalg.vecdot(d_bm1, d).unsqueeze(-1) - 1.0).div_(
            d_bm1.sum(-1, keepdim=True).mul_(beta))
        tau = tau + step
        if float(step.abs().max()) <= tol:
            break
    return tau


# Eager thresholds work on the full slice up to these sizes; above, they first gather the
# candidates (entries above -1) into a small padded block. alpha-entmax needs a pow per entry
# and step, so it compacts early; the others only add and sum, which is cheaper than gathering.
_COMPACT_MIN_K = {"sparsemax": 2048, "entmax15": 512, "alpha": 64}
_SORT_MAX_K = 16


class _Candidates:
    """Entries > -1 of each row of z2 (R, K), left-aligned in a block (R, m) padded with _FLOOR.

    With `scatter_back` (alpha-entmax, whose outputs go back to full size) the block is built
    from column indices (R, m), so that the way back is a scatter_add_ rather than a
    masked_scatter_ over the full (R, K) mask (~4-10x slower on CPU); building the indices costs
    more than the masked_select used otherwise."""

    def __init__(self, z2: Tensor, scatter_back: bool = False):
        mask = z2 > -1.0
        counts = mask.sum(-1, keepdim=True)
        self.m = max(1, int(counts.max()))
        self.shape = z2.shape
        self.useful = 2 * self.m < z2.size(-1)
        if not self.useful:
            return
        slots = torch.arange(self.m, device=z2.device) < counts
        if not scatter_back:
            out = torch.full((z2.size(0), self.m), _FLOOR, dtype=z2.dtype, device=z2.device)
            self.values = out.masked_scatter_(slots, z2.masked_select(mask))
            return
        rows, cols = mask.nonzero(as_tuple=True)  # row-major order
        counts = counts.squeeze(-1)
        slot = torch.arange(rows.numel(), device=z2.device) - (counts.cumsum(0) - counts)[rows]
        # Padding slots point at column 0; they hold _FLOOR here and zeros in scattered blocks.
        self.index = torch.zeros((z2.size(0), self.m), dtype=torch.long, device=z2.device)
        self.index.index_put_((rows, slot), cols)
        self.pad = ~slots
        self.values = z2.gather(1, self.index).masked_fill_(self.pad, _FLOOR)

    def scatter(self, block: Tensor) -> Tensor:
        """Inverse of the gather (scatter_back only): a block (R, m) back to (R, K), zeros elsewhere."""
        full = torch.zeros(self.shape, dtype=block.dtype, device=block.device)
        return full.scatter_add_(1, self.index, block.masked_fill(self.pad, 0.0))


def _threshold(z: Tensor, dim: int, kind: str, beta=None, n_iter: Optional[int] = None):
    """(tau, d, cand) for kind in {"sparsemax", "entmax15", "alpha"}: tau keepdim along dim;
    d = [z - tau]_+ when the solver produced it for the full slice (else None); cand the
    _Candidates block the solver worked on (alpha-entmax, eager) or None."""
    K = z.size(dim)
    if _compiling() or (K <= _SORT_MAX_K and kind != "alpha"):
        # Fixed-shape, branch-free path: exact sort-based thresholds, or a fixed bisection.
        if kind == "alpha":
            if n_iter is None:
                n_iter = default_n_iter(z.dtype)
            return _tsallis_tau_fixed(z, beta, dim, n_iter, _N_NEWTON), None, None
        zs = z.sort(dim, descending=True).values
        tau = (_sparsemax_tau_sorted if kind == "sparsemax" else _entmax15_tau_sorted)(zs, dim)
        return tau, None, None
    zt = z.movedim(dim, -1)
    lead = zt.shape[:-1]
    c = zt.reshape(-1, K)
    cand = None
    if K > _COMPACT_MIN_K[kind]:
        cand = _Candidates(c, scatter_back=kind == "alpha")
        if cand.useful:
            c = cand.values
        else:
            cand = None
    d = None
    if kind == "sparsemax":
        tau, d = _michelot_tau(c)
    elif kind == "entmax15":
        tau, d = _entmax15_tau_iter(c)
    else:
        if isinstance(beta, Tensor) and beta.dim() > 0:
            beta = beta.movedim(dim, -1).expand(*lead, 1).reshape(-1, 1)
        if n_iter is not None:
            tau = _tsallis_tau_fixed(c, beta, -1, n_iter, _N_NEWTON)
        else:
            tau = _tsallis_tau_iter(c, beta)
        if cand is not None:
            cand.beta = beta
            cand.tau = tau
            cand.lead = lead
    if cand is not None and kind != "alpha":
        d, cand = None, None
    if d is not None:
        d = d.reshape(*lead, K).movedim(-1, dim)
    return tau.reshape(*lead, 1).movedim(-1, dim), d, cand


def default_n_iter(dtype: torch.dtype) -> int:
    """Bisection steps before the Newton polish: enough for quadratic convergence to the dtype."""
    return 20 if dtype == torch.float64 else 12


_N_NEWTON = 4


# ---------------------------------------------------------------------------------------------
# Forward kernels (fp32/fp64 in); shared by the mappings and the losses. Each returns
# (p, d, zs): d = [zs - tau]_+ with zs the scaled, shifted, clamped logits, p = d^beta.

def softmax_forward(x: Tensor, dim: int) -> Tensor:
    m = x.amax(dim, keepdim=True)
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)
    e = (x - m).exp_()
    s = e.sum(dim, keepdim=True)
    # An all -inf slice has s == 0: e is all zeros there, divide by 1 instead of 0.
    return e.div_(torch.where(s > 0, s, torch.ones_like(s)))


def _dead_tau(tau: Tensor, dead: Tensor) -> Tensor:
    # All -inf slice: tau = +inf puts every entry outside the support (zeros, zero gradient).
    return tau.masked_fill(dead, float("inf"))


def sparsemax_kernel(x: Tensor, dim: int):
    """(p, d, tau) with d = p = [zs - tau]_+, zs = x - max clamped."""
    zs, dead = _shift(x, dim)
    tau, d, _ = _threshold(zs, dim, "sparsemax")
    tau = _dead_tau(tau, dead)
    if d is None or (not _compiling() and bool(dead.any())):
        d = (zs - tau).clamp_(min=0.0)
    return d, d, tau


def entmax15_kernel(x: Tensor, dim: int):
    """(p, d, tau) with d = [zs - tau]_+, p = d^2, zs = (x - max) / 2 clamped."""
    zs, dead = _shift(x, dim, 0.5)
    tau, d, _ = _threshold(zs, dim, "entmax15")
    tau = _dead_tau(tau, dead)
    if d is None or (not _compiling() and bool(dead.any())):
        d = (zs - tau).clamp_(min=0.0)
    return d * d, d, tau


def entmax_alpha_kernel(x: Tensor, alpha, dim: int, n_iter: Optional[int] = None,
                        need_log: bool = False, need_s: bool = False):
    """alpha-entmax for alpha > 1 (float or tensor broadcastable to x with size 1 along dim).

    Returns (p, spd, tau, splogp): p normalized to sum 1, spd = sum_i p_i d_i (keepdim) with
    d = [zs - tau]_+, zs = (alpha - 1)(x - max) clamped, which is sum p^alpha (p = d^beta / S with
    S = 1 up to rounding), and with need_log, splogp = sum p^alpha log p (else None).
    With need_s a fifth value: s = p / d on the support, 0 elsewhere. It is proportional to
    p^(2-alpha) per slice (p^(alpha-1) = d / S^(alpha-1)), and the backward formulas only use
    s / sum(s): this avoids a pow (and a where) over the full tensor in the backward."""
    if isinstance(alpha, Tensor):
        am1 = alpha.to(x.dtype) - 1.0
    else:
        am1 = float(alpha) - 1.0
    beta = 1.0 / am1
    zs, dead = _shift(x, dim, am1)
    tau, _, cand = _threshold(zs, dim, "alpha", beta, n_iter)
    tau = _dead_tau(tau, dead)
    if cand is not None and not (not _compiling() and bool(dead.any())):
        # pow only on the candidate block (pow is costly on CPU), then scattered back.
        d_c = (cand.values - cand.tau).clamp_(min=0.0)
        p_c = _tsallis_power(d_c, cand.beta)[0]
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
    p = _tsallis_power(d, beta)[0]
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
# Backward kernels.

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
# autograd Functions.

class SoftmaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int):
        p = softmax_forward(_compute_dtype(x), dim)
        ctx.dim = dim
        ctx.save_for_backward(p)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        (p,) = ctx.saved_tensors
        return _grad_like(_softmax_backward(p, g.to(p.dtype), ctx.dim), g), None


class SparsemaxFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int):
        p = sparsemax_kernel(_compute_dtype(x), dim)[0]
        ctx.dim = dim
        ctx.save_for_backward(p)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        (p,) = ctx.saved_tensors
        return _grad_like(_sparsemax_backward(p, g.to(p.dtype), ctx.dim), g), None


class Entmax15Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, dim: int):
        p, d, _ = entmax15_kernel(_compute_dtype(x), dim)
        ctx.dim = dim
        ctx.save_for_backward(d)  # s = p^(1/2) = d
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        (d,) = ctx.saved_tensors
        return _grad_like(_entmax_backward(d, g.to(d.dtype), ctx.dim), g), None


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
    """alpha-entmax with a tensor alpha (broadcastable to x, size 1 along dim), grad in alpha."""

    @staticmethod
    def forward(ctx, x: Tensor, alpha: Tensor, dim: int, n_iter: Optional[int]):
        xf = _compute_dtype(x)
        a = alpha.to(xf.dtype)
        if a.dim() < xf.dim():
            a = a.view((1,) * (xf.dim() - a.dim()) + tuple(a.shape))
        is_one = a <= 1.0 + SOFTMAX_BELOW
        # alpha == 1 is softmax exactly (and alpha - 1 <= SOFTMAX_BELOW is treated as 1, where the
        # power 1/(alpha-1) is numerically useless); computed on every call under compile
        # (no data-dependent branch), only when present in eager mode.
        need_softmax = _compiling() or bool(is_one.any())
        a_safe = torch.where(is_one, torch.full_like(a, 1.5), a)
        p, _, _, _, s = entmax_alpha_kernel(xf, a_safe, dim, n_iter, need_s=True)
        if need_softmax:
            p_soft = softmax_forward(xf, dim)
            p = torch.where(is_one, p_soft, p)
            s = torch.where(is_one, p_soft, s)  # p^(2 - 1) = p
        ctx.dim = dim
        ctx.alpha_shape = alpha.shape
        ctx.save_for_backward(p, s, a)
        return p.to(x.dtype)

    @staticmethod
    def backward(ctx, g: Tensor):
        p, s, a = ctx.saved_tensors
        dim = ctx.dim
        g = g.to(p.dtype)
        dx = _entmax_backward(s, g, dim) if ctx.needs_input_grad[0] else None
        d_alpha = None
        if ctx.needs_input_grad[1]:
            d_alpha = entmax_alpha_grad_dot(g, p, s, a, dim)
            d_alpha = d_alpha.sum_to_size(a.shape).reshape(ctx.alpha_shape)
        if dx is not None:
            dx = _grad_like(dx, g)
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
    """1.5-entmax (Peters et al. 2019) with its exact sort-based threshold."""
    return Entmax15Function.apply(x, dim)


def entmax_bisect(x: Tensor, alpha: Union[float, Tensor] = 1.5, dim: int = -1,
                  n_iter: Optional[int] = None) -> Tensor:
    """alpha-entmax (Correia et al. 2019) for alpha >= 1; alpha may be a per-slice tensor.

    A float alpha of 1, 1.5 or 2 dispatches to the exact softmax, 1.5-entmax or sparsemax; a
    tensor alpha within SOFTMAX_BELOW of 1 is computed as softmax. The threshold comes from
    Newton steps run to rounding level (eager, n_iter=None) or from `n_iter` bisection steps
    then 4 Newton steps (n_iter given, or under torch.compile: 12 in fp32, 20 in fp64).
    A tensor alpha is differentiable; it must be broadcastable to x with size 1 along `dim`
    (e.g. shape (B, 1) or a scalar).
    """
    if not isinstance(alpha, Tensor):
        alpha = _check_alpha_value(alpha)
        if alpha == 1.0:
            return softmax(x, dim)
        if alpha == 2.0:
            return sparsemax(x, dim)
        if alpha == 1.5:
            return entmax15(x, dim)
        alpha = torch.tensor(alpha, dtype=torch.float32 if x.dtype != torch.float64 else x.dtype,
                             device=x.device)
    return EntmaxBisectFunction.apply(x, alpha, dim, n_iter)


__all__ = ["softmax", "sparsemax", "entmax15", "entmax_bisect", "default_n_iter"]
