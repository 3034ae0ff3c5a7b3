"""Turning metric dicts into CSV rows and terminal/markdown tables (JSON: common.io.write_json).

Shared by eval.py (one checkpoint) and the comparison's report (comparison/report/: mean ± std over seeds).
"""
import csv
import io
import math
import statistics

from common.io import atomic_write_text

from .ood_table import score_label

# Scalar metrics in display order: (key in the flattened dict, label, format).
METRIC_COLUMNS = [
    ("top1", "top-1 acc", "pct"),
    ("top5", "top-5 acc", "pct"),
    ("balanced_accuracy", "mean per-class acc", "pct"),
    ("worst_class_accuracy", "worst-class acc", "pct"),
    ("loss", "FY loss", "f4"),
    ("nll", "NLL (finite part)", "f4"),
    ("zero_prob_frac", "P(p_y = 0)", "pct"),
    ("ece", "ECE (15 bins)", "f4"),
    ("support_mean", "support size mean", "f2"),
    ("support_median", "support size median", "f1"),
    ("support_coverage", "support contains y", "pct"),
]
# Hopfield pooling support (eval.json "pooling"), flattened as pool_<key>.
POOL_KEYS = ("support_mean", "support_median", "support_fraction_mean", "num_patches")
POOL_COLUMNS = [
    ("pool_support_mean", "pooling support mean (patches)", "f2"),
    ("pool_support_median", "pooling support median", "f1"),
    ("pool_support_fraction_mean", "pooling support / patches", "pct"),
]
ALPHA_COLUMN = ("alpha", "α (learned)", "f4")  # head.learn_alpha runs only (eval.json "learn_alpha")
SPEED_COLUMNS = [
    ("img_per_s", "eval img/s", "f0"),
]


# Selective prediction and OOD detection scalars (flattened keys; confidences / scores that apply).
SELECTIVE_COLUMNS = [
    ("sel_max_prob_aurc", "AURC (max prob)", "f4"),
    ("sel_max_prob_e_aurc", "E-AURC (max prob)", "f4"),
    ("sel_support_aurc", "AURC (1/support)", "f4"),
    ("sel_support_e_aurc", "E-AURC (1/support)", "f4"),
]
def prediction_set_columns(methods, epsilons):
    """Flattened keys of prediction-set results: ps_<method>_eps<ε>_{coverage,size,empty,threshold}.

    Every method shows its empty-set fraction (LAC's sets can be empty, so its mean size alone looks
    smaller than a sparse support that never is); the support method also its calibrated
    temperature T, which reads "T = 0" (the top-1 set) when calibration degenerates."""
    cols = []
    for method in methods:
        for eps in epsilons:
            base = f"ps_{method}_eps{eps}"
            cols.append((f"{base}_coverage", f"{method} ε={eps} coverage", "pct"))
            cols.append((f"{base}_size", f"{method} ε={eps} mean set size", "f2"))
            cols.append((f"{base}_empty", f"{method} ε={eps} empty sets", "pct"))
            if method == "support":
                cols.append((f"{base}_threshold", f"{method} ε={eps} calibrated T", "temperature"))
    return cols


def flatten_metrics(result):
    """Scalars of an eval result (eval.py's JSON) as one flat dict, for CSV rows and tables."""
    flat = {}
    for key, value in result.items():
        if isinstance(value, (int, float, str)) and not isinstance(value, bool) or value is None:
            flat[key] = value
    ps = result.get("prediction_sets") or {}
    calib = ps.get("calibration") or {}
    for key in ("source", "n_calib", "n_eval"):
        if key in calib:
            flat[f"ps_calib_{key}"] = calib[key]
    for method, res in (ps.get("methods") or {}).items():
        for eps, r in res["eps"].items():
            base = f"ps_{method}_eps{eps}"
            flat[f"{base}_coverage"] = r["coverage"]
            flat[f"{base}_size"] = r["mean_set_size"]
            flat[f"{base}_threshold"] = r["threshold"]
            flat[f"{base}_empty"] = r.get("empty_frac")
    pooling = result.get("pooling") or {}  # hopfield pooling (evaluation/pool_support.py)
    for key in POOL_KEYS:
        if key in pooling:
            flat[f"pool_{key}"] = pooling[key]
    for name, res in (result.get("selective") or {}).items():
        flat[f"sel_{name}_aurc"] = res["aurc"]
        flat[f"sel_{name}_e_aurc"] = res["e_aurc"]
    ood = result.get("ood") or {}
    for name, res in (ood.get("scores") or {}).items():
        flat[f"ood_{name}_auroc"] = res["auroc"]
        flat[f"ood_{name}_fpr95"] = res["fpr_at_tpr"]
    if ood:
        flat["ood_dataset"] = ood.get("dataset")
    return flat


def csv_text(rows):
    """Rows (dicts) -> CSV text with the union of their keys as header, in first-seen order."""
    header = []
    for row in rows:
        header.extend(k for k in row if k not in header)
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=header)
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buf.getvalue()


def write_csv(rows, path):
    """csv_text(rows) -> `path` atomically (a kill mid-write leaves the old file, never a header alone)."""
    atomic_write_text(path, csv_text(rows))


def format_temperature(values):
    """The support method's calibrated T over seeds. T = 0 is no temperature: every calibration score
    at the quantile is 0 (true class on top), and the set is the top-1 class alone."""
    vals = [v for v in values if isinstance(v, (int, float)) and v is not None and not math.isnan(v)]
    if not vals:
        return "n/a"
    zeros = sum(1 for v in vals if v == 0)
    if zeros == len(vals):
        return "T = 0 (top-1 set)" if len(vals) == 1 else f"T = 0 in {zeros}/{len(vals)} (top-1 set)"
    rest = format_mean_std([v for v in vals if v != 0], "f3")
    return rest if not zeros else f"{rest}; T = 0 in {zeros}/{len(vals)}"


def format_value(value, fmt):
    if fmt == "temperature":
        return format_temperature([value])
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    if fmt == "pct":
        return f"{100 * value:.2f}%"
    if fmt.startswith("f"):
        return f"{value:.{int(fmt[1:])}f}"
    return str(value)


def format_mean_std(values, fmt):
    """'mean ± std' over seeds (sample std; just the mean for one seed; n/a if none finite)."""
    if fmt == "temperature":
        return format_temperature(values)
    vals = [v for v in values if isinstance(v, (int, float)) and v is not None and math.isfinite(v)]
    if not vals:
        return "n/a"
    mean = statistics.fmean(vals)
    if len(vals) == 1:
        return format_value(mean, fmt)
    std = statistics.stdev(vals)
    if fmt == "pct":
        return f"{100 * mean:.2f} ± {100 * std:.2f}%"
    digits = int(fmt[1:]) if fmt.startswith("f") else 3
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def text_table(header, rows):
    """Plain aligned table for the terminal."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) for i, h in enumerate(header)]
    line = lambda cells: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    out = [line(header), "  ".join("-" * w for w in widths)]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def markdown_table(header, rows):
    out = ["| " + " | ".join(str(h) for h in header) + " |",
           "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
    out.extend("| " + " | ".join(str(c) for c in r) + " |" for r in rows)
    return "\n".join(out)


def eval_columns(result):
    """All display columns that apply to one eval result."""
    ps = (result.get("prediction_sets") or {}).get("methods") or {}
    epsilons = []
    for res in ps.values():
        epsilons.extend(e for e in res["eps"] if e not in epsilons)
    alpha = [ALPHA_COLUMN] if result.get("learn_alpha") else []
    return alpha + METRIC_COLUMNS + prediction_set_columns(list(ps), epsilons) + SELECTIVE_COLUMNS + SPEED_COLUMNS


def ood_table(ood):
    """Terminal table of one eval result's OOD detection block."""
    rows = [(score_label(name), format_value(r["auroc"], "pct"), format_value(r["fpr_at_tpr"], "pct"))
            for name, r in ood["scores"].items()]
    title = f"OOD detection: in-distribution n={ood['n_in']} vs {ood['dataset']} n={ood['n_out']}"
    memory = ood.get("memory")
    if memory:
        title += (f"; feature memory: {memory['n']} training images ({memory['source']}, "
                  f"{memory['seconds']:.1f} s; scores {memory['score_seconds']:.1f} s)")
    return title + "\n" + text_table(("score", "AUROC", f"FPR@{100 * ood['tpr']:g}%TPR"), rows)


def eval_table(result):
    """Two-column terminal table of one eval result."""
    flat = flatten_metrics(result)
    rows = [(label, format_value(flat.get(key), fmt)) for key, label, fmt in eval_columns(result)
            if key in flat or not key.startswith("sel_support")]
    rows.insert(0, ("samples", str(result.get("n"))))
    calib = (result.get("prediction_sets") or {}).get("calibration")
    if calib:
        rows.append(("prediction-set calibration", f"{calib['source']} (n={calib['n_calib']}, "
                                                   f"evaluated on n={calib['n_eval']})"))
    return text_table(("metric", "value"), rows)
