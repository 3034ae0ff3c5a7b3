"""Aggregate finished runs of a head comparison into report.md, CSVs, JSON and PNG plots.

Input: for each variant (e.g. "sparsemax", "entmax_bisect-a1.25-layernorm") the runs of its seeds,
each holding train.py's summary.json / metrics.jsonl and eval.py's JSON with its per-example records
(STEM.examples.safetensors). Every scalar metric is shown as mean ± std over seeds (sample std; a
single seed shows the value alone). Sections: the metric table; the verdicts (one sentence per
variant against its baseline, across trainings) with the sanity lines (a head at chance, a
conformal coverage below 1 − ε against its finite-sample band, a budget that ended while validation
accuracy was still rising: comparison/analysis/sanity.py) and the validation curves; the equivalence and
non-inferiority verdicts against a margin per metric (comparison/analysis/equivalence.py; also in
summary.json, machine-readable); paired differences of each variant against its baseline, across
trainings and given these trainings (comparison/analysis/paired.py); selective prediction
(selective_section.py); OOD detection when the runs were evaluated with an OOD set (ood_section.py; on
cached features the scores that read no head output once, not per head); the pooling support and its
maps for hopfield-pooled runs (pool_section.py); plots.

Numbers shown twice come from one place: the accuracy plot's last point is the table's top-1 (both
fp32 evaluations of the same weights; a mismatch is reported), the risk-coverage plot and the AURC
table come from the same per-seed curves, and both ECEs are named (mean of per-run, pooled).
"""
import csv
import json
import os
import statistics

from common import rundir
from common.io import atomic_write_text, prepare_output, read_json, write_json
from comparison import run_results
from comparison.analysis import equivalence, paired, sanity
from comparison.analysis.margins import METRIC_TABLE, default_margins, margin_as_difference, margin_units
from comparison.analysis.statistics import signed_points
from evaluation import metrics, tables
from models.registry import is_sparse

from . import plain_words, plots, pool_section
from .ood_section import ood_section
from .selective_section import selective_section

TRAIN_COLUMNS = [
    ("train_time_s", "train time (s)", "f1"),
    ("train_img_per_s", "train img/s", "f0"),
]
ECE_MEAN_LABEL = "ECE (15 bins), mean of per-run"
ECE_POOLED_LABEL = "ECE (15 bins), pooled over seeds"
SUMMARY_FILE = "summary.json"  # in the report folder: the verdicts, machine-readable (summary_document)
LOAD_NOTE = ("Train times and img/s depend on what else the machine was running: compare them only "
             "between runs made at the same time on an otherwise idle machine.")


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


def read_epochs_curve(run_dir, weights="raw"):
    """{epoch: validation top-1} from the run's epochs.csv ("<weights>_top1" column; epochs without
    an evaluation are skipped)."""
    path = os.path.join(run_dir, rundir.EPOCHS)
    curve = {}
    if os.path.isfile(path):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    curve[int(row["epoch"])] = float(row[f"{weights}_top1"])
                except (KeyError, TypeError, ValueError):
                    continue
    return curve


def load_run(run_dir, eval_file, weights="raw", seed=None):
    """One finished run: eval result + training summary + validation curve + per-example records
    (numpy arrays, None when the run's eval wrote none), the evaluation read through its checks
    (comparison/run_results.py: one line when it is damaged or another run's)."""
    result = run_results.read_result(run_dir, eval_file)
    summary = read_json(os.path.join(run_dir, rundir.SUMMARY))
    flat = tables.flatten_metrics(result)
    flat["train_time_s"] = summary.get("train_time_s")
    flat["train_img_per_s"] = summary.get("img_per_s")
    curve = {}
    for row in read_jsonl(os.path.join(run_dir, rundir.METRICS)):
        if row.get("kind") == "eval" and row.get("weights", "raw") == weights and "top1" in row:
            curve[row["epoch"]] = row["top1"]  # last one wins (a resumed run may re-log an epoch)
    if not curve:  # train.logging=false runs, or a metrics.jsonl lost: epochs.csv has the same evals
        curve = read_epochs_curve(run_dir, weights)
    records = None
    if os.path.isfile(rundir.examples_path(os.path.join(run_dir, eval_file))):
        records = run_results.read_records(run_dir, eval_file, result)
    return {"run_dir": run_dir, "seed": seed, "result": result, "flat": flat, "curve": sorted(curve.items()),
            "records": records, "pool_maps": pool_section.run_pool_maps(run_dir, eval_file, result)}


def _mean_std(values):
    vals = [v for v in values if v is not None]
    if not vals:
        return None, None
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else 0.0)


def _prediction_set_layout(variants):
    methods, epsilons = [], []
    for runs in variants.values():
        for run in runs:
            ps = (run["result"].get("prediction_sets") or {}).get("methods") or {}
            methods.extend(m for m in ps if m not in methods)
            for res in ps.values():
                epsilons.extend(e for e in res["eps"] if e not in epsilons)
    order = {"support": 0, "lac": 1, "aps": 2}
    methods.sort(key=lambda m: order.get(m, 9))
    return methods, epsilons


def table_columns(variants):
    """Every metric column that applies to at least one variant, in display order (ECE: the mean of
    the per-run ECEs; summary_table adds the pooled ECE after it)."""
    methods, epsilons = _prediction_set_layout(variants)
    cols = [(k, ECE_MEAN_LABEL if k == "ece" else label, fmt) for k, label, fmt in tables.METRIC_COLUMNS]
    if any(r["result"].get("learn_alpha") for runs in variants.values() for r in runs):
        cols.insert(0, tables.ALPHA_COLUMN)  # mean ± s.d. here; each run's in learned_alpha_section
    pooled = any(r["result"].get("pooling") for runs in variants.values() for r in runs)  # model.pool=hopfield
    return cols + (tables.POOL_COLUMNS if pooled else []) + tables.prediction_set_columns(methods, epsilons) \
        + TRAIN_COLUMNS + tables.SPEED_COLUMNS


def pooled_reliability(runs):
    """Reliability bins of all seeds added (count-weighted), and their ECE by the one formula."""
    nb = len(runs[0]["result"]["reliability"]["count"])
    count, conf_sum, acc_sum = [0] * nb, [0.0] * nb, [0.0] * nb
    for run in runs:
        rel = run["result"]["reliability"]
        for b, c in enumerate(rel["count"]):
            if c:
                count[b] += c
                conf_sum[b] += c * rel["confidence"][b]
                acc_sum[b] += c * rel["accuracy"][b]
    return metrics.calibration_from_bins(count, conf_sum, acc_sum)


def summary_table(variants):
    """(header, rows): one row per metric, one column per variant, cells 'mean ± std'."""
    names = list(variants)
    header = ["metric"] + names
    rows = [["seeds"] + [str(len(variants[v])) for v in names]]
    for key, label, fmt in table_columns(variants):
        cells = [tables.format_mean_std([r["flat"].get(key) for r in variants[v]
                                         if key != "alpha" or r["result"].get("learn_alpha")], fmt) for v in names]
        rows.append([label] + cells)
        if key == "ece":
            rows.append([ECE_POOLED_LABEL] + [tables.format_value(pooled_reliability(variants[v])["ece"], "f4")
                                              for v in names])
    return header, rows


def _curve_by_epoch(runs):
    """[(epoch, [validation top-1 of each seed evaluated then])] in epoch order."""
    by_epoch = {}
    for run in runs:
        for epoch, top1 in run["curve"]:
            by_epoch.setdefault(epoch, []).append(top1)
    return sorted(by_epoch.items())


def _plot_inputs(variants):
    acc_curves, hists, diagrams, cov_curves, points = {}, {}, {}, {}, {}
    for variant, runs in variants.items():
        acc_curves[variant] = {"mean": [(e, *_mean_std(v)) for e, v in _curve_by_epoch(runs)],
                               "seeds": [run["curve"] for run in runs if run["curve"]]}

        hist = None
        for run in runs:
            h = run["result"]["support_hist"]
            hist = list(h) if hist is None else [a + b for a, b in zip(hist, h)]
        hists[variant] = hist or []

        pooled = pooled_reliability(runs)
        diagrams[variant] = {**pooled["reliability"], "ece_pooled": pooled["ece"],
                             "ece_mean": _mean_std([r["result"]["ece"] for r in runs])[0]}

        methods = (runs[0]["result"].get("prediction_sets") or {}).get("methods") or {}
        for method in methods:
            per_eps = {}
            for run in runs:
                for pt in run["result"]["prediction_sets"]["methods"][method]["curve"]:
                    per_eps.setdefault(pt["eps"], []).append((pt["mean_set_size"], pt["coverage"]))
            cov_curves[(variant, method)] = [
                (statistics.fmean(s for s, _ in pts), statistics.fmean(c for _, c in pts), eps)
                for eps, pts in per_eps.items()]
        if is_sparse(runs[0]["result"]["head"]):  # a support worth plotting: exact zeros
            points[variant] = (statistics.fmean(r["result"]["support_mean"] for r in runs),
                               statistics.fmean(r["result"]["support_coverage"] for r in runs))
    return acc_curves, hists, diagrams, cov_curves, points


# ---------------------------------------------------------------------------------------- sections
def curve_mismatches(variants):
    """Runs whose accuracy curve ends on another top-1 than the table's (the plot and the table would
    then disagree): ["run_dir: plot 0.91 vs table 0.905", ...]."""
    out = []
    for runs in variants.values():
        for run in runs:
            if run["curve"] and run["result"].get("top1") is not None \
                    and abs(run["curve"][-1][1] - run["result"]["top1"]) > 1e-9:
                out.append(f"`{run['run_dir']}`: curve ends at {100 * run['curve'][-1][1]:.2f}%, "
                           f"eval.py gives {100 * run['result']['top1']:.2f}%")
    return out


def paired_results(variants, pairs, margins=None, multiplicity=equivalence.MULTIPLICITY):
    """(results, skipped): paired.compare_pair of each (variant, baseline) pair with records, each with
    its equivalence verdicts (add_equivalence; margins: {metric: δ} as parse_margins gives)."""
    results, skipped = [], []
    for variant, baseline in pairs:
        runs = {name: {r["seed"]: r["records"] for r in variants.get(name, []) if r["records"] is not None}
                for name in (variant, baseline)}
        res = paired.compare_pair(runs[variant], runs[baseline], variant, baseline)
        (results.append(res) if res is not None else skipped.append(f"{variant} vs {baseline}"))
    add_equivalence(results, margins, multiplicity)
    return results, skipped


def chosen_margins(margins=None):
    """{metric: (δ in the metric's written units, "default" or "given")}: the table's defaults, then
    the given ones (e.g. --margin top1=0.5) over them."""
    chosen = {m: (d, "default") for m, d in default_margins().items()}
    chosen.update({m: (float(d), "given") for m, d in (margins or {}).items()})
    return {m: chosen[m] for m in METRIC_TABLE if m in chosen}


def add_equivalence(results, margins=None, multiplicity=equivalence.MULTIPLICITY):
    """res["equivalence"] = {metric: verdict} for every pair and metric with a margin, from the
    across-trainings per-seed differences at the comparison's α (1 − their level); one Holm family per
    baseline, metric and kind of claim (comparison/analysis/equivalence.py). A pair where a head learned nothing
    gets none (its verdict is "no comparison"); one seed gives an undecided one."""
    for res in results:
        res["equivalence"] = {}
    for metric, (margin, source) in chosen_margins(margins).items():
        rule = METRIC_TABLE[metric]
        for baseline in sorted({res["baseline"] for res in results}):
            family = [res for res in results if res["baseline"] == baseline and metric in res["across"]
                      and not any(c["nothing_learned"] for c in res["learned"].values())]
            verdicts = [equivalence.equivalence_verdict(
                res["across"][metric]["per_seed"], margin_as_difference(metric, margin),
                alpha=round(1 - res["across"][metric]["level"], 12), higher_is_better=rule.higher_is_better)
                for res in family]
            for res, verdict in zip(family, equivalence.family_verdicts(verdicts, multiplicity)):
                verdict.update(metric=metric, margin_shown=margin, margin_source=source,
                               sentence=equivalence.describe_equivalence(verdict, res["variant"], baseline, metric))
                res["equivalence"][metric] = verdict


def paired_section(results, skipped, pairs):
    """Markdown lines of the paired differences: (a) across trainings, (b) given these trainings."""
    if not results and not skipped:
        return []
    base_names = sorted({b for _, b in pairs})
    lines = ["## Paired differences against the baseline", "",
             f"Each variant minus its baseline ({', '.join(base_names)}) on the same validation images, "
             "seed s paired with seed s. Two kinds of numbers, each labelled with the noise it includes. "
             "ECE: the mean of the per-run ECEs. FY loss: each head's own Fenchel-Young loss, a different "
             "function for each head, so its difference describes the training objective rather than "
             "ranking the heads.", ""]
    if results:
        header, rows = paired.across_rows(results)
        lines += ["### (a) Across trainings: would another training of this recipe differ too?", "",
                  "The unit is the training seed: the per-seed differences (seed s of the variant minus seed s "
                  "of the baseline), their mean with a 95% t-interval over seeds, the exact sign-flip "
                  "(permutation) p over seeds (its smallest possible value is 2 / 2^seeds: 0.25 with 3), and a "
                  f"two-level bootstrap ({paired.N_BOOT} resamples of seeds, then of validation images). MDD: the "
                  "smallest difference the paired t-test over these seeds detects with 80% power (non-central t); "
                  "the last column: the seeds at which a true difference the size of the observed mean would be "
                  "detected with 80% power. Both depend on the seed-to-seed s.d., which a few seeds measure "
                  "poorly, so both are ranges over its 95% χ² interval (with 3 seeds that interval spans a factor "
                  "of 12); the observed mean is not the true difference either: plan seeds from a pilot. The "
                  "verdicts above use this table's top-1 t-interval.", "",
                  tables.markdown_table(header, rows), ""]
        header, rows = paired.markdown_rows(results)
        lines += ["### (b) Given these trainings (conditional on the seeds)", "",
                  f"Paired bootstrap ({paired.N_BOOT} resamples of validation examples, one draw shared by every "
                  "seed; percentile interval), significant when the interval excludes 0; McNemar's exact test on "
                  "top-1 correctness (discordant pairs summed over seeds, which treats the seeds' answers on one "
                  "image as independent: anti-conservative). Both hold the trainings fixed: they answer \"on "
                  "these validation images, for these trainings\", not whether another training would differ.",
                  "", tables.markdown_table(header, rows), ""]
        for res in results:
            lines += [f"- {s}" for s in res["sentences"]]
        lines.append("")
    lines += [f"No paired statistics for {s}: no seed with per-example records for both." for s in skipped]
    return lines


def _p_cell(p):
    return "n/a" if p is None or p != p else f"{p:.3g}"


_SOURCE_WORDS = {"default": "the default", "given": "given"}


def margins_line(results):
    """The margins the verdicts used, each with where it came from."""
    shown = {}
    for res in results:
        for metric, v in res.get("equivalence", {}).items():
            shown[metric] = (v["margin"], v["margin_source"])
    parts = [f"{METRIC_TABLE[m].label} {equivalence.margin_text(m, d)} ({_SOURCE_WORDS[src]})"
             for m, (d, src) in shown.items()]
    missing = [m for m in METRIC_TABLE if m not in shown]
    why = {"loss": "each head's FY loss is its own function; `--margin loss=δ` asks anyway"}
    return ("Margins δ (the largest difference taken not to matter, in the metric's units): " + ", ".join(parts)
            + "".join(f"; no margin for {METRIC_TABLE[m].label} ({why.get(m, 'none given')})" for m in missing) + ".")


def control_line(results):
    """How the error rate across heads is controlled, as the verdicts applied it."""
    entries = [v for res in results for v in res.get("equivalence", {}).values()]
    alpha = f"{100 * entries[0]['alpha']:g}%"
    if entries[0]["multiplicity"] == "holm":
        return (f"Error rate: Holm's step-down (Holm 1979) across the heads compared with the same baseline, for "
                f"each metric and each kind of claim (difference, equivalence, non-inferiority): the chance of any "
                f"false claim of that kind among them is at most {alpha}; the verdicts read the Holm-adjusted "
                f"p-values, the intervals are per comparison.")
    return (f"Error rate: per comparison: each verdict is wrong with probability at most {alpha}; with several "
            f"heads the chance that at least one of them is wrong is larger (up to {alpha} per head).")


ADJUSTED_COLUMN = ("p_equivalence", "p_non_inferiority", "p_difference")  # the column's order: TOST / non-inf. / diff.


def equivalence_section(results):
    """Markdown lines of the equivalence / non-inferiority verdicts of every pair (one row per metric
    with a margin), the margins and the error-rate control; [] without any verdict."""
    rows, sentences = [], []
    for res in results:
        for metric, v in res.get("equivalence", {}).items():
            sentences.append(v["sentence"])
            rows.append([f"{res['variant']} − {res['baseline']}", METRIC_TABLE[metric].label,
                         equivalence.margin_text(metric, v["margin"]), str(v["n"]),
                         equivalence.with_unit(metric, equivalence.format_difference(metric, v["mean"])),
                         *(interval_cell(metric, v[key], _untested_cell(v)) for key in ("interval",
                                                                                     "difference_interval")),
                         _p_cell(v["p_equivalence"]), _p_cell(v["p_non_inferiority"]), _p_cell(v["p_difference"]),
                         " / ".join(_p_cell(v[f"{k}_adjusted"]) for k in ADJUSTED_COLUMN), v["verdict"]])
    if not rows:
        return []
    level = next(v for res in results for v in res["equivalence"].values())
    tost, two = f"{100 * level['interval_level']:g}%", f"{100 * level['difference_level']:g}%"
    alpha = f"{100 * level['alpha']:g}%"
    header = ["variant − baseline", "metric", "margin", "seeds", "mean", f"{tost} t-interval (TOST)",
              f"{two} t-interval", "TOST p", "non-inferiority p", "difference p",
              "adjusted p (TOST / non-inf. / difference)", "verdict"]
    return ["## Equivalence and non-inferiority", "",
            "Failing to find a difference is not evidence that there is none. Against a margin δ, the per-seed "
            f"differences (across trainings, as above) support: *superior* / *inferior* (the {two} t-interval "
            f"excludes 0 on the better / worse side), *equivalent* within ±δ (TOST, two one-sided t-tests at "
            f"{alpha}: the {tost} t-interval lies inside (−δ, +δ); Schuirmann 1987), *non-inferior* (the one-sided "
            f"test of the margin on the worse side at {alpha}: the {tost} interval's worse end inside it), else "
            "*undecided*; the verdict names the first that holds, in that order. Better is higher for top-1, "
            "lower for ECE and loss. Normal per-seed differences assumed; the noise is the seed-to-seed "
            "training noise with each seed's validation sample.", "",
            margins_line(results), "", control_line(results), "",
            tables.markdown_table(header, rows), ""] + [f"- {s}" for s in sentences] + [""]


def _untested_cell(verdict):
    """Why an equivalence verdict has no interval, in a table cell's words ("1 seed", "s.d. 0", ...)."""
    return equivalence.UNTESTED[verdict.get("untested") or "one seed"][0]


def interval_cell(metric, interval, why="1 seed"):
    low, high = interval
    if low != low:
        return f"n/a ({why})"
    return f"[{equivalence.format_difference(metric, low)}, {equivalence.format_difference(metric, high)}]"


def summary_document(results, lines):
    """summary.json: the margins, the error-rate control and, per pair, the machine-readable verdicts
    (margin, intervals, p-values, flags, verdict) with the plain-words lines."""
    entries = [v for res in results for v in res.get("equivalence", {}).values()]
    margins = {}
    for v in entries:
        margins[v["metric"]] = {"margin": v["margin_shown"], "units": margin_units(v["metric"]) or "own",
                                "margin_as_difference": v["margin"], "source": v["margin_source"]}
    keys = ("n", "mean", "sd", "margin", "alpha", "higher_is_better", "interval", "interval_level",
            "difference_interval", "difference_level", "p_lower", "p_upper", "p_equivalence", "p_non_inferiority",
            "p_superiority", "p_inferiority", "p_difference", *(f"{k}_adjusted" for k in equivalence.FAMILY_P),
            "superior", "inferior", "equivalent", "non_inferior", "verdict", "unadjusted_verdict", "untested",
            "multiplicity", "family_size", "sentence")
    return {"alpha": entries[0]["alpha"] if entries else None,
            "multiplicity": entries[0]["multiplicity"] if entries else None, "margins": margins,
            "comparisons": [{"variant": res["variant"], "baseline": res["baseline"], "seeds": res["seeds"],
                             "verdict": res["verdict"],
                             "equivalence": {m: {k: v[k] for k in keys} for m, v in res.get("equivalence", {}).items()}}
                            for res in results],
            "plain_words": list(lines)}


def mean_curves(variants):
    """{variant: [(epoch, mean validation top-1 over the seeds evaluated at that epoch)]}."""
    return {variant: [(e, statistics.fmean(v)) for e, v in _curve_by_epoch(runs)] for variant, runs in variants.items()}


def learned_checks(variants):
    """{variant: paired.learned(...)} for every variant with per-example records."""
    out = {}
    for variant, runs in variants.items():
        recs = {r["seed"]: r["records"] for r in runs if r["records"] is not None}
        if recs:
            out[variant] = paired.learned(recs, sorted(recs))
    return out


def chance_lines(variants):
    return [f"{v}: no comparison: nothing learned (top-1 {100 * c['top1']:.1f}% over {c['n_rows']} (seed, image) "
            f"rows is within noise of chance, {100 * c['chance']:.1f}% for the best constant guess)"
            for v, c in learned_checks(variants).items() if c["nothing_learned"]]


def budget_lines(variants):
    """One line: whether validation top-1 was still rising when each head's training stopped."""
    curves = mean_curves(variants)
    rising, flat, unknown = [], [], []
    last_epoch = 0
    for variant, curve in curves.items():
        n_rows = sum(r["result"].get("n") or 0 for r in variants[variant])
        up, gain, span = sanity.still_rising(curve, n_rows)
        if up is None:
            unknown.append(variant)
            continue
        last_epoch = max(last_epoch, span[1])
        (rising if up else flat).append(f"{variant} ({signed_points(gain)} pt from epoch {span[0]} to {span[1]})")
    plot = plots.PLOT_FILES["accuracy"]
    if rising:
        return [f"Budget: validation top-1 was still rising when training stopped for {', '.join(rising)}: the "
                f"verdicts compare the heads at this fixed budget ({last_epoch} epochs), not at convergence; "
                f"{plot} shows each head's learning speed, and a longer run (optim.epochs=...) can change them."]
    if flat:
        return [f"Budget: no rise beyond noise between the last epochs for any head ({', '.join(flat)}; {plot}): "
                f"a slower rise can hide in the evaluation noise, so the verdicts are still those of this "
                f"budget ({last_epoch} epochs)."]
    if unknown:
        return [f"Budget: fewer than two validation evaluations per run ({', '.join(unknown)}), so whether "
                f"training had converged is not known (train.eval_every=1 logs one per epoch)."]
    return []


def coverage_lines(variants, level=sanity.BAND_LEVEL):
    """Conformal coverages below 1 − ε: one flag line per (method, ε) below its finite-sample band,
    and one line explaining those inside it, per calibration/test size."""
    groups = {}
    for variant, runs in variants.items():
        for run in runs:
            ps = run["result"].get("prediction_sets") or {}
            calib = ps.get("calibration") or {}
            n_cal, n_test = calib.get("n_calib"), calib.get("n_eval")
            if not n_cal or not n_test:
                continue
            for method, res in (ps.get("methods") or {}).items():
                for eps, r in res["eps"].items():
                    status, band = sanity.coverage_check(r["coverage"], n_cal, n_test, float(eps), level)
                    if status in ("within band", "below band"):
                        groups.setdefault((n_cal, n_test), {}).setdefault((method, eps, band), []).append(
                            (variant, run["seed"], r["coverage"], status))
    lines = []
    for (n_cal, n_test), by_method in groups.items():
        sizes = f"n_cal={n_cal}, n_test={n_test}"
        inside = []
        for (method, eps, band), hits in by_method.items():
            target = f"{100 * (1 - float(eps)):g}%"
            band_text = f"[{100 * band[0]:.1f}%, {100 * band[1]:.1f}%]"
            low = [h for h in hits if h[3] == "below band"]
            if low:
                runs = ", ".join(f"{v} seed {seed} {100 * c:.1f}%" for v, seed, c, _ in low)
                lines.append(f"Coverage FLAG: {method} at ε={eps} covers below {target} and below its "
                             f"{100 * level:g}% finite-sample band {band_text} for {sizes} ({runs}): more than "
                             f"sampling spread; check that the calibration and validation images are exchangeable "
                             f"(same distribution, no shift between the splits).")
            covs = [c for _, _, c, status in hits if status == "within band"]
            if covs:
                low_text, high_text = f"{100 * min(covs):.1f}%", f"{100 * max(covs):.1f}%"
                span = low_text if low_text == high_text else f"{low_text[:-1]}–{high_text}"
                inside.append(f"{method} ε={eps} {span} in {len(covs)} run(s), band {band_text}")
        if inside:
            lines.append(f"Coverage: below 1 − ε but inside the {100 * level:g}% finite-sample band for {sizes}: "
                         f"{'; '.join(inside)}. Split-conformal coverage is Beta-distributed around 1 − ε (Vovk "
                         f"2012; Angelopoulos & Bates 2021), so these are sampling spread, not failures.")
    return lines


def verdict_lines(variants, results):
    """(verdicts, sanity lines): one verdict per compared variant, then the sanity checks; the same
    lines go to report.md and the terminal."""
    checks = chance_lines(variants) + budget_lines(variants) + coverage_lines(variants)
    return [res["verdict"] for res in results], checks


def verdict_section(verdicts, checks):
    if not verdicts and not checks:
        return []
    lines = ["## Verdicts", "",
             "One sentence per variant against its baseline, about another training of the same recipe "
             "(across trainings: the seed is the unit); the tables under *Paired differences* give the "
             "details, and the numbers given these trainings.", ""]
    lines += [f"- {v}" for v in verdicts]
    if checks:
        lines += ["", "Sanity checks:", ""] + [f"- {c}" for c in checks]
    lines += ["", f"![Validation accuracy vs epoch, per head]({plots.PLOT_FILES['accuracy']})", ""]
    return lines


def degenerate_notes(variants):
    """One line per (variant, ε) whose support calibration gave T = 0 in some seed."""
    notes = []
    for variant, runs in variants.items():
        per_eps = {}
        for run in runs:
            support = ((run["result"].get("prediction_sets") or {}).get("methods") or {}).get("support")
            for eps, r in ((support or {}).get("eps") or {}).items():
                per_eps.setdefault(eps, []).append(r["threshold"] == 0)
        for eps, flags in per_eps.items():
            if any(flags):
                notes.append(f"{variant}, ε={eps}: calibration gave T = 0 in {sum(flags)} of {len(flags)} run(s): "
                             f"at least 1−ε of the calibration examples have the true class on top, so the "
                             f"calibrated support is the top-1 class alone (its coverage is the top-1 "
                             f"accuracy), not a temperature-scaled support.")
    return notes


def _learned_alpha_note(run):
    """' (learned α 1.5644)' for a run whose head learned α, '' otherwise."""
    alpha = run["flat"].get("alpha")
    return f" (learned α {alpha:.4f})" if run["result"].get("learn_alpha") and alpha is not None else ""


def write_report(variants, report_dir, title, command, weights="raw", notes=(), pairs=(), missing=(), margins=None,
                 multiplicity=equivalence.MULTIPLICITY):
    """report.md + runs.csv + summary.csv + paired_statistics.json + summary.json + the PNG plots.

    variants: {name: [load_run(...)]}; pairs: [(variant, baseline variant)] for the paired statistics;
    missing: planned run directories without results (named in the report); margins: {metric: δ} over
    the metric table's defaults (parse_margins of --margin); multiplicity: "holm" or "none"
    across the heads (comparison/analysis/equivalence.py). Returns (table text, report.md path, paired results)."""
    prepare_output(report_dir, folder=True)
    header, rows = summary_table(variants)
    acc_curves, hists, diagrams, cov_curves, points = _plot_inputs(variants)
    files = {k: os.path.join(report_dir, v) for k, v in plots.PLOT_FILES.items()}
    plots.plot_accuracy_curves(acc_curves, files["accuracy"], weights=weights)
    plots.plot_support_histograms(hists, files["support"])
    plots.plot_reliability(diagrams, files["reliability"])
    plots.plot_coverage_vs_set_size(cov_curves, points, files["coverage"])
    paired_res, skipped = paired_results(variants, pairs, margins, multiplicity)
    paired_lines = paired_section(paired_res, skipped, pairs)
    verdicts, checks = verdict_lines(variants, paired_res)
    selective_lines, risk_curves = selective_section(variants)
    if risk_curves:
        plots.plot_risk_coverage(risk_curves, files["risk_coverage"])
    ood_lines, ood_hists, ood_name = ood_section(variants)
    if ood_hists:
        plots.plot_ood_histograms(ood_hists, files["ood"], ood_name)

    run_rows = []
    for variant, runs in variants.items():
        for run in runs:
            run_rows.append({"variant": variant, "seed": run["seed"], "run_dir": run["run_dir"], **run["flat"]})
    tables.write_csv(run_rows, os.path.join(report_dir, "runs.csv"))
    tables.write_csv([dict(zip(header, r)) for r in rows], os.path.join(report_dir, "summary.csv"))
    write_json(paired_res, os.path.join(report_dir, "paired_statistics.json"))
    found = plain_words.plain_words(variants, paired_res, mean_curves(variants))
    write_json(summary_document(paired_res, found), os.path.join(report_dir, SUMMARY_FILE))

    first = next(iter(variants.values()))[0]["result"]
    calib = (first.get("prediction_sets") or {}).get("calibration") or {}
    lines = [
        f"# {title}", "",
        *plain_words.section(found),
        f"Command: `{command}`", "",
        f"Dataset: {first['dataset']} ({first['split']} split, n={first['n']} per run), "
        f"model {first['model']}, {weights} weights. Cells are mean ± std over seeds; every number is "
        f"eval.py's float32 evaluation. Two ECEs: the mean of each run's ECE, and the ECE of all seeds' "
        f"examples binned together (the reliability plot's).", "",
        tables.markdown_table(header, rows), "",
        LOAD_NOTE, "",
    ]
    lines += verdict_section(verdicts, checks) + equivalence_section(paired_res) + paired_lines + selective_lines \
        + ood_lines
    lines += pool_section.pool_section(variants, report_dir)  # hopfield-pooled runs only
    lines += [
        "## Prediction sets", "",
        "Campos et al., AISTATS 2025, *Sparse Activations as Conformal Predictors*: `support` is the sparse "
        "head's own support with its temperature T calibrated so the true class is covered with "
        "probability ≥ 1−ε; `lac` (1 − p_y) and `aps` (cumulative mass, randomized with uniforms drawn "
        "per run) are the standard split-conformal scores on the head's probabilities. Empty sets count "
        "as size 0 and as misses: LAC's set is empty when no class reaches p ≥ 1 − q̂, randomized APS's "
        "when the top class's randomized score already exceeds q̂; the support is never empty. "
        + (f"Calibration data: {calib.get('source')} (n={calib.get('n_calib')}), coverage measured on "
           f"n={calib.get('n_eval')}." if calib else ""),
        "",
    ]
    all_notes = list(notes) + degenerate_notes(variants)
    small_calibration = (first.get("prediction_sets") or {}).get("warning")  # eval.py's, same n for every run
    all_notes += [small_calibration.removeprefix("warning: ")] if small_calibration else []
    all_notes += [f"the accuracy plot and the table disagree for {m}" for m in curve_mismatches(variants)]
    lines += [f"- Note: {n}" for n in all_notes]
    lines += ["", "## Plots", ""]
    for key, label in (("accuracy", "Validation accuracy vs epoch"), ("support", "Support-size histograms"),
                       ("reliability", "Reliability diagrams"), ("coverage", "Coverage vs set size")):
        lines += [f"### {label}", "", f"![{label}]({plots.PLOT_FILES[key]})", ""]
    lines += ["## Runs", ""] + [f"- {v}: " + ", ".join(f"`{r['run_dir']}`" + _learned_alpha_note(r) for r in runs)
                                for v, runs in variants.items()]
    if missing:
        lines += ["", "## Missing runs", "", "Planned but not finished (no results yet); the numbers above "
                  "leave them out:", ""] + [f"- `{m}`" for m in missing]
    path = os.path.join(report_dir, "report.md")
    atomic_write_text(path, "\n".join(lines) + "\n")
    return tables.text_table(header, rows), path, paired_res
