"""The comparison report's out-of-distribution section: each head's AUROC and FPR at 95% TPR over its seeds,
each score's AUROC difference to max probability across the seeds, and the score histograms pooled over the
seeds (one run's results: evaluation/ood_report.py).

On cached features (data.dataset=features) the penultimate features, the memory and the OOD features
are the backbone's, the same for every head: the scores that read no head output
(ood_table.HEAD_FREE_SCORES) are then one number per seed for all heads, which
`shared_feature_scores` collects for the report to show once.
"""
from comparison.analysis.statistics import sign_flip_p_value, signed_points, t_interval
from data.registry import dataset_names
from evaluation import tables
from evaluation.ood_table import HEAD_FREE_SCORES, score_label

from . import plots

SAME_TOLERANCE = 1e-9  # AUROC / FPR of the same scores: equal up to float rounding


def pooled_histograms(results):
    """Add the histograms of several runs' OOD results (same head, same bins) -> {score: {...}}."""
    out = {}
    for result in results:
        for name, h in result["histograms"].items():
            if name not in out:
                out[name] = {"edges": h["edges"], "in": list(h["in"]), "out": list(h["out"])}
            else:
                out[name]["in"] = [a + b for a, b in zip(out[name]["in"], h["in"])]
                out[name]["out"] = [a + b for a, b in zip(out[name]["out"], h["out"])]
    return out


def on_cached_features(result):
    """Whether an eval result is of a run on cached features (its config's data.dataset)."""
    return result.get("dataset") in dataset_names(features=True)


def shared_feature_scores(runs):
    """The head-free scores of a comparison on cached features, once for every head.

    runs: [(seed, eval result)] of every head and seed that carries OOD results. -> {score: {"auroc": [...],
    "fpr_at_tpr": [...], "head_spread": max over seeds of max − min across heads (0 when the heads agree,
    as they should)}}, one value per seed (sorted by seed; the mean over the heads at that seed: with
    --ood-memory N the memory is drawn with the run's seed). {} unless every run is on cached features;
    a score is included only when every run has it."""
    if not runs or not all(on_cached_features(result) for _, result in runs):
        return {}
    shared = {}
    for score in HEAD_FREE_SCORES:
        if not all(score in result["ood"]["scores"] for _, result in runs):
            continue
        by_seed = {}
        for seed, result in runs:
            by_seed.setdefault(seed, []).append(result["ood"]["scores"][score])
        entry = {"auroc": [], "fpr_at_tpr": [], "head_spread": 0.0}
        for seed in sorted(by_seed, key=str):
            for key in ("auroc", "fpr_at_tpr"):
                values = [r[key] for r in by_seed[seed]]
                entry[key].append(sum(values) / len(values))
                entry["head_spread"] = max(entry["head_spread"], max(values) - min(values))
        shared[score] = entry
    return shared


def ood_section(variants):
    """(markdown lines, pooled histograms, OOD set name) when the runs carry OOD results. On cached
    features the head-free scores are one table of their own, once for every head (shared_ood_lines)."""
    rows, hists, names = [], {}, set()
    shared = shared_feature_scores([(r["seed"], r["result"]) for runs in variants.values() for r in runs
                                               if r["result"].get("ood")])
    for variant, runs in variants.items():
        oods = [r["result"]["ood"] for r in runs if r["result"].get("ood")]
        if not oods:
            continue
        names.update(f"{o['source']} (cached features)" if o.get("source") else o["dataset"] for o in oods)
        hists[variant] = pooled_histograms(oods)
        for score in (s for s in oods[0]["scores"] if s not in shared):
            rows.append([variant, score_label(score),
                         tables.format_mean_std([o["scores"][score]["auroc"] for o in oods], "pct"),
                         tables.format_mean_std([o["scores"][score]["fpr_at_tpr"] for o in oods], "pct"),
                         auroc_difference_text(oods, score)])
    if not rows:
        return [], hists, None
    name = ", ".join(sorted(names))
    first = next(r["result"]["ood"] for runs in variants.values() for r in runs if r["result"].get("ood"))
    lines = ["## Out-of-distribution detection", "",
             f"In-distribution: the evaluated split (n={first['n_in']} per run); OOD: {name} "
             f"(n={first['n_out']}). AUROC (higher is better; 50% = chance) and FPR at 95% TPR (the "
             "fraction of OOD images accepted when 95% of in-distribution images are; lower is better) "
             "for each score: max probability and entropy (Hendrycks & Gimpel, ICLR 2017) and, for "
             "sparse heads, support size; energy and max logit; with a feature memory (eval.py "
             "--ood-memory) minus the modern-Hopfield energy (E = −lse_β(Xξ) + ½‖ξ‖², Ramsauer et al., "
             "ICLR 2021) and minus its sparsemax / 1.5-entmax counterparts, the retrieval support (how "
             "many stored patterns a sparsemax retrieval keeps; more = more in-distribution), SHE and kNN "
             "(evaluation/ood_scores.py). Mean ± std over seeds; histograms pool the seeds. Δ AUROC vs "
             "max prob: the mean over seeds of each run's difference to its own max-probability AUROC, "
             "with a 95% t-interval and the exact sign-flip p over the seeds, so it includes seed-to-seed "
             "training noise (the smallest p S seeds can give is 2/2^S: 0.25 at 3; one seed: the "
             "difference alone).", "",
             tables.markdown_table(["variant", "score", "AUROC", "FPR@95%TPR", "Δ AUROC vs max prob"], rows), "",
             *shared_ood_lines(shared),
             f"![OOD score histograms]({plots.PLOT_FILES['ood']})", ""]
    return lines, hists, name


def _once(values):
    """The per-seed values as format_mean_std should see them: one value when every seed gave it."""
    return values[:1] if max(values) - min(values) <= SAME_TOLERANCE else values


def shared_ood_lines(shared):
    """Markdown lines of the head-free scores on cached features (shared_feature_scores), or []."""
    if not shared:
        return []
    rows = [[score_label(score), tables.format_mean_std(_once(e["auroc"]), "pct"),
             tables.format_mean_std(_once(e["fpr_at_tpr"]), "pct")] for score, e in shared.items()]
    spread = max(e["head_spread"] for e in shared.values())
    by_seed = any(len(_once(e[key])) > 1 for e in shared.values() for key in ("auroc", "fpr_at_tpr"))
    seeds = ("Mean ± std over seeds where the seeds differ: a memory subsampled with each run's seed (eval.py "
             "--ood-memory N), so the std is the subsample's, with no training noise in it. " if by_seed else
             "Every head and seed gave the same value (the whole training split as memory). ")
    lines = ["Scores of the cached features alone, the same for every head: on cached features "
             "(data.dataset=features) the evaluated split, the OOD set and the memory are the backbone's "
             "features for every run, and these scores read no head output, so they are shown once, not per "
             f"head. {seeds}No Δ AUROC vs max prob: against the same number for every run, its interval and p "
             "would measure max probability's seed-to-seed noise alone. SHE reads the head's predicted classes "
             "and stays in the table above.", "",
             tables.markdown_table(["score (every head)", "AUROC", "FPR@95%TPR"], rows), ""]
    if spread > SAME_TOLERANCE:  # the premise failed: say so rather than hide it in a mean
        lines += [f"Note: the heads' values of one seed differ by up to {100 * spread:.2g} pt; the table shows "
                  "their mean.", ""]
    return lines


def auroc_difference_text(oods, score, base="max_prob"):
    """AUROC(score) − AUROC(base) per run (seed), summarised across the seeds (see ood_section)."""
    if score == base:
        return "—"
    diffs = [o["scores"][score]["auroc"] - o["scores"][base]["auroc"] for o in oods
             if score in o["scores"] and base in o["scores"]]
    if not diffs:
        return "n/a"
    mean, _, low, high = t_interval(diffs)
    if len(diffs) < 2:
        return f"{signed_points(mean)} pt (1 seed)"
    return (f"{signed_points(mean)} pt [{signed_points(low)}, {signed_points(high)}], "
            f"p={sign_flip_p_value(diffs):.2g}")
