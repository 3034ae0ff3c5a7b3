#!/usr/bin/env python
"""Benchmark the output heads: forward+backward of each mapping and each Fenchel-Young loss,
against the `entmax` package (reference implementation, benchmark oracle only) and against
softmax cross-entropy (F.cross_entropy), for K in {10, 100, 1000, 32000}.

Repetitions of all candidates are interleaved (round-robin) and the median is reported, so the
ratios stay meaningful on a shared, noisy machine. On CPU the clock is the process CPU time
(time.process_time), which other processes on the machine do not inflate, and torch uses
--threads threads (default 1); on CUDA it is wall time around synchronized calls. Usage:

    python scripts/bench_heads.py [--quick] [--device cpu|cuda|all] [--reps N] [--threads N]
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from models import heads  # noqa: E402

try:
    import entmax as entmax_pkg  # oracle only
except ImportError:  # pragma: no cover
    entmax_pkg = None

SIZES = [(10, 256), (100, 256), (1000, 256), (32000, 64)]
ALPHA = 1.5  # ours: a tensor that requires grad (learned alpha); the package loss gets a float
# (its loss backward fails for a tensor alpha), which only makes the package faster.


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def make_cases(K, B, device):
    """name -> (ours, package) zero-arg callables doing forward + backward."""
    g = torch.Generator(device="cpu").manual_seed(K)
    x = (torch.randn(B, K, generator=g) * 2).to(device).requires_grad_()
    y = torch.randint(0, K, (B,), generator=g).to(device)
    w = torch.randn(B, K, generator=g).to(device)
    a_ours = torch.tensor(ALPHA, device=device, requires_grad=True)
    a_pkg = torch.full((B, 1), ALPHA, device=device, requires_grad=True)

    def fb(fn):
        def run():
            x.grad = None
            fn().backward()
        return run

    def map_case(f):
        return fb(lambda: (f(x) * w).sum())

    cases = {
        "ce": (fb(lambda: F.cross_entropy(x, y)), None),
        "map:sparsemax": (map_case(heads.sparsemax), map_case(entmax_pkg.sparsemax) if entmax_pkg else None),
        "map:entmax15": (map_case(heads.entmax15), map_case(entmax_pkg.entmax15) if entmax_pkg else None),
        "map:entmax_a": (map_case(lambda v: heads.entmax_bisect(v, a_ours)),
                         map_case(lambda v: entmax_pkg.entmax_bisect(v, a_pkg)) if entmax_pkg else None),
        "loss:softmax": (fb(lambda: heads.softmax_loss(x, y)), None),
        "loss:sparsemax": (fb(lambda: heads.sparsemax_loss(x, y)),
                           fb(lambda: entmax_pkg.sparsemax_loss(x, y).mean()) if entmax_pkg else None),
        "loss:entmax15": (fb(lambda: heads.entmax15_loss(x, y)),
                          fb(lambda: entmax_pkg.entmax15_loss(x, y).mean()) if entmax_pkg else None),
        "loss:entmax_a": (fb(lambda: heads.entmax_bisect_loss(x, y, a_ours)),
                          fb(lambda: entmax_pkg.entmax_bisect_loss(x, y, ALPHA).mean()) if entmax_pkg else None),
    }
    return cases


def bench(cases, device, reps, inner):
    fns = []
    for name, (ours, pkg) in cases.items():
        fns.append((name, "ours", ours))
        if pkg is not None:
            fns.append((name, "pkg", pkg))
    times = {(n, w): [] for n, w, _ in fns}
    for _, _, f in fns:  # warm-up
        f()
    clock = time.perf_counter if device.type == "cuda" else time.process_time
    for _ in range(reps):
        for n, w, f in fns:
            _sync(device)
            t0 = clock()
            for _ in range(inner):
                f()
            _sync(device)
            times[(n, w)].append((clock() - t0) / inner)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--device", default="all", choices=["cpu", "cuda", "all"])
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if args.device != "all":
        devices = [args.device]
    reps = args.reps or (5 if args.quick else 21)
    if entmax_pkg is None:
        print("note: the `entmax` package is not installed; only the ratio to cross-entropy is shown")
    for dev in devices:
        device = torch.device(dev)
        print(f"\n== device {dev} (threads {torch.get_num_threads()}), {reps} interleaved reps, median ==")
        print(f"{'K':>6} {'B':>4} {'case':<15} {'ours ms':>9} {'pkg ms':>9} {'pkg/ours':>9} {'ours/CE':>8}")
        for K, B in SIZES:
            cases = make_cases(K, B, device)
            inner = 2 if K >= 32000 else (5 if K >= 1000 or dev == "cuda" else 20)
            t = bench(cases, device, reps, inner)
            ce = t[("ce", "ours")]
            for name in cases:
                if name == "ce":
                    print(f"{K:>6} {B:>4} {'F.cross_entropy':<15} {ce * 1e3:>9.3f}")
                    continue
                ours = t[(name, "ours")]
                pkg = t.get((name, "pkg"))
                pkg_s = f"{pkg * 1e3:>9.3f} {pkg / ours:>8.1f}x" if pkg else f"{'-':>9} {'-':>9}"
                print(f"{K:>6} {B:>4} {name:<15} {ours * 1e3:>9.3f} {pkg_s} {ours / ce:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
