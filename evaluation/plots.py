"""PNG plots of a head comparison (matplotlib, Agg backend: no display needed).

Inputs are plain dicts prepared by scripts/compare_heads.py, one entry per variant (a head, or a
head × norm × α combination), already aggregated over seeds.
"""
import math

PLOT_FILES = {
    "accuracy": "val_accuracy.png",
    "support": "support_hist.png",
    "reliability": "reliability.png",
    "coverage": "coverage_vs_set_size.png",
}


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _plt().close(fig)


def plot_accuracy_curves(curves, path, weights="raw"):
    """curves: {variant: [(epoch, mean top1, std top1), ...]} -> validation top-1 vs epoch."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for variant, points in curves.items():
        if not points:
            continue
        ep, mean, std = zip(*points)
        ax.plot(ep, [100 * m for m in mean], marker="o", ms=3, label=variant)
        ax.fill_between(ep, [100 * (m - s) for m, s in zip(mean, std)],
                        [100 * (m + s) for m, s in zip(mean, std)], alpha=0.15)
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"validation top-1 (%) [{weights} weights]")
    ax.set_title("Validation accuracy (mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend()
    _save(fig, path)


def plot_support_histograms(hists, path):
    """hists: {variant: counts per support size 1..K (summed over seeds)} -> fraction of samples."""
    plt = _plt()
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
    """diagrams: {variant: {"bin_lower", "bin_upper", "accuracy", "confidence", "count", "ece"}}."""
    plt = _plt()
    n = max(len(diagrams), 1)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 4 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.axis("off")
    for ax, (variant, d) in zip(axes.flat, diagrams.items()):
        width = d["bin_upper"][0] - d["bin_lower"][0]
        acc = [a if a is not None else 0.0 for a in d["accuracy"]]
        conf = [c if c is not None else (lo + width / 2) for c, lo in zip(d["confidence"], d["bin_lower"])]
        ax.bar(d["bin_lower"], acc, width=width, align="edge", edgecolor="black", label="accuracy")
        ax.bar(d["bin_lower"], [c - a if cnt else 0 for a, c, cnt in zip(acc, conf, d["count"])],
               bottom=acc, width=width, align="edge", color="red", alpha=0.3, label="gap")
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence (max probability)")
        ax.set_ylabel("accuracy")
        ax.set_title(f"{variant}  ECE={d['ece']:.3f}")
        ax.legend(loc="upper left", fontsize=8)
    _save(fig, path)


def plot_coverage_vs_set_size(curves, points, path, epsilons=(0.1, 0.05)):
    """curves: {(variant, method): [(mean set size, coverage), ...]} over an ε sweep;
    points: {variant: (support size mean, support coverage)} for the uncalibrated sparse support."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    styles = {"support": "-", "lac": "--", "aps": ":"}
    colors = {}
    for (variant, method), pts in curves.items():
        if not pts:
            continue
        color = colors.setdefault(variant, f"C{len(colors)}")
        xs, ys = zip(*sorted(pts))
        ax.plot(xs, [100 * y for y in ys], styles.get(method, "-"), marker="o", ms=3, color=color,
                label=f"{variant} / {method}")
    for variant, (size, cov) in points.items():
        color = colors.setdefault(variant, f"C{len(colors)}")
        ax.plot([size], [100 * cov], marker="*", ms=12, color=color, linestyle="none",
                label=f"{variant} / support at T=1")
    for eps in epsilons:
        ax.axhline(100 * (1 - eps), color="gray", lw=0.8, alpha=0.6)
    ax.set_xlabel("mean prediction-set size")
    ax.set_ylabel("empirical coverage (%)")
    ax.set_title("Conformal prediction sets: coverage vs size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _save(fig, path)
