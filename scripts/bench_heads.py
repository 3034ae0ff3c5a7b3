#!/usr/bin/env python
"""Benchmark the output heads: forward+backward of each mapping and each Fenchel-Young loss,
against the `entmax` package (reference implementation, benchmark oracle only) and against
softmax cross-entropy (F.cross_entropy), for K in {10, 100, 1000, 32000}.

Repetitions of all candidates are interleaved (in a new shuffled order each round) and the
median is reported, so the ratios stay meaningful on a shared, noisy machine.

On CPU, every case runs at each of --threads (default 1 and 2; torch.set_num_threads), in the
same interleaved rounds, and also with the device path forced (models.mappings.threshold_path:
the fixed-shape, host-read-free path that GPUs take) to show its cost on CPU. Two tables:
* at 1 thread, the process CPU time (which other processes on the machine do not inflate):
  ratios to the package and to cross-entropy, and the device path's cost;
* thread scaling, in wall time (CPU time adds up all threads, spinning ones included): the
  median at each thread count and the ratio to 1 thread (< 1 is faster with more threads).
On CUDA it is wall time around synchronized calls, device path only (the one CUDA takes). Usage:

    python scripts/bench_heads.py [--quick] [--device cpu|cuda|all] [--reps N] [--threads 1,2]
"""
import argparse
import random
import statistics
import sys
import time

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

import torch
import torch.nn.functional as F

from models.mappings import threshold_path
from models.registry import HEADS, check_settings

try:
    import entmax as entmax_pkg  # oracle only
except ImportError:  # pragma: no cover
    entmax_pkg = None

SIZES = [(10, 256), (100, 256), (1000, 256), (32000, 64)]
ALPHA = 1.5


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


# Settings the benchmark gives a head (others: the registry's defaults). entmax_bisect: a tensor
# alpha that requires grad (learned alpha); the package loss gets a float (its loss backward fails
# for a tensor alpha), which only makes the package faster.
def bench_settings(name, K, a_ours):
    return {"entmax_bisect": {"alpha": a_ours}, "sparse_softmax": {"k": min(5, K)}}.get(name, {})


def package_oracles(a_pkg):
    """head -> (package mapping, package loss) where the `entmax` package has the head."""
    if entmax_pkg is None:
        return {}
    return {
        "sparsemax": (entmax_pkg.sparsemax, lambda x, y: entmax_pkg.sparsemax_loss(x, y).mean()),
        "entmax15": (entmax_pkg.entmax15, lambda x, y: entmax_pkg.entmax15_loss(x, y).mean()),
        "entmax_bisect": (lambda v: entmax_pkg.entmax_bisect(v, a_pkg),
                          lambda x, y: entmax_pkg.entmax_bisect_loss(x, y, ALPHA).mean()),
        # the package's normmax: its default 50 bisection steps
        "normmax": (lambda v: entmax_pkg.normmax_bisect(v, alpha=2.0),
                    lambda x, y: entmax_pkg.normmax_bisect_loss(x, y, alpha=2.0).mean()),
    }


def make_cases(K, B, device):
    """name -> (ours, package) zero-arg callables doing forward + backward: map:<head> and
    loss:<head> for every head of the registry (models/registry.py), in training mode."""
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
        # backward(w): the vector-Jacobian product with w, and no other full-size op in the timing
        def run():
            x.grad = None
            f(x).backward(w)
        return run

    oracles = package_oracles(a_pkg)
    cases = {"ce": (fb(lambda: F.cross_entropy(x, y)), None)}
    for name, spec in HEADS.items():
        settings = {**check_settings(name, {}), **bench_settings(name, K, a_ours)}
        if spec.draws:  # a random head: a fixed draw (OutputHead passes the run's (seed, step))
            settings["draw"] = (0, 1)
        pkg_map, pkg_loss = oracles.get(name, (None, None))
        cases[f"map:{name}"] = (map_case(lambda v, spec=spec, s=settings: spec.mapping(v, -1, s)),
                                map_case(pkg_map) if pkg_map else None)
        cases[f"loss:{name}"] = (fb(lambda spec=spec, s=settings: spec.loss(x, y, s, True)),
                                 fb(lambda f=pkg_loss: f(x, y)) if pkg_loss else None)
    return cases


def _on_device_path(fn):
    def run():
        with threshold_path("device"):
            fn()
    return run


def bench(cases, device, reps, inner, thread_counts):
    """{(case, who, threads): (median wall s, median cpu s)}; who in ours / dev / pkg.

    The package runs at the first thread count only (it is the slow oracle)."""
    fns = []
    for name, (ours, pkg) in cases.items():
        for t in thread_counts:
            fns.append((name, "ours", t, ours))
            if device.type == "cpu" and name != "ce":
                fns.append((name, "dev", t, _on_device_path(ours)))
            if pkg is not None and t == thread_counts[0]:
                fns.append((name, "pkg", t, pkg))
    wall = {k[:3]: [] for k in fns}
    cpu = {k[:3]: [] for k in fns}
    for t in thread_counts:  # warm-up at each thread count
        torch.set_num_threads(t)
        for *_, tt, f in fns:
            if tt == t:
                f()
    order = random.Random(0)
    for _ in range(reps):
        for t in thread_counts:
            torch.set_num_threads(t)
            # A new order each rep: after a multi-threaded op (F.cross_entropy, the package) the
            # OpenMP worker keeps spinning for a while and slows whatever runs next on a busy
            # machine; no case should always be the one that runs next.
            for n, who, tt, f in order.sample(fns, len(fns)):
                if tt != t:
                    continue
                _sync(device)
                w0, c0 = time.perf_counter(), time.process_time()
                for _ in range(inner):
                    f()
                _sync(device)
                wall[(n, who, t)].append((time.perf_counter() - w0) / inner)
                cpu[(n, who, t)].append((time.process_time() - c0) / inner)
    return {k: (statistics.median(wall[k]), statistics.median(cpu[k])) for k in wall}


def report_cpu(K, B, cases, t, thread_counts):
    t1 = thread_counts[0]
    ce = t[("ce", "ours", t1)][1]
    rows = []
    for name in cases:
        if name == "ce":
            rows.append(f"{K:>6} {B:>4} {'F.cross_entropy':<20} {ce * 1e3:>9.3f}")
            continue
        ours = t[(name, "ours", t1)][1]
        dev = t[(name, "dev", t1)][1]
        pkg = t.get((name, "pkg", t1))
        pkg_s = f"{pkg[1] * 1e3:>9.3f} {pkg[1] / ours:>8.1f}x" if pkg else f"{'-':>9} {'-':>9}"
        rows.append(f"{K:>6} {B:>4} {name:<20} {ours * 1e3:>9.3f} {pkg_s} {ours / ce:>7.2f}x "
                    f"{dev * 1e3:>9.3f} {dev / ours:>7.2f}x")
    scaling = []
    for name in cases:
        for who in ("ours", "dev") if name != "ce" else ("ours",):
            walls = [t[(name, who, n)][0] for n in thread_counts]
            label = "F.cross_entropy" if name == "ce" else f"{name}{' [dev]' if who == 'dev' else ''}"
            cols = " ".join(f"{w * 1e3:>9.3f}" for w in walls)
            ratios = " ".join(f"{w / walls[0]:>7.2f}x" for w in walls[1:])
            scaling.append(f"{K:>6} {B:>4} {label:<22} {cols} {ratios}")
    return rows, scaling


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--device", default="all", choices=["cpu", "cuda", "all"])
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--threads", default="1,2", help="comma-separated torch CPU thread counts (first: the anchor)")
    args = ap.parse_args(argv)
    thread_counts = [int(v) for v in args.threads.split(",")]
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if args.device != "all":
        devices = [args.device]
    reps = args.reps or (5 if args.quick else 21)
    if entmax_pkg is None:
        print("note: the `entmax` package is not installed; only the ratio to cross-entropy is shown")
    for dev in devices:
        device = torch.device(dev)
        counts = thread_counts if dev == "cpu" else [torch.get_num_threads()]
        print(f"\n== device {dev}, {reps} interleaved reps, median ==")
        tables, scalings = [], []
        for K, B in SIZES:
            cases = make_cases(K, B, device)
            inner = 2 if K >= 32000 else (5 if K >= 1000 or dev == "cuda" else 20)
            t = bench(cases, device, reps, inner, counts)
            if dev == "cpu":
                rows, scaling = report_cpu(K, B, cases, t, counts)
                tables += rows
                scalings += scaling
                continue
            ce = t[("ce", "ours", counts[0])][0]
            for name in cases:
                ours = t[(name, "ours", counts[0])][0]
                pkg = t.get((name, "pkg", counts[0]))
                pkg_s = f"{pkg[0] * 1e3:>9.3f} {pkg[0] / ours:>8.1f}x" if pkg else f"{'-':>9} {'-':>9}"
                tables.append(f"{K:>6} {B:>4} {name:<20} {ours * 1e3:>9.3f} {pkg_s} {ours / ce:>7.2f}x")
        if dev == "cpu":
            print(f"-- {counts[0]} thread(s), process CPU time; [dev] = device path forced on CPU --")
            print(f"{'K':>6} {'B':>4} {'case':<20} {'ours ms':>9} {'pkg ms':>9} {'pkg/ours':>9} {'ours/CE':>8} "
                  f"{'[dev] ms':>9} {'dev/ours':>8}")
        else:
            print(f"{'K':>6} {'B':>4} {'case':<20} {'ours ms':>9} {'pkg ms':>9} {'pkg/ours':>9} {'ours/CE':>8}")
        print("\n".join(tables))
        if dev == "cpu" and len(counts) > 1:
            print(f"\n-- thread scaling, wall time ms at {', '.join(map(str, counts))} threads; "
                  f"ratio to {counts[0]} thread(s) (< 1: faster with more threads) --")
            heads_ = " ".join(f"{'t' + str(n):>9}" for n in counts)
            ratios = " ".join(f"{'t' + str(n) + '/t' + str(counts[0]):>8}" for n in counts[1:])
            print(f"{'K':>6} {'B':>4} {'case':<22} {heads_} {ratios}")
            print("\n".join(scalings))
    return 0


if __name__ == "__main__":
    sys.exit(main())
