"""Thresholds for CPU tensors: iterative, sort-free, and reading a few values on the host.

On CPU a host read costs nothing, while a sort of 256 x 1000 values costs ~50x a cross-entropy,
and comparisons, torch.where and transcendental functions cost 5-50x an add over the same tensor.
So these solvers loop until done (checked on the host), use mostly adds, clamps and row sums, and
first gather the few candidate entries of large rows into a small block:

* sparsemax: Michelot's iteration (Michelot 1986, "A finite algorithm for finding the projection
  of a point onto the canonical simplex of R^n"): exact, finite, monotone.
* 1.5-entmax: Newton steps, then the exact closed-form root on the support they found, verified.
* alpha-entmax: Newton from the left (monotone, quadratic; Correia, Niculae & Martins 2019) to
  rounding level.

Each of these reads values on the host (a sync per read on CUDA); thresholds_device.py has the
fixed-shape equivalents that GPUs and torch.compile use. Inputs follow threshold_common:
z = clamp((alpha - 1)(x - max), FLOOR), rows of shape (R, K), tau in [-1, 0].

On a few cores, intra-op threads do not pay off for the many small ops of these loops: each op
is a fork/join of the thread team, which costs more than the op when it is short, and much more
when another process holds a core (the waiting thread spins until the descheduled one runs).
`one_thread_below` runs such work on the calling thread only.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .threshold_common import FLOOR, tsallis_power
from .thresholds_device import (
    N_NEWTON,
    default_n_iter,
    entmax15_tau_sorted,
    ksubset_closed_form,
    sparsemax_tau_sorted,
    tsallis_tau_fixed,
)

# Head work on CPU tensors with at most this many elements runs on one intra-op thread. The
# cause of the slowdown it removes: every op over more than 32768 elements is an OpenMP fork/join,
# and the CPU heads issue 20-50 of them per loss call (F.cross_entropy: 7) plus masked_select's
# two-pass parallel scan; on a 2-core machine shared with other jobs the second thread is often
# descheduled, so each join waits for it. At 2 threads the 1.5-entmax loss at 256 x 1000 was
# 3-5x slower than at 1, and up to 20x under heavier load. Above this size (16 MB of
# fp32, several ms per op) the caller's thread setting is kept: there, free cores pay off.
# There is no lower bound: exp, sqrt, ceil and softmax use a second thread already at 256 x 10
# (measured with the worker's CPU time), and leaving small rows alone made them 7-80x slower.
SERIAL_MAX_NUMEL = 1 << 22


class one_thread_below:
    """Context manager: the enclosed torch ops run on one intra-op thread when numel <= limit
    (SERIAL_MAX_NUMEL by default); the caller's thread count is restored after. A class rather
    than a generator: it wraps every head call, and costs well under a microsecond this way."""

    __slots__ = ("numel", "limit", "restore")

    def __init__(self, numel: int, limit: Optional[int] = None):
        self.numel = numel
        self.limit = SERIAL_MAX_NUMEL if limit is None else limit
        self.restore = None

    def __enter__(self):
        n = torch.get_num_threads()
        if n > 1 and self.numel <= self.limit:
            torch.set_num_threads(1)
            self.restore = n
        return self

    def __exit__(self, *exc):
        if self.restore is not None:
            torch.set_num_threads(self.restore)
            self.restore = None
        return False


MAX_STEPS = 100

# Only arithmetic ops and row sums touch full-size tensors in the iterations below: on CPU,
# comparisons, torch.where and transcendental functions cost 5-50x an add over the same tensor.


def _count(d: Tensor) -> Tensor:
    """Number of positive entries per row of d in [0, 1] (tau >= -1 >= z - 1), as a float (R, 1).

    ceil maps (0, 1] to 1; it is the cheapest indicator on CPU (sign and comparisons are not)."""
    return d.ceil().sum(-1, keepdim=True)


def michelot_tau(c: Tensor):
    """Exact sparsemax threshold of rows of c (R, m) by Michelot's iteration (Michelot 1986):
    tau <- (sum_{c > tau} c - 1) / |{c > tau}| increases monotonically to the exact value and
    stops as soon as the support no longer shrinks. Returns (tau, [c - tau]_+)."""
    tau = torch.full_like(c[:, :1], -1.0)
    d = torch.empty_like(c)
    k_prev = None
    for _ in range(MAX_STEPS):
        torch.sub(c, tau, out=d).clamp_(min=0.0)
        k = _count(d)
        if k_prev is not None and torch.equal(k, k_prev):
            return tau, d
        tau = torch.addcdiv(tau, d.sum(-1, keepdim=True).sub_(1.0), k)
        k_prev = k
    tau = sparsemax_tau_sorted(c.sort(-1, descending=True).values, -1)
    return tau, None


NEWTON_HANDOFF = 1e-3


def entmax15_tau_iter(c: Tensor) -> Tensor:
    """Exact 1.5-entmax threshold of rows of c (R, m) without sorting.

    With d = [c - tau]_+, f(tau) = sum d^2 - 1 is convex and decreasing. Left of the root
    (f >= 0) take the closed-form root for the current support S,
    tau_c = tau + (A - sqrt(A^2 - k (Q - 1))) / k (A = sum d, Q = sum d^2, k = |S|), which is
    >= the true root and equal to it iff S is the true support; right of the root take a Newton
    step, which lands left of it (convexity). A closed-form step whose support count does not
    change is exact: the row is done.

    That loop costs ~30 ops per pass, which dominates at small widths (per-op overhead), so it
    starts from plain Newton steps (5 ops per pass, monotone from the left) run until they move
    tau by less than NEWTON_HANDOFF: from there the support is almost always final, and a
    closed-form step plus one confirming count (the same exactness test as the loop's) ends it.
    """
    tau = torch.full_like(c[:, :1], -1.0)
    d = torch.empty_like(c)
    for _ in range(MAX_STEPS):
        torch.sub(c, tau, out=d).clamp_(min=0.0)
        # f / -f' = (Q - 1) / (2 A) >= 0 left of the root; A > 0 since max(c) = 0 > tau.
        step = (torch.linalg.vecdot(d, d).unsqueeze(-1) - 1.0).div_(d.sum(-1, keepdim=True))
        tau = torch.add(tau, step, alpha=0.5)
        if float(step.max()) <= 2.0 * NEWTON_HANDOFF:
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
    return _entmax15_tau_loop(c, tau)


def _entmax15_tau_loop(c: Tensor, tau: Tensor):
    """entmax15_tau_iter's general loop from tau (left of the root): closed-form steps left of the
    root, Newton steps right of it, until a closed-form step keeps its support count or |f| is at
    rounding (a boundary entry within rounding of tau, or a slow Newton phase)."""
    k_prev = torch.full_like(tau, -1.0)
    closed = torch.zeros_like(tau, dtype=torch.bool)
    tol = 4.0 * torch.finfo(c.dtype).eps
    for _ in range(MAX_STEPS):
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
    return entmax15_tau_sorted(c.sort(-1, descending=True).values, -1), None


def _newton_power(beta, min_beta: float):
    """d -> d ** (beta - 1) for the Newton steps: a plain pow where every beta > 1 (0 ** positive
    = 0 off the support), the exact-zero form of tsallis_power where some beta is 1."""
    if min_beta > 1.0 and not (isinstance(beta, float) and beta == 2.0):
        bm1 = beta - 1.0  # once, not per pass: at small widths every op costs the same
        return lambda d: d.pow(bm1)
    return lambda d: tsallis_power(d, beta)[1]


def tsallis_tau_iter(c: Tensor, beta) -> Tensor:
    """alpha-entmax threshold of rows of c (R, m): Newton from tau = -1 (left of the root, so the
    iterates increase monotonically and converge quadratically) until the step is at rounding.

    That needs f convex, i.e. every beta >= 1 (alpha <= 2). For alpha > 2 the safeguarded
    bisection + Newton of the device path runs instead, with its alpha > 2 step count."""
    min_beta = beta if isinstance(beta, float) else float(beta.min())
    if min_beta < 1.0:
        return tsallis_tau_fixed(c, beta, -1, default_n_iter(c.dtype, min_beta), N_NEWTON)
    tau = torch.full_like(c[:, :1], -1.0)
    tol = 8.0 * torch.finfo(c.dtype).eps
    power = _newton_power(beta, min_beta)
    d = torch.empty_like(c)
    for _ in range(MAX_STEPS):
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
COMPACT_MIN_K = {"sparsemax": 2048, "entmax15": 512, "alpha": 64}
SORT_MAX_K = 16


class Candidates:
    """Entries > -1 of each row of z2 (R, K), left-aligned in a block (R, m) padded with FLOOR.

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
            out = torch.full((z2.size(0), self.m), FLOOR, dtype=z2.dtype, device=z2.device)
            self.values = out.masked_scatter_(slots, z2.masked_select(mask))
            return
        rows, cols = mask.nonzero(as_tuple=True)  # row-major order
        counts = counts.squeeze(-1)
        slot = torch.arange(rows.numel(), device=z2.device) - (counts.cumsum(0) - counts)[rows]
        # Padding slots point at column 0; they hold FLOOR here and zeros in scattered blocks.
        self.index = torch.zeros((z2.size(0), self.m), dtype=torch.long, device=z2.device)
        self.index.index_put_((rows, slot), cols)
        self.pad = ~slots
        self.values = z2.gather(1, self.index).masked_fill_(self.pad, FLOOR)

    def scatter(self, block: Tensor) -> Tensor:
        """Inverse of the gather (scatter_back only): a block (R, m) back to (R, K), zeros elsewhere."""
        full = torch.zeros(self.shape, dtype=block.dtype, device=block.device)
        return full.scatter_add_(1, self.index, block.masked_fill(self.pad, 0.0))


def _compact(c: Tensor, kind: str, scatter_back: bool = False) -> Optional[Candidates]:
    """The candidate block of rows c (R, K) when it pays off (large K, few candidates), else None."""
    if c.size(-1) <= COMPACT_MIN_K[kind]:
        return None
    block = Candidates(c, scatter_back=scatter_back)
    return block if block.useful else None


def sparsemax_threshold(c: Tensor):
    """(tau (R, 1), d = [c - tau]_+ or None) for rows c (R, K). Tiny rows (K <= SORT_MAX_K) use
    the sort-based threshold: sorting 16 values is cheap and their cumulative sums exact enough."""
    if c.size(-1) <= SORT_MAX_K:
        return sparsemax_tau_sorted(c.sort(-1, descending=True).values, -1), None
    block = _compact(c, "sparsemax")
    tau, d = michelot_tau(c if block is None else block.values)
    return tau, (d if block is None else None)


def entmax15_threshold(c: Tensor):
    """(tau (R, 1), d = [c - tau]_+ or None) for rows c (R, K) of 1.5-entmax (see sparsemax_threshold)."""
    if c.size(-1) <= SORT_MAX_K:
        return entmax15_tau_sorted(c.sort(-1, descending=True).values, -1), None
    block = _compact(c, "entmax15")
    tau, d = entmax15_tau_iter(c if block is None else block.values)
    return tau, (d if block is None else None)


def tsallis_threshold(c: Tensor, beta, n_iter: Optional[int] = None):
    """(tau (R, 1), block) for rows c (R, K) of alpha-entmax, beta = 1/(alpha-1) a float or (R, 1).

    block: the Candidates the solver worked on (its `values` and `scatter` back to (R, K)), or
    None for the full rows. A given n_iter asks for the fixed bisection + Newton of the device path."""
    block = _compact(c, "alpha", scatter_back=True)
    values = c if block is None else block.values
    if n_iter is not None:
        return tsallis_tau_fixed(values, beta, -1, n_iter, N_NEWTON), block
    return tsallis_tau_iter(values, beta), block


def ksubset_threshold(z: Tensor, k: int) -> Tensor:
    """tau (R, 1) of the k-subset projection of rows z (R, N), shifted by their k-th largest value
    and clamped to [-2, 2] (thresholds_device.ksubset_threshold), without sorting: bisection of
    [-1, 0] (g(-1) >= k > g(0)) where each step first tries the closed form on the sets at the
    midpoint and a row stops as soon as that gives sum = k to rounding (checked on the host)."""
    lo = torch.full_like(z[:, :1], -1.0)
    hi = torch.zeros_like(lo)
    tol = 4.0 * torch.finfo(z.dtype).eps * z.size(-1)
    tau = lo
    done = torch.zeros_like(lo, dtype=torch.bool)
    for _ in range(MAX_STEPS):
        mid = 0.5 * (lo + hi)
        tau = torch.where(done, tau, ksubset_closed_form(z, mid, float(k)))
        done = ((z - tau).clamp_(0.0, 1.0).sum(-1, keepdim=True) - k).abs_() <= tol
        if bool(done.all()):
            break
        right = (z - mid).clamp_(0.0, 1.0).sum(-1, keepdim=True) >= k  # g(mid) >= k: the root is right of mid
        lo, hi = torch.where(right, mid, lo), torch.where(right, hi, mid)
    return tau
