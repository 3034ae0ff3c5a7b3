"""PNG plots of a head comparison (matplotlib, Agg backend: no display needed).

Inputs are plain dicts prepared by scripts/compare_heads.py, one entry per variant (a head, or a
head × norm × α combination), already aggregated over seeds.
"""
import math

import matplotlib
import numpy as np

from common.io import atomic_write, through_file

matplotlib.use("Agg", force=True)  # before pyplot: no display needed
import matplotlib.pyplot as plt
from matplotlib.patches import Patch, Rectangle
from matplotlib.ticker import MaxNLocator

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


def _save(fig, path, tight=True):
    """The figure as a PNG, written atomically (common.io: a failure is one line, no temp file left);
    `tight=False` keeps a layout the caller made (constrained, or tight with a margin)."""
    if tight:
        fig.tight_layout()
    try:
        atomic_write(path, through_file(lambda f: fig.savefig(f, format="png", dpi=110)))
    finally:
        plt.close(fig)


def same_as_earlier(series):
    """{variant: the earlier variant whose data is identical} (e.g. entmax_bisect at its default
    α = 1.5 and entmax15): such a line is drawn dashed over the other and its legend says so."""
    seen, out = {}, {}
    for variant, data in series.items():
        key = repr(data)
        if key in seen:
            out[variant] = seen[key]
        else:
            seen[key] = variant
    return out


def plot_tuning_history(name, trials, path):
    """trials: [{"number", "state", "value"}] of one study -> each trial's tune top-1 (pruned: at the
    epoch it stopped) and the best complete one so far (compare_heads --tune)."""
    fig, ax = plt.subplots(figsize=(6.0, 3.8))
    for state, marker, label in (("COMPLETE", "o", "complete"), ("PRUNED", "x", "pruned (its last epoch)")):
        pts = [(t["number"], 100 * t["value"]) for t in trials if t["state"] == state and t["value"] is not None]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, s=28, label=label, color="C0" if state == "COMPLETE" else "C3")
    best, steps = -math.inf, []
    for t in sorted(trials, key=lambda t: t["number"]):
        if t["state"] == "COMPLETE" and t["value"] is not None:
            best = max(best, 100 * t["value"])
        if best > -math.inf:
            steps.append((t["number"], best))
    if steps:
        ax.step(*zip(*steps), where="post", color="C1", lw=1.5, label="best complete so far")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial")
    ax.set_ylabel("tune top-1 (%)")
    ax.set_title(f"Tuning history: {name}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_tuning_importance(name, importances, path, complete):
    """importances: {setting: Optuna's importance (sums to 1)} -> horizontal bars, largest on top;
    `complete`: the complete trials they were fitted to, in the title (the PNG may be read alone)."""
    items = sorted(importances.items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(5.5, 0.5 + 0.45 * len(items) + 0.8))
    ax.barh([k for k, _ in items], [v for _, v in items], color="C0")
    ax.set_xlim(0, 1)
    ax.set_xlabel("importance (fANOVA share of the tune top-1's variance)")
    ax.set_title(f"Setting importance: {name} (from {complete} complete trials)", fontsize=10)
    ax.grid(alpha=0.3, axis="x")
    _save(fig, path)


def plot_accuracy_curves(curves, path, weights="raw"):
    """curves: {variant: {"mean": [(epoch, mean top1, std top1), ...], "seeds": [[(epoch, top1), ...]
    per seed]}} (or just the "mean" list) -> validation top-1 vs epoch: each head's mean ± std over
    seeds, its seeds as thin lines (the learning speed, and the seed-to-seed spread behind it)."""
    fig, ax = plt.subplots(figsize=(6.5, 4.3))
    means = {v: (e["mean"] if isinstance(e, dict) else e) for v, e in curves.items()}
    twins = same_as_earlier(means)
    evaluations = max((len(m) for m in means.values()), default=0)
    for i, (variant, entry) in enumerate(curves.items()):
        points, seeds = (entry["mean"], entry.get("seeds", [])) if isinstance(entry, dict) else (entry, [])
        if not points:
            continue
        color = f"C{i}"
        twin = f" = {twins[variant]} (same numbers)" if variant in twins else ""
        for seed_curve in seeds:
            if seed_curve:
                ep_s, top_s = zip(*seed_curve)
                ax.plot(ep_s, [100 * t for t in top_s], color=color, lw=0.7, alpha=0.45)
        ep, mean, std = zip(*points)
        ax.plot(ep, [100 * m for m in mean], marker="o", ms=4, lw=2, color=color, ls="--" if twin else "-",
                label=(f"{variant} (mean of {len(seeds)} seed{'s' if len(seeds) != 1 else ''})" if seeds else variant)
                + twin)
        ax.fill_between(ep, [100 * (m - s) for m, s in zip(mean, std)],
                        [100 * (m + s) for m, s in zip(mean, std)], color=color, alpha=0.15)

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs are whole numbers
    ax.set_xlabel("epoch")
    ax.set_ylabel(f"validation top-1 (%) [{weights} weights]")
    title = "Validation accuracy per head: mean ± std over seeds (thin: each seed)"
    if evaluations <= 2:  # two points joined by a line are not a measured curve
        title += (f"\nonly {evaluations} evaluation{'s' if evaluations != 1 else ''} per run (one per epoch), "
                  "joined by straight lines")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def plot_support_histograms(hists, path):
    """hists: {variant: counts per support size 1..K (summed over seeds)} -> fraction of samples.

    A dense head (every sample's support is all K classes) is named in the title, not drawn: its one
    bar at K would stretch the axis. The axis ends at the largest support a sparse head used, so
    100 classes stay readable; each group of bars is centred on its integer, with a tick there."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    dense = [v for v, c in hists.items() if c and sum(c) and c[-1] == sum(c)]
    sparse = {v: c for v, c in hists.items() if c and sum(c) and v not in dense}
    twins = same_as_earlier(sparse)
    top = max((max(s + 1 for s, n in enumerate(c) if n) for c in sparse.values()), default=1)
    width = 0.8 / max(len(sparse), 1)
    for i, (variant, counts) in enumerate(sparse.items()):
        total = sum(counts)
        sizes = list(range(1, top + 1))
        label = variant + (f" = {twins[variant]} (same numbers)" if variant in twins else "")
        if top <= 30:  # grouped bars while they stay readable, step lines beyond
            ax.bar([s - 0.4 + (i + 0.5) * width for s in sizes], [counts[s - 1] / total for s in sizes],
                   width=width, label=label, color=f"C{list(hists).index(variant)}",
                   hatch="//" if variant in twins else None)
        else:
            ax.step(sizes, [counts[s - 1] / total for s in sizes], where="mid", label=label,
                    color=f"C{list(hists).index(variant)}", ls="--" if variant in twins else "-")
    if top <= 30:
        ax.set_xticks(range(1, top + 1))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    classes = len(next(iter(hists.values()), []) or [])
    ax.set_xlabel(f"support size (classes with p > 0, of {classes})")
    ax.set_ylabel("fraction of samples")
    ax.set_title("Support size of the output head"
                 + (f"\n{', '.join(dense)}: always all {classes} classes (dense), not drawn" if dense else ""),
                 fontsize=10)
    if sparse:
        ax.legend()
    _save(fig, path)


def plot_reliability(diagrams, path):
    """diagrams: {variant: {"bin_lower", "bin_upper", "accuracy", "confidence", "count" (pooled over
    seeds), "ece_pooled", "ece_mean"}}: per confidence bin, a bar up to the lower of accuracy and mean
    confidence, and above it the gap up to the higher one in the colour of its sign (opaque, as in
    the legend). Under each diagram, the bin's sample count as its own bar chart with the number
    printed above each bar (log scale: the top bin often holds most samples). One legend for the
    figure, below the panels, so it covers no bar."""
    n = max(len(diagrams), 1)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig = plt.figure(figsize=(4.4 * cols, 5.4 * rows + 0.6), layout="constrained")
    grid = fig.add_gridspec(2 * rows, cols, height_ratios=[3.2, 1.0] * rows)
    for k, (variant, d) in enumerate(diagrams.items()):
        r, c = divmod(k, cols)
        ax = fig.add_subplot(grid[2 * r, c])
        ax_count = fig.add_subplot(grid[2 * r + 1, c], sharex=ax)
        width = d["bin_upper"][0] - d["bin_lower"][0]
        bins = [(lo, a, conf, cnt) for lo, a, conf, cnt in zip(d["bin_lower"], d["accuracy"], d["confidence"],
                                                                d["count"]) if cnt]
        lo = [b[0] for b in bins]
        low = [min(b[1], b[2]) for b in bins]
        gap = [abs(b[1] - b[2]) for b in bins]
        counts = [b[3] for b in bins]
        bar = dict(width=width, align="edge", edgecolor="black", lw=0.5)
        ax.bar(lo, low, color=ACCURACY_COLOR, **bar)
        ax.bar(lo, gap, bottom=low, color=[OVERCONFIDENT_COLOR if conf > a else UNDERCONFIDENT_COLOR
                                           for _, a, conf, _ in bins], **bar)
        ax_count.bar(lo, counts, color="0.6", **bar)
        for x, cnt in zip(lo, counts):
            ax_count.text(x + width / 2, cnt * 1.15, str(cnt), ha="center", va="bottom", fontsize=7,
                          rotation=90 if cnt >= 1000 else 0, color="black")
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_ylabel("accuracy")
        ax.tick_params(labelbottom=False)
        ece_mean = d.get("ece_mean")
        ax.set_title(f"{variant}\nECE {d['ece_pooled']:.4f} pooled over seeds"
                     + (f"\n{ece_mean:.4f} mean of per-run" if ece_mean is not None else ""), fontsize=9)
        ax_count.set_yscale("log")
        ax_count.set_ylim(0.8, max(counts or [1]) * 12)  # room for the numbers above the bars
        ax_count.set_ylabel("samples", fontsize=8)
        ax_count.set_xlabel("confidence (max probability)")
        ax_count.tick_params(axis="y", labelsize=7)
    fig.legend(handles=[Patch(color=ACCURACY_COLOR, label="min(accuracy, confidence)"),
                        Patch(color=OVERCONFIDENT_COLOR, label="gap up to confidence: overconfident"),
                        Patch(color=UNDERCONFIDENT_COLOR, label="gap up to accuracy: underconfident"),
                        Patch(color="0.6", label="samples per bin (lower panels)")],
               loc="outside lower center", ncol=2 if cols < 3 else 4, fontsize=8, frameon=False)
    _save(fig, path, tight=False)


def plot_coverage_vs_set_size(curves, points, path, epsilons=(0.1, 0.05)):
    """curves: {(variant, method): [(mean set size, coverage, ε), ...]} over an ε sweep;
    points: {variant: (support size mean, support coverage)} for the uncalibrated sparse support.
    The x axis ends past the largest set at the report's ε (smaller ε, whose sets reach all classes,
    run off the right edge, as the axis label says); the sparse supports' points at the report's ε
    are labelled with their ε, so overlapping markers say which they are.

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
        xs, ys = zip(*sorted((s, c) for s, c, _ in pts))
        support = method == "support"
        ax.plot(xs, [100 * y for y in ys], styles.get(method, "-"), marker=markers.get(method, "o"),
                ms=7 if support else 3, mec="black" if support else color, mew=0.8 if support else 0.5,
                color=color, zorder=4 if support else 2, label=f"{variant} / {method}"
                + (" (one point: T = 0)" if support and len({(s, c) for s, c, _ in pts}) == 1 else ""))
        if support:
            for s, c, eps in pts:
                if any(math.isclose(eps, e) for e in epsilons):
                    ax.annotate(f"ε={eps:g}", xy=(s, 100 * c), xytext=(6, -10 if eps == min(epsilons) else 4),
                                textcoords="offset points", fontsize=7, color=color, zorder=7)
    for variant, (size, cov) in points.items():
        color = colors.setdefault(variant, f"C{len(colors)}")
        ax.plot([size], [100 * cov], marker="*", ms=14, color=color, mec="black", mew=0.8, linestyle="none",
                zorder=5, label=f"{variant} / support at T=1")
    for eps in epsilons:
        level = 100 * (1 - eps)
        ax.axhline(level, color="gray", lw=0.8, alpha=0.6, zorder=1)
        # in the right margin, outside the axes: a label inside them sat on the curves it names
        ax.annotate(f"1−ε = {level:g}%\n(ε = {eps:g})", xy=(1, level), xycoords=("axes fraction", "data"),
                    xytext=(4, 0), textcoords="offset points", ha="left", va="center", fontsize=7,
                    color="dimgray", annotation_clip=False)
    at_report = [s for pts in curves.values() for s, _, eps in pts if eps >= min(epsilons) - 1e-12]
    at_report += [size for size, _ in points.values()]
    widest = max((s for pts in curves.values() for s, _, _ in pts), default=0)
    right = max(at_report, default=0)
    if at_report and widest > 1.3 * right + 0.5:
        ax.set_xlim(left=0, right=1.3 * right + 0.5)
        ax.set_xlabel(f"mean prediction-set size (ε < {min(epsilons):g} beyond the right edge, up to {widest:.0f})")
    else:
        ax.set_xlabel("mean prediction-set size")
    ax.set_ylabel("empirical coverage (%)")
    ax.set_title("Conformal prediction sets: coverage vs size")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)  # off the curves
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


OOD_SCORE_TITLES = {"max_prob": "max probability", "entropy": "entropy (nats)",
                    "support": "support size (classes with p > 0)"}


def plot_ood_histograms(hists, path, ood_name):
    """hists: {variant: {score: {"edges", "in", "out"}}} pooled over seeds -> one row per variant,
    one column per score (max probability, entropy, support size), densities in-distribution vs OOD.
    Every panel has its x label; one legend for the figure, above the panels; a score a head does
    not have (support size of a dense head) gets a panel saying why instead of an empty one."""
    scores = [s for s in ("max_prob", "entropy", "support") if any(s in h for h in hists.values())]
    rows, cols = max(len(hists), 1), max(len(scores), 1)
    fig, axes = plt.subplots(rows, cols, figsize=(3.8 * cols, 2.9 * rows + 0.5), squeeze=False)
    labels = {"in": "in-distribution", "out": f"OOD ({ood_name})"}
    for r, (variant, h) in enumerate(hists.items()):
        for c, score in enumerate(scores):
            ax = axes[r][c]
            if score not in h:
                ax.set_xticks([])
                ax.set_yticks([])
                for spine in ax.spines.values():
                    spine.set_color("0.8")
                why = ("(dense head: every class has p > 0,\nso the support is always all classes)"
                       if score == "support" else "(not computed for this head)")
                ax.text(0.5, 0.5, f"{variant}: no {OOD_SCORE_TITLES[score].split(' (')[0]} score\n{why}",
                        ha="center", va="center", fontsize=8, color="0.35", transform=ax.transAxes)
                ax.set_title(f"{variant}: {OOD_SCORE_TITLES[score]}", fontsize=9, color="0.35")
                continue
            edges = h[score]["edges"]
            widths = [b - a for a, b in zip(edges[:-1], edges[1:])]
            for key, color in (("in", "C0"), ("out", "C3")):
                counts = h[score][key]
                total = sum(counts) or 1
                ax.bar(edges[:-1], [cnt / total for cnt in counts], width=widths, align="edge", color=color,
                       alpha=0.45, edgecolor=color, label=labels[key])
            ax.set_title(f"{variant}: {OOD_SCORE_TITLES[score]}", fontsize=9)
            ax.set_xlabel(OOD_SCORE_TITLES[score], fontsize=8)
            ax.set_ylabel("fraction of images", fontsize=8)
            ax.tick_params(labelsize=7)
    fig.legend(handles=[Patch(color="C0", alpha=0.45, label=labels["in"]),
                        Patch(color="C3", alpha=0.45, label=labels["out"])],
               loc="upper center", ncol=2, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / fig.get_figheight()))
    _save(fig, path, tight=False)


POOL_MAPS_FILE = "pool_support_maps.png"  # hopfield-pooled runs only (not in PLOT_FILES: avg runs have none)
USED_PATCH_CMAP = "autumn_r"  # light yellow (small weight) to red (the largest weight of the image)


def _patch_overlay(weights, grid):
    """(RGBA (grid, grid, 4) over an image, per-patch RGB of the outlines): used patches lightly tinted
    by weight relative to the image's largest (so the image stays visible), unused ones (weight 0)
    dimmed to near black."""
    w = np.asarray(weights, dtype=np.float64).reshape(grid, grid)
    top = w.max() if w.max() > 0 else 1.0
    colors = plt.get_cmap(USED_PATCH_CMAP)(0.15 + 0.85 * w / top)[..., :3]
    rgba = np.zeros((grid, grid, 4))
    rgba[..., :3] = colors
    rgba[..., 3] = np.where(w > 0, 0.05 + 0.3 * w / top, 0.0)
    rgba[w <= 0] = (0.0, 0.0, 0.0, 0.72)
    return rgba, colors


def plot_pool_support_maps(rows, path):
    """rows: [{"title": run label, "images": uint8 (K, H, W, C), "weights": (K, heads, N) pooling
    weights, "grid": patches per side, "captions": [K strings]}] -> one row of K images per run, each
    with the patches its pooled feature uses tinted by weight (union over heads: the largest head's
    weight) and the unused patches dimmed."""
    cols = max(len(r["images"]) for r in rows)
    fig, axes = plt.subplots(len(rows), cols, figsize=(2.3 * cols, 2.8 * len(rows) + 0.6), squeeze=False)
    for r, row in enumerate(rows):
        grid = int(row["grid"])
        for c in range(cols):
            ax = axes[r][c]
            ax.set_xticks([])
            ax.set_yticks([])
            if c >= len(row["images"]):
                ax.axis("off")
                continue
            image = np.asarray(row["images"][c])
            h, w = image.shape[:2]
            ax.imshow(image.squeeze(-1) if image.shape[-1] == 1 else image, cmap="gray",
                      interpolation="nearest", extent=(0, w, h, 0))
            per_patch = np.asarray(row["weights"][c]).max(axis=0)  # (N,): used if any head uses it
            overlay, colors = _patch_overlay(per_patch, grid)
            ax.imshow(overlay, interpolation="nearest", extent=(0, w, h, 0))
            ph, pw = h / grid, w / grid
            for i, j in zip(*np.nonzero(per_patch.reshape(grid, grid) > 0)):  # outline each used patch
                ax.add_patch(Rectangle((j * pw + 0.35, i * ph + 0.35), pw - 0.7, ph - 0.7, fill=False,
                                       edgecolor=colors[i, j], lw=1.2))
            ax.set_xlim(0, w)
            ax.set_ylim(h, 0)
            ax.set_title(row["captions"][c], fontsize=7)
            if c == 0:
                ax.set_ylabel(row["title"], fontsize=8)
    fig.suptitle("Hopfield pooling support: outlined patches are used (yellow → red: small → the image's "
                 "largest weight), dark ones unused", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.35 / fig.get_figheight()), h_pad=1.0)  # room for the title
    _save(fig, path, tight=False)
