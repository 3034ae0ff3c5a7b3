"""Aggregate finished runs of a head comparison into report.md, CSVs and PNG plots.

Input: for each variant (e.g. "sparsemax", "entmax_bisect-a1.25-layernorm") the run directories of
its seeds, each holding train.py's summary.json / metrics.jsonl and eval.py's JSON. Every scalar
metric is shown as mean ± std over seeds (sample std; a single seed shows the value alone).
"""
import json
import os
import statistics

from . import metrics, plots, report

TRAIN_COLUMNS = [
    ("train_time_s", "train time (s)", "f1"),
    ("train_img_per_s", "train img/s", "f0"),
]


def read_jsonl(path):
    rows = []
    if os.path.isfile(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a line cut by a kill; train.py truncates these on resume
    return rows


def load_run(run_dir, eval_file, weights="raw"):
    """One finished run: eval result + training summary + validation curve."""
    with open(os.path.join(run_dir, eval_file)) as f:
        result = json.load(f)
    with open(os.path.join(run_dir, "summary.json")) as f:
        summary = json.load(f)
    flat = report.flatten_metrics(result)
    flat["train_time_s"] = summary.get("train_time_s")
    flat["train_img_per_s"] = summary.get("img_per_s")
    curve = {}
    for row in read_jsonl(os.path.join(run_dir, "metrics.jsonl")):
        if row.get("kind") == "eval" and row.get("weights", "raw") == weights and "top1" in row:
            curve[row["epoch"]] = row["top1"]  # last one wins (a resumed run may re-log an epoch)
    return {"run_dir": run_dir, "result": result, "flat": flat, "curve": sorted(curve.items())}


def _mean_std(values):
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def table_columns(variants):
    """Every metric column that applies to at least one variant, in display order."""
    methods, epsilons = [], []
    for runs in variants.values():
        for run in runs:
            ps = (run["result"].get("prediction_sets") or {}).get("methods") or {}
            methods.extend(m for m in ps if m not in methods)
            for res in ps.values():
                epsilons.extend(e for e in res["eps"] if e not in epsilons)
    order = {"support": 0, "lac": 1, "aps": 2}
    methods.sort(key=lambda m: order.get(m, 9))
    return (report.METRIC_COLUMNS + report.prediction_set_columns(methods, epsilons)
            + TRAIN_COLUMNS + report.SPEED_COLUMNS)


def summary_table(variants):
    """(header, rows): one row per metric, one column per variant, cells 'mean ± std'."""
    names = list(variants)
    header = ["metric"] + names
    rows = [["seeds"] + [str(len(variants[v])) for v in names]]
    for key, label, fmt in table_columns(variants):
        cells = [report.format_mean_std([r["flat"].get(key) for r in variants[v]], fmt) for v in names]
        rows.append([label] + cells)
    return header, rows


def _plot_inputs(variants):
    acc_curves, hists, diagrams, cov_curves, points = {}, {}, {}, {}, {}
    for variant, runs in variants.items():
        by_epoch = {}
        for run in runs:
            for epoch, top1 in run["curve"]:
                by_epoch.setdefault(epoch, []).append(top1)
        acc_curves[variant] = [(e, *_mean_std(v)) for e, v in sorted(by_epoch.items())]

        hist = None
        for run in runs:
            h = run["result"]["support_hist"]
            hist = list(h) if hist is None else [a + b for a, b in zip(hist, h)]
        hists[variant] = hist or []

        # Pool the bins over seeds (count-weighted), then the pooled ECE by the one formula.
        nb = len(runs[0]["result"]["reliability"]["count"])
        count, conf_sum, acc_sum = [0] * nb, [0.0] * nb, [0.0] * nb
        for run in runs:
            rel = run["result"]["reliability"]
            for b, c in enumerate(rel["count"]):
                if c:
                    count[b] += c
                    conf_sum[b] += c * rel["confidence"][b]
                    acc_sum[b] += c * rel["accuracy"][b]
        pooled = metrics.calibration_from_bins(count, conf_sum, acc_sum)
        diagrams[variant] = {**pooled["reliability"], "ece": pooled["ece"]}

        methods = (runs[0]["result"].get("prediction_sets") or {}).get("methods") or {}
        for method in methods:
            per_eps = {}
            for run in runs:
                for pt in run["result"]["prediction_sets"]["methods"][method]["curve"]:
                    per_eps.setdefault(pt["eps"], []).append((pt["mean_set_size"], pt["coverage"]))
            cov_curves[(variant, method)] = [
                (statistics.fmean(s for s, _ in pts), statistics.fmean(c for _, c in pts))
                for pts in per_eps.values()]
        if runs[0]["result"]["head"] != "softmax":
            points[variant] = (statistics.fmean(r["result"]["support_mean"] for r in runs),
                               statistics.fmean(r["result"]["support_coverage"] for r in runs))
    return acc_curves, hists, diagrams, cov_curves, points


def write_report(variants, report_dir, title, command, weights="raw", notes=()):
    """report.md + runs.csv + summary.csv + the PNG plots; returns (table text, report.md path)."""
    os.makedirs(report_dir, exist_ok=True)
    header, rows = summary_table(variants)
    acc_curves, hists, diagrams, cov_curves, points = _plot_inputs(variants)
    files = {k: os.path.join(report_dir, v) for k, v in plots.PLOT_FILES.items()}
    plots.plot_accuracy_curves(acc_curves, files["accuracy"], weights=weights)
    plots.plot_support_histograms(hists, files["support"])
    plots.plot_reliability(diagrams, files["reliability"])
    plots.plot_coverage_vs_set_size(cov_curves, points, files["coverage"])

    run_rows = []
    for variant, runs in variants.items():
        for run in runs:
            run_rows.append({"variant": variant, "run_dir": run["run_dir"], **run["flat"]})
    report.write_csv(run_rows, os.path.join(report_dir, "runs.csv"))
    report.write_csv([dict(zip(header, r)) for r in rows], os.path.join(report_dir, "summary.csv"))

    first = next(iter(variants.values()))[0]["result"]
    calib = (first.get("prediction_sets") or {}).get("calibration") or {}
    lines = [
        f"# {title}", "",
        f"Command: `{command}`", "",
        f"Dataset: {first['dataset']} ({first['split']} split, n={first['n']} per run), "
        f"model {first['model']}, {weights} weights. Cells are mean ± std over seeds.", "",
        report.markdown_table(header, rows), "",
        "Prediction sets (Campos et al., AISTATS 2025, *Sparse Activations as Conformal Predictors*):",
        "`support` is the sparse head's own support with its temperature calibrated so the true class",
        "is covered with probability ≥ 1−ε; `lac` (1 − p_y) and `aps` (cumulative mass) are the",
        "standard split-conformal scores on the head's probabilities. "
        + (f"Calibration data: {calib.get('source')} (n={calib.get('n_calib')}), coverage measured on "
           f"n={calib.get('n_eval')}." if calib else ""),
        "",
    ]
    lines += [f"Note: {n}" for n in notes]
    lines += ["", "## Plots", ""]
    for key, label in (("accuracy", "Validation accuracy vs epoch"), ("support", "Support-size histograms"),
                       ("reliability", "Reliability diagrams"), ("coverage", "Coverage vs set size")):
        lines += [f"### {label}", "", f"![{label}]({plots.PLOT_FILES[key]})", ""]
    lines += ["## Runs", ""] + [f"- {v}: " + ", ".join(f"`{r['run_dir']}`" for r in runs)
                                for v, runs in variants.items()]
    path = os.path.join(report_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return report.text_table(header, rows), path
