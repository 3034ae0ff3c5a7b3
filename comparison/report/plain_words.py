"""What a head comparison found, in plain words: the last lines on the terminal and the top of report.md.

Every number here is read from the comparison's own data structures (the runs' flattened metrics,
as the table shows them, and the paired results across trainings that the verdicts use), and every
claim follows the same rule as the verdicts: a difference is called a win only when the
t-interval over seeds excludes 0; otherwise the line says the heads are not distinguishable at
this budget and what would settle it (more seeds, a longer run, tuning). Not distinguishable is not
the same as equally good: the margin lines say, per metric with a margin, whether each head is
within ±δ of its baseline (TOST), non-inferior, better, worse or undecided (comparison/analysis/equivalence.py,
the sentences the report's equivalence section gives). Nothing here is a fixed conclusion: with other
numbers the sentences change.

The first line is the bottom line in everyday words, built from the same verdicts: per head, whether
it is more or less accurate than its baseline, as accurate within the margin, at most the margin less
accurate, or not distinguishable with the seeds at hand (the equivalence verdicts, Holm-adjusted as the
margin lines read them; under --until-settled the sequential design's verdicts, SEQUENTIAL), and how
many classes a sparse head keeps on average. The lines after it give the numbers and the tests.
"""
import contextlib
import contextvars
from typing import NamedTuple

from comparison.analysis import equivalence, sanity
from comparison.analysis.margins import METRIC_TABLE, margin_as_difference
from comparison.analysis.statistics import mdd_range_text, seeds_range_text, signed_points, two_figures
from evaluation import tables
from models.registry import is_sparse

MINUS = "\u2212"

SET_EPSILON = "0.1"  # prediction sets are summarised at 90% coverage
HEADER = "In plain words (from the numbers above; 'across trainings' = would another training differ too):"


def _cell(runs, key, fmt):
    """A metric of one variant as the table shows it (mean ± s.d. over seeds)."""
    return tables.format_mean_std([r["flat"].get(key) for r in runs], fmt)


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


def sparse_heads(variants):
    """[(variant, runs)] of the sparse heads with a measured support size, and the number of classes
    ("all" when the runs do not say)."""
    sparse = [(v, runs) for v, runs in variants.items() if is_sparse(runs[0]["result"].get("head", ""))
              and _mean(runs, "support_mean") is not None]
    return sparse, (len(sparse[0][1][0]["result"].get("support_hist") or []) or "all") if sparse else "all"


def sparsity_line(variants):
    sparse, classes = sparse_heads(variants)
    if not sparse:
        return None
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


# ---- the bottom line ---------------------------------------------------------------------------------------
# compare_heads --until-settled sets it around its report (comparison/report/write.py): the sequential design's
# outcome (comparison/settle.Looks.document); its verdicts are the comparison's.
SEQUENTIAL = contextvars.ContextVar("sequential", default=None)


@contextlib.contextmanager
def sequential_verdicts(document):
    """The plain words of the report written inside read the design's verdicts (`document`: None for none)."""
    token = SEQUENTIAL.set(document)
    try:
        yield
    finally:
        SEQUENTIAL.reset(token)


class Words(NamedTuple):
    """How the bottom line says each verdict on one metric ({b}: the baseline, {m}: ±δ, {d}: δ)."""
    better: str
    worse: str
    same: str
    at_most: str
    what: str
    none_better: str


WORDS = {"top1": Words("is more accurate than {b}", "is less accurate than {b}", "is as accurate as {b} within {m}",
                       "is at most {d} less accurate than {b}", "accuracy", "no head was more accurate than {b}"),
         "ece": Words("is better calibrated than {b}", "is worse calibrated than {b}",
                      "is as well calibrated as {b} within {m}", "is at most {d} worse calibrated than {b}",
                      "calibration", "no head was better calibrated than {b}"),
         "loss": Words("has a lower loss than {b}", "has a higher loss than {b}", "has the same loss as {b} within {m}",
                       "has a loss at most {d} above {b}'s", "loss", "no head had a lower loss than {b}")}
KIND_OF = {"superior": "better", "inferior": "worse", "equivalent": "equivalent", "non-inferior": "non-inferior",
           "undecided": "not distinguishable"}  # an equivalence verdict -> the bottom line's kind


class HeadVerdict(NamedTuple):
    """One head's verdict as the bottom line says it. kind: better, worse, equivalent, non-inferior,
    not distinguishable, one seed, nothing learned (a head at chance), not settled or no look (the
    sequential design's); within: better or worse by less than the margin; alone: "better" / "worse"
    where the per-comparison test says so but the Holm-adjusted verdict does not (family: its size)."""
    variant: str
    baseline: str
    metric: str
    kind: str
    seeds: int
    margin: str = ""
    difference: float = None
    within: bool = False
    alone: str = ""
    family: int = 1
    idle: tuple = ()
    stage: str = ""


def head_verdicts(results, sequential=None):
    """[HeadVerdict] per compared head: from the design's outcome (`sequential`) when there is one, else
    from the paired results' top-1 verdicts (their equivalence verdict; the t-interval when none)."""
    if sequential:
        metric = sequential["metric"]
        margin = equivalence.margin_text(metric, margin_as_difference(metric, sequential["margin"]))
        out = []
        for c in sequential["comparisons"]:
            kind = {"no look": "no look", "continues": "not settled", "capped": "not settled",
                    "nothing learned": "nothing learned"}.get(c["state"], KIND_OF[c["verdict"]])
            out.append(HeadVerdict(c["variant"], c["baseline"], metric, kind, c["seeds"], margin, stage=c["state"],
                                   idle=tuple(i["variant"] for i in c.get("idle", ()))))
        return out
    out = []
    for res in results:
        r = res["across"]["top1"]
        idle = tuple(name for name, c in res["learned"].items() if c["nothing_learned"])
        v = res.get("equivalence", {}).get("top1")
        if idle:
            kind = "nothing learned"
        elif r["n_seeds"] < 2:
            kind = "one seed"
        elif v is not None:
            kind = KIND_OF[v["verdict"]]
        else:
            kind = ("better" if r["difference"] > 0 else "worse") if r["significant"] else "not distinguishable"
        alone = ("better" if r["difference"] > 0 else "worse") if kind not in ("better", "worse", "nothing learned",
                                                                                "one seed") and r["significant"] else ""
        out.append(HeadVerdict(
            res["variant"], res["baseline"], "top1", kind, r["n_seeds"],
            equivalence.margin_text("top1", v["margin"]) if v else "", r["difference"],
            within=bool(v and (v["equivalent"] or (kind == "worse" and v["non_inferior"]))), alone=alone,
            family=v.get("family_size", 1) if v else 1, idle=idle))
    return out


def _head_phrase(h):
    """What the bottom line says of one head against its baseline, without the head's name."""
    words = WORDS[h.metric]
    fill = {"b": h.baseline, "m": h.margin, "d": h.margin.removeprefix("±")}
    if h.kind in ("better", "worse"):
        text = (words.better if h.kind == "better" else words.worse).format(**fill)
        if h.metric == "top1" and h.difference is not None:
            text += f" ({signed_points(h.difference)} pt)"
        if h.within:
            text += f", by less than {fill['d']}"
    elif h.kind == "equivalent":
        text = words.same.format(**fill)
    elif h.kind == "non-inferior":
        text = words.at_most.format(**fill)
    elif h.kind == "not distinguishable":
        text = f"is not distinguishable from {h.baseline} in {words.what} with {h.seeds} seeds"
    elif h.kind == "one seed":
        text = f"cannot be told apart from {h.baseline} with 1 seed"
    elif h.kind == "nothing learned":
        text = f"is not compared with {h.baseline} ({' and '.join(h.idle)} learned nothing)"
    elif h.kind == "not settled":
        text = f"is not settled against {h.baseline} yet after {h.seeds} seeds"
    else:  # no look
        text = f"has too few seeds yet ({h.seeds}) for the design's first look against {h.baseline}"
    if h.alone:
        more = "more" if h.alone == "better" else "less"
        text += (f" (alone, its {signed_points(h.difference)} pt would count as {more} accurate; not once all "
                 f"{h.family} heads are counted)")
    if h.stage == "settled":
        text += f" (settled at {h.seeds} seeds)"
    elif h.stage == "last look":
        text += " (the design's last look)" if h.kind == "not distinguishable" else \
            f" (the design's last look, {h.seeds} seeds)"
    return text


_SHARED = ("equivalent", "non-inferior", "not distinguishable", "not settled")  # "so is X" may follow these


def bottom_line(variants, results):
    """The summary's first line, in everyday words: each head's verdict against its baseline (the
    design's under --until-settled), how many classes each sparse head keeps on average, and, with
    several heads and none better, that none was. Never says more than the lines after it."""
    sequential = SEQUENTIAL.get()
    heads = head_verdicts(results, sequential)
    sparse, classes = sparse_heads(variants)
    support = {v: two_figures(_mean(runs, "support_mean")) for v, runs in sparse}
    where = "On this data" + (", with each head's tuned settings" if TUNED.get() else "")
    if sequential:
        label = METRIC_TABLE[sequential["metric"]].label
        where += f", by the until-settled design on {label}"
    if not heads and len(variants) == 1:
        (name,) = variants
        keeps = f"; it keeps {support[name]} of {classes} classes on average" if name in support else ""
        return f"{where}, {name} is the only head, so there is nothing to compare it with{keeps}."
    said_classes, clauses, previous = False, [], None
    for h in heads:
        phrase = _head_phrase(h)
        same = h.kind in _SHARED and phrase.startswith("is ") and previous == phrase  # as the head before
        text = f"so is {h.variant}" if same else f"{h.variant} {phrase}"
        if h.variant in support:
            keeps = support[h.variant] + ("" if said_classes else f" of {classes} classes on average")
            text += f", which keeps {keeps}" if same else f" and keeps {keeps}"
            said_classes = True
        clauses.append(text)
        previous = phrase
    compared = {h.variant for h in heads}
    for v, mean in support.items():
        if v not in compared:
            clauses.append(f"{v} keeps {mean}" + ("" if said_classes else f" of {classes} classes on average"))
            said_classes = True
    if not heads:
        clauses.insert(0, "no two heads could be compared on the same seeds")
    kinds = {h.kind for h in heads}
    if len(heads) >= 2 and "better" not in kinds | {h.alone for h in heads} \
            and kinds & {"equivalent", "non-inferior", "worse"}:
        baselines = sorted({h.baseline for h in heads})
        clauses.append(WORDS[heads[0].metric].none_better.format(
            b=baselines[0] if len(baselines) == 1 else "its baseline"))
    return f"{where}, " + "; ".join(clauses) + "."


def plain_words(variants, results, curves):
    """The plain-words lines: variants {name: [run]}, results: paired results (comparison.paired_results),
    curves: {variant: [(epoch, mean top-1)]} (comparison.mean_curves). The first is the bottom line."""
    budget, rising = budget_text(variants, curves)
    baselines = sorted({res["baseline"] for res in results})
    lines = [bottom_line(variants, results), accuracy_line(results, budget), *margin_lines(results),
             sets_line(variants, baselines),
             sparsity_line(variants), calibration_line(variants, results), settle_line(results, rising)]
    return [line for line in lines if line]


def section(lines):
    """report.md's lines for the summary (at the top)."""
    return ["## What this comparison found", ""] + [f"- {line}" for line in lines] + [""] if lines else []
