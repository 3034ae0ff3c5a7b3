"""What a head comparison found, in plain words: the last lines on the terminal and the top of report.md.

Every number here is read from the comparison's own data structures (the runs' flattened metrics,
as the table shows them, and the paired results across trainings that the verdicts use), and every
claim follows the same rule as the verdicts: a difference is called a win only when the
t-interval over seeds excludes 0; otherwise the line says the heads are not distinguishable at
this budget and what would settle it (more seeds, a longer run, tuning). Not distinguishable is not
the same as equally good: the margin lines say, per metric with a margin, whether each head is
within ±δ of its baseline (TOST), non-inferior, better, worse or undecided (evaluation/equivalence.py,
the sentences the report's equivalence section gives). Nothing here is a fixed conclusion: with other
numbers the sentences change.
"""
import contextvars

from models.registry import is_sparse

from . import equivalence, report, sanity
from .statistics import METRIC_TABLE, mdd_range_text, seeds_range_text, signed_points

MINUS = "\u2212"

SET_EPSILON = "0.1"  # prediction sets are summarised at 90% coverage
HEADER = "In plain words (from the numbers above; 'across trainings' = would another training differ too):"


def _cell(runs, key, fmt):
    """A metric of one variant as the table shows it (mean ± s.d. over seeds)."""
    return report.format_mean_std([r["flat"].get(key) for r in runs], fmt)


def _mean(runs, key):
    vals = [r["flat"].get(key) for r in runs if isinstance(r["flat"].get(key), (int, float))]
    return sum(vals) / len(vals) if vals else None


def _signed(x, digits):
    """ECE differences in the table's own units (not points): '+0.0221', '−0.0150'."""
    return f"{x:+.{digits}f}".replace("-", MINUS)


def _interval(r):
    return f"{signed_points(r['difference'])} pt [{signed_points(r['t_low'])}, {signed_points(r['t_high'])}]"


def _zero_note(r):
    zeros = sum(1 for d in r["per_seed"] if d == 0)
    return f" (in {zeros} of {r['n_seeds']} seeds the difference is exactly 0)" if zeros else ""


def accuracy_line(results, budget):
    """Top-1 across trainings: who wins, who loses, who cannot be told apart (and why)."""
    if not results:
        return None
    wins, losses, open_, idle, single = [], [], [], [], []
    for res in results:
        r = res["across"]["top1"]
        name = f"{res['variant']} vs {res['baseline']}"
        if any(c["nothing_learned"] for c in res["learned"].values()):
            idle.append(name)
        elif r["n_seeds"] < 2:
            single.append(name)
        elif r["significant"]:
            (wins if r["difference"] > 0 else losses).append(f"{res['variant']} {_interval(r)}{_zero_note(r)}")
        else:
            open_.append(f"{res['variant']} {_interval(r)}{_zero_note(r)}")
    baselines = sorted({res["baseline"] for res in results})
    base = baselines[0] if len(baselines) == 1 else "its baseline"
    n = max(res["across"]["top1"]["n_seeds"] for res in results)
    parts = []
    if wins:
        parts.append(f"better than {base} across {n} trainings: {', '.join(wins)}")
    if losses:
        parts.append(f"worse than {base} across {n} trainings: {', '.join(losses)}")
    if open_:
        who = "no head" if not wins and not losses and not idle and not single else "not"
        parts.append(f"{who} distinguishable from {base} {budget} ({n} seeds): {', '.join(open_)}")
    if single:
        parts.append(f"too few seeds to tell ({'; '.join(single)}: 1 seed, so how much another training "
                     f"would differ is not measured; run --seeds 0 1 2 or more)")
    if idle:
        parts.append(f"no comparison for {', '.join(idle)}: a head learned nothing (at chance)")
    return "top-1: " + "; ".join(parts)


def margin_lines(results):
    """One line per metric with a margin: each head's equivalence / non-inferiority verdict against its
    baseline, e.g. "top-1 against a ±0.5 pt margin (TOST at 5%): sparsemax top-1 is within ±0.5 pt of
    softmax (90% CI [−0.3, +0.4] over 8 seeds; TOST p = 0.01) (Holm across 2 heads); ..."."""
    lines = []
    for metric in METRIC_TABLE:
        verdicts = [res["equivalence"][metric] for res in results if metric in res.get("equivalence", {})]
        if not verdicts:
            continue
        margins = sorted({equivalence.margin_text(metric, v["margin"]) for v in verdicts})
        lines.append(f"{METRIC_TABLE[metric].label} against a {' / '.join(margins)} margin (TOST at "
                     f"{100 * verdicts[0]['alpha']:g}%): " + "; ".join(v["sentence"] for v in verdicts))
    return lines


def sets_line(variants, baseline_names):
    """Prediction sets at 90% coverage: the sparse heads' own supports against LAC on the baseline."""
    key = f"ps_support_eps{SET_EPSILON}"
    lac = f"ps_lac_eps{SET_EPSILON}"
    sparse = [(v, runs) for v, runs in variants.items() if _mean(runs, f"{key}_size") is not None]
    base = [(v, variants[v]) for v in baseline_names if v in variants and _mean(variants[v], f"{lac}_size") is not None]
    if not sparse:
        return None
    coverage = f"{100 * (1 - float(SET_EPSILON)):g}%"
    own = ", ".join(f"{v} {_cell(runs, key + '_size', 'f2')} (coverage {_cell(runs, key + '_coverage', 'pct')})"
                    for v, runs in sparse)
    theirs = ", ".join(f"{v} + LAC {_cell(runs, lac + '_size', 'f2')} "
                       f"(coverage {_cell(runs, lac + '_coverage', 'pct')})" for v, runs in base)
    return (f"prediction sets at {coverage} coverage (ε = {SET_EPSILON}; mean classes per set, ± s.d. over "
            f"seeds): the sparse heads' own supports give {own}" + (f"; against {theirs}" if base else ""))


def sparsity_line(variants):
    sparse = [(v, runs) for v, runs in variants.items() if is_sparse(runs[0]["result"].get("head", ""))
              and _mean(runs, "support_mean") is not None]
    if not sparse:
        return None
    classes = len(sparse[0][1][0]["result"].get("support_hist") or []) or "all"
    return ("sparsity: on average " + ", ".join(f"{v} keeps {_cell(runs, 'support_mean', 'f2')}"
                                               for v, runs in sparse)
            + f" of {classes} classes with non-zero probability (softmax keeps all)")


def calibration_line(variants, results):
    cells = ", ".join(f"{v} {_cell(runs, 'ece', 'f4')}" for v, runs in variants.items())
    tests = []
    for res in results:
        r = res["across"].get("ece")
        if r is None or r["n_seeds"] < 2 or any(c["nothing_learned"] for c in res["learned"].values()):
            continue
        if r["significant"]:
            word = f"{res['variant']} {'better' if r['difference'] < 0 else 'worse'} calibrated than {res['baseline']}"
        else:
            word = "not distinguishable"
        ece = "[" + ", ".join(_signed(r[k], 4) for k in ("t_low", "t_high")) + "]"
        tests.append(f"{res['variant']} − {res['baseline']} {_signed(r['difference'], 4)} {ece}: {word}")
    return (f"calibration (ECE, lower is better, mean of per-run): {cells}"
            + (f"; across trainings {'; '.join(tests)}" if tests else ""))


def settle_line(results, rising):
    """What would settle the open questions: seeds (from the power analysis), budget, tuning."""
    steps = []
    open_ = [res for res in results if res["across"]["top1"]["n_seeds"] >= 2
             and not res["across"]["top1"]["significant"]
             and not any(c["nothing_learned"] for c in res["learned"].values())]
    if open_ and all("mdd_low" in res["across"]["top1"] for res in open_):  # the verdicts' own power ranges
        mdd = ", ".join(f"{res['variant']} {mdd_range_text(res['across']['top1'])}" for res in open_)
        need = ", ".join(f"{res['variant']} {seeds_range_text(res['across']['top1'])}" for res in open_)
        steps.append(f"more seeds: {open_[0]['across']['top1']['n_seeds']} seeds detect (80% power) only top-1 "
                     f"differences above {mdd} (ranges: the seed-to-seed s.d. is itself uncertain); the observed "
                     f"ones would take {need}")
    if any(res["across"]["top1"]["n_seeds"] < 2 for res in results):
        steps.append("at least 3 seeds (--seeds 0 1 2)")
    if rising:
        steps.append("a longer run (optim.epochs=...): validation top-1 was still rising when training stopped")
    if open_ or rising:
        tuned = TUNED.get()
        steps.append(tuned_text(tuned) if tuned else "tuning each head (every head ran the same recipe, e.g. one "
                                                     "learning rate)")
    return ("to settle it: " + "; ".join(steps)) if steps else None


# compare_heads --tune sets it around its tuned arm (comparison/tune.py): {"settings": [keys tuned],
# "complete": {variant: complete trials}}; that comparison's heads ran their tuned settings.
TUNED = contextvars.ContextVar("tuned", default=None)


def tuned_text(tuned):
    counts = tuned["complete"]
    per = (f"{next(iter(counts.values()))} complete trials per head" if len(set(counts.values())) == 1 else
           "complete trials per head " + ", ".join(f"{v} {n}" for v, n in counts.items()))
    return f"no further tuning (every head was tuned already: {', '.join(tuned['settings'])}; {per}, on the tune split)"


def budget_text(variants, curves):
    """(' at this budget (N epochs)' wording, still rising?) from the mean validation curves."""
    epochs = max((c[-1][0] for c in curves.values() if c), default=None)
    rising = False
    for variant, curve in curves.items():
        n_rows = sum(r["result"].get("n") or 0 for r in variants[variant])
        up, _, _ = sanity.still_rising(curve, n_rows)
        rising = rising or bool(up)
    return (f"at this budget of {epochs} epoch{'s' if epochs != 1 else ''}" if epochs else "at this budget"), rising


def plain_words(variants, results, curves):
    """The plain-words lines: variants {name: [run]}, results: paired results (comparison.paired_results),
    curves: {variant: [(epoch, mean top-1)]} (comparison.mean_curves)."""
    budget, rising = budget_text(variants, curves)
    baselines = sorted({res["baseline"] for res in results})
    lines = [accuracy_line(results, budget), *margin_lines(results), sets_line(variants, baselines),
             sparsity_line(variants), calibration_line(variants, results), settle_line(results, rising)]
    return [line for line in lines if line]


def section(lines):
    """report.md's lines for the summary (at the top)."""
    return ["## What this comparison found", ""] + [f"- {line}" for line in lines] + [""] if lines else []
