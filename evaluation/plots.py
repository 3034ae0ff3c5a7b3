"""PNG plots of a head comparison (matplotlib, Agg backend: no display needed).

Inputs are plain dicts prepared by scripts/compare_heads.py, one entry per variant (a head, or a
head × norm × α combination), already aggregated over seeds.
"""
import math

import matplotlib

from common.io import atomic_write, through_file

matplotlib.use("Agg", force=True)  # before pyplot: no display needed
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

PLOT_FILES = {
    "accuracy": "val_accuracy.png",
    "support": "support_hist.png",
    "reliability": "reliability.png",
    "coverage": "coverage_vs_set_size.png",
    "risk_coverage": "risk_coverage.png",
    "ood": "ood_histograms.png",
}
# Reliability diagram colours, opaque so that a bar shows exactly its legend patch's colour (no
# blending of a translucent gap over the accuracy bar).
ACCURACY_COLOR = "#4c72b0"
OVERCONFIDENT_COLOR = "#e8837f"   # confidence above accuracy: from the accuracy up to the confidence
UNDERCONFIDENT_COLOR = "#82c982"  # confidence below accuracy: from the confidence up to the accuracy


def _save(fig, path):
    """The figure as a PNG, written atomically (common.io: a failure is one line, no temp file left)."""
    fig.tight_layout()
    try:
        atomic_write(path, through_file(lambda f: fig.savefig(f, format="png", dpi=110)))
    finally:
        plt.close(fig)


def plot_accuracy_curves(curves, path, weights="raw"):
    """curves: {variant: [(epoch, mean top1, std top1), ...]} -> validation top-1 vs epoch."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for variant, points in curves.items():
        if not points:
            continue
        ep, mean, std = zip(*points)
        ax.plot(ep, [100 * m for m in mean], marker="o", ms=3, label=variant)
        ax.fill_between(ep, [100 * (m - s) for m, s in zip(mean, std)],
                        [100 * (m + s) for m, s in zip(mean, std)], alpha=0.15)

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"validation top-1 (%) [{weights} weights]")
    ax.set_title("Validation accuracy (mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)


def plot_support_histograms(hists, path):
    """hists: {variant: counts per support size 1..K (summed over seeds)} -> fraction of samples."""
    fig, ax = plt.subplots(figsize=(6, 4))
    n_var = max(len(hists), 1)
    width = 0.8 / n_var
    for i, (variant, counts) in enumerate(hists.items()):
        total = sum(counts) or 1
        sizes = [s + 1 for s in range(len(counts))]
        if len(counts) <= 30:  # grouped bars while they stay readable, step lines beyond
            ax.bar([s - 0.4 + (i + 0.5) * width for s in sizes], [c / total for c in counts], width=width,
                   label=variant)
        else:
            ax.step(sizes, [c / total for c in counts], where="mid", label=variant)
    ax.set_xlabel("support size (classes with p > 0)")
    ax.set_ylabel("fraction of samples")
    ax.set_title("Support size of the output head")
    ax.legend()
    _save(fig, path)


def plot_reliability(diagrams, path):
    """diagrams: {variant: {"bin_lower", "bin_upper", "accuracy", "confidence", "count" (pooled over
    seeds), "ece_pooled", "ece_mean"}}: per confidence bin, a bar up to the lower of accuracy and mean
    confidence, and above it the gap up to the higher one in the colour of its sign (opaque, as in
    the legend), with the bin's sample count."""
    n = max(len(diagrams), 1)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.3 * cols, 4.3 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (variant, d) in zip(axes.flat, diagrams.items()):
        width = d["bin_upper"][0] - d["bin_lower"][0]
        for lo, a, c, cnt in zip(d["bin_lower"], d["accuracy"], d["confidence"], d["count"]):
            if not cnt:
                continue
            low, high = min(a, c), max(a, c)
            ax.bar(lo, low, width=width, align="edge", color=ACCURACY_COLOR, edgecolor="black", lw=0.5)
            ax.bar(lo, high - low, bottom=low, width=width, align="edge", edgecolor="black", lw=0.5,
                   color=OVERCONFIDENT_COLOR if c > a else UNDERCONFIDENT_COLOR)
            ax.text(lo + width / 2, 0.01, str(cnt), rotation=90, ha="center", va="bottom", fontsize=6,
                    color="white" if low > 0.15 else "black")
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence (max probability)")
        ax.set_ylabel("accuracy")
        ece_mean = d.get("ece_mean")
        ax.set_title(f"{variant}\nECE pooled over seeds {d['ece_pooled']:.4f}"
                     + (f", mean of per-run {ece_mean:.4f}" if ece_mean is not None else ""), fontsize=9)
        ax.legend(handles=[Patch(color=ACCURACY_COLOR, label="min(accuracy, confidence); numbers: samples"),
                           Patch(color=OVERCONFIDENT_COLOR, label="gap up to confidence: overconfident"),
                           Patch(color=UNDERCONFIDENT_COLOR, label="gap up to accuracy: underconfident")],
                  loc="upper left", fontsize=7)
    _save(fig, path)


def plot_coverage_vs_set_size(curves, points, path, epsilons=(0.1, 0.05)):
    """curves: {(variant, method): [(mean set size, coverage), ...]} over an ε sweep;
    points: {variant: (support size mean, support coverage)} for the uncalibrated sparse support.

    The sparse supports' own curves are drawn last, with large outlined markers: when calibration
    degenerates (T = 0 at every ε) the whole curve is one point, which would otherwise hide under
    the other curves' markers."""
    fig, ax = plt.subplots(figsize=(7, 4.8))
    styles = {"support": "-", "lac": "--", "aps": ":"}
    markers = {"support": "D", "lac": "o", "aps": "s"}
    colors = {}
    ordered = sorted(curves.items(), key=lambda kv: kv[0][1] == "support")  # support on top
    for (variant, method), pts in ordered:
        if not pts:
            continue
        color = colors.setdefault(variant, f"C{len(colors)}")
        xs, ys = zip(*sorted(pts))
        support = method == "support"
        ax.plot(xs, [100 * y for y in ys], styles.get(method, "-"), marker=markers.get(method, "o"),
                ms=7 if support else 3, mec="black" if support else color, mew=0.8 if support else 0.5,
                color=color, zorder=4 if support else 2, label=f"{variant} / {method}"
                + (" (one point: T = 0)" if support and len(set(pts)) == 1 else ""))
    for variant, (size, cov) in points.items():
        color = colors.setdefault(variant, f"C{len(colors)}")
        ax.plot([size], [100 * cov], marker="*", ms=14, color=color, mec="black", mew=0.8, linestyle="none",
                zorder=5, label=f"{variant} / support at T=1")
    for eps in epsilons:
        level = 100 * (1 - eps)
        ax.axhline(level, color="gray", lw=0.8, alpha=0.6, zorder=1)
        ax.annotate(f"1−ε = {level:g}% (ε = {eps:g})", xy=(0, level), xycoords=("axes fraction", "data"),
                    xytext=(4, 2), textcoords="offset points", ha="left", va="bottom", fontsize=7, color="dimgray",
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.8), zorder=6)
    ax.set_xlabel("mean prediction-set size")
    ax.set_ylabel("empirical coverage (%)")
    ax.set_title("Conformal prediction sets: coverage vs size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, path)


RISK_CONFIDENCE_LABELS = {"max_prob": "max prob", "support": "1/support size"}


def plot_risk_coverage(curves, path):
    """curves: {(variant, confidence label): [(coverage, mean selective risk over seeds), ...]}."""
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    colors = {}
    for (variant, confidence), pts in curves.items():
        color = colors.setdefault(variant, f"C{len(colors)}")
        xs, ys = zip(*pts)
        ax.plot([100 * x for x in xs], [100 * y for y in ys], "-" if confidence == "max_prob" else "--",
                color=color, label=f"{variant} / {RISK_CONFIDENCE_LABELS.get(confidence, confidence)}")
    ax.set_xlabel("coverage (% of examples answered, most confident first)")
    ax.set_ylabel("selective risk (% errors among answered)")
    ax.set_title("Risk–coverage (mean over seeds; AURC = area under it)")
    ax.set_xlim(0, 100)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, path)


def plot_ood_histograms(hists, path, ood_name):
    """hists: {variant: {score: {"edges", "in", "out"}}} pooled over seeds -> one row per variant,
    one column per score (max probability, entropy, support size), densities in-distribution vs OOD."""
    scores = [s for s in ("max_prob", "entropy", "support") if any(s in h for h in hists.values())]
    titles = {"max_prob": "max probability", "entropy": "entropy (nats)", "support": "support size"}
    rows, cols = max(len(hists), 1), max(len(scores), 1)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.6 * rows), squeeze=False)
    for r, (variant, h) in enumerate(hists.items()):
        for c, score in enumerate(scores):
            ax = axes[r][c]
            if score not in h:
                ax.axis("off")
                continue
            edges = h[score]["edges"]
            widths = [b - a for a, b in zip(edges[:-1], edges[1:])]
            for key, color, label in (("in", "C0", "in-distribution"), ("out", "C3", f"OOD ({ood_name})")):
                counts = h[score][key]
                total = sum(counts) or 1
                ax.bar(edges[:-1], [cnt / total for cnt in counts], width=widths, align="edge", color=color,
                       alpha=0.45, edgecolor=color, label=label)
            ax.set_title(f"{variant}: {titles[score]}", fontsize=9)
            ax.set_ylabel("fraction", fontsize=8)
            if r == 0 and c == 0:
                ax.legend(fontsize=7)
    _save(fig, path)
