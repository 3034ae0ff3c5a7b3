"""The comparison report's selective-prediction section: risk-coverage of each head over its seeds (the table's
AURC, E-AURC and risk at each coverage, and the plot's curves, all from the same per-seed curves).

One run's numbers are evaluation/selective_report.py's (what eval.py stores); here the same curves are
recomputed from each seed's per-example records and gathered over the seeds.
"""
import numpy as np

from evaluation import tables
from evaluation.selective import risk_at_coverage, risk_coverage
from evaluation.selective_report import COVERAGES, confidences, correct_of

from . import plots

GRID = tuple(np.round(np.arange(1, 101) / 100, 2).tolist())  # coverages of the plotted curves
CONFIDENCE_LABELS = {"max_prob": "max probability", "support": "1/support size (ties: max prob)"}


def pooled(records_per_seed, head_name):
    """Over a head's seeds: {confidence: {"aurc": [per seed], "e_aurc": [...], "risk": {c: [per seed]},
    "curve": [(coverage, mean risk over seeds)] on GRID}}. Table cells and plot points both come from
    these lists."""
    out = {}
    for records in records_per_seed:
        correct = correct_of(records)
        for name, conf in confidences(records, head_name).items():
            curve = risk_coverage(conf, correct)
            entry = out.setdefault(name, {"aurc": [], "e_aurc": [], "risk": {c: [] for c in COVERAGES},
                                          "grid": []})
            entry["aurc"].append(curve["aurc"])
            entry["e_aurc"].append(curve["e_aurc"])
            for c, r in risk_at_coverage(curve, COVERAGES).items():
                entry["risk"][c].append(r)
            entry["grid"].append(risk_at_coverage(curve, GRID))
    for entry in out.values():
        grids = entry.pop("grid")
        entry["curve"] = [(c, float(np.mean([g[c] for g in grids]))) for c in GRID]
    return out


def selective_section(variants):
    """(markdown lines, plot curves) of risk-coverage per variant and confidence."""
    header = ["variant", "confidence", "AURC", "E-AURC"] + [f"risk @ {100 * c:g}% coverage" for c in COVERAGES]
    rows, curves = [], {}
    for variant, runs in variants.items():
        recs = [r["records"] for r in runs if r["records"] is not None]
        if not recs:
            continue
        for name, entry in pooled(recs, runs[0]["result"]["head"]).items():
            curves[(variant, name)] = entry["curve"]
            rows.append([variant, CONFIDENCE_LABELS[name],
                         tables.format_mean_std(entry["aurc"], "f4"), tables.format_mean_std(entry["e_aurc"], "f4")]
                        + [tables.format_mean_std(entry["risk"][c], "pct") for c in COVERAGES])
    if not rows:
        return [], curves
    lines = ["## Selective prediction", "",
             "Answer the most confident examples, abstain on the rest: selective risk (error rate among "
             "the answered) at each coverage, and its area AURC (lower is better; E-AURC = AURC minus the "
             "oracle's, comparable across accuracies; Geifman et al., ICLR 2019). Sparse heads also rank "
             "by 1/support size (ties broken by max probability). Mean ± std over seeds; the plot shows "
             "the same per-seed curves averaged.", "",
             tables.markdown_table(header, rows), "",
             f"![Risk–coverage]({plots.PLOT_FILES['risk_coverage']})", ""]
    return lines, curves
