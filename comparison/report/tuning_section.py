"""The tuning section of compare_heads --tune's report: how the studies ran (budget, the tune split's
size), each variant's config and chosen settings with its trials, one table per metric with every
head's untuned and tuned values side by side, one line per verdict saying whether tuning changed it
(with both arms' intervals), and the plots. Under --tune --until-settled there is the tuned arm only:
no side-by-side values and no verdict changes.

Input is plain data (comparison/tuning_summary.py, the paired results of both arms' comparisons:
document.py's paired_results), so this module knows nothing of Optuna or the runs.
"""
import os

from common.io import atomic_write_text
from comparison.analysis.equivalence import format_difference, with_unit
from comparison.analysis.margins import METRIC_TABLE
from evaluation import tables

from . import plots
from .document import interval_cell

# Optuna's fANOVA fits a random forest to the complete trials' settings and scores: with fewer
# trials than this its shares are mostly noise, so the report says so beside the plot.
MIN_TRIALS_FOR_IMPORTANCE = 10


def _verdict_class(res):
    """What a verdict says, to tell whether tuning changed it: nothing learned, or the sign of the
    top-1 difference and whether its across-trainings interval excludes 0."""
    if any(c.get("nothing_learned") for c in res["learned"].values()):
        return "nothing learned"
    top1 = res["across"]["top1"]
    if not top1.get("significant"):
        return "within training noise"
    return "better" if top1["difference"] > 0 else "worse"


def verdict_changes(tuned, untuned):
    """One entry per (variant, baseline) pair both arms have: {"variant", "baseline", "untuned",
    "tuned" (what each arm's verdict says: _verdict_class), "changed", "untuned_top1", "tuned_top1"
    (each arm's across-trainings top-1 entry)}."""
    before = {(r["variant"], r["baseline"]): r for r in untuned}
    out = []
    for res in tuned:
        old = before.get((res["variant"], res["baseline"]))
        if old is not None:
            out.append({"variant": res["variant"], "baseline": res["baseline"], "untuned": _verdict_class(old),
                        "tuned": _verdict_class(res), "changed": _verdict_class(old) != _verdict_class(res),
                        "untuned_top1": old["across"]["top1"], "tuned_top1": res["across"]["top1"]})
    return out


def _top1_difference(entry):
    """'+2.2 pt [+0.5, +3.9]': an across-trainings top-1 difference with its t-interval over seeds."""
    mean = with_unit("top1", format_difference("top1", entry["difference"]))
    return f"{mean} {interval_cell('top1', (entry['t_low'], entry['t_high']))}"


def verdict_lines(tuned, untuned):
    """One short markdown line per pair: whether tuning changed its verdict, and both arms' intervals."""
    lines = []
    for c in verdict_changes(tuned, untuned):
        what = f"CHANGED: {c['untuned']} → {c['tuned']}" if c["changed"] else f"same: {c['tuned']}"
        lines.append(f"- {c['variant']} − {c['baseline']}: {what}; untuned {_top1_difference(c['untuned_top1'])}, "
                     f"tuned {_top1_difference(c['tuned_top1'])}")
    return lines


def head_values(results):
    """{head: {"seeds", metric: its value on val}} from one arm's paired results: each pair's
    bootstrap entry holds the variant's ("a") and the baseline's ("b") value on the rows compared,
    the mean over the pair's seeds (ECE: the mean of the per-run ECEs)."""
    values = {}
    for res in results:
        for head, side in ((res["baseline"], "b"), (res["variant"], "a")):
            values.setdefault(head, {"seeds": res["seeds"], **{m: e[side] for m, e in res["bootstrap"].items()}})
    return values


def _value(metric, value):
    """A value in the units its differences are written in (top-1 and ECE in %, the loss in its own)."""
    return tables.format_value(value, "pct" if METRIC_TABLE[metric].in_points else "f4")


def _metric_heading(metric):
    rule = METRIC_TABLE[metric]
    better = "higher" if rule.higher_is_better else "lower"
    own = "; each head's own loss: compare a head's two values, not heads" if metric == "loss" else ""
    return f"#### {rule.label} ({better} is better{own})"


def _seeds_text(values):
    seeds = {tuple(v["seeds"]) for arm in values for v in arm.values()}
    if len(seeds) == 1:
        (only,) = seeds
        return ("seed " if len(only) == 1 else "seeds ") + ", ".join(str(s) for s in only)
    return "the seeds each pair shares (they differ between heads or arms)"


def side_by_side(tuned, untuned):
    """Markdown lines: one table per metric, a row per head with its untuned and tuned values."""
    before, after = head_values(untuned), head_values(tuned)
    heads = [h for h in after if h in before]
    if not heads:  # one head: no pair, so no paired statistics to read the values from
        return ["No side-by-side values: they come from the paired statistics, which need two heads.", ""]
    lines = ["### Untuned and tuned, on val", "",
             f"Each head's value on val, mean over {_seeds_text((before, after))}.",
             "The untuned and the tuned runs share seeds and data and differ in their settings only;",
             "tuned − untuned is the difference of the two means (no interval).", ""]
    header = ["head", "untuned", "tuned", "tuned − untuned"]
    for metric in METRIC_TABLE:
        rows = [[h, _value(metric, before[h][metric]), _value(metric, after[h][metric]),
                 with_unit(metric, format_difference(metric, after[h][metric] - before[h][metric]))]
                for h in heads if metric in before[h] and metric in after[h]]
        if rows:
            lines += [_metric_heading(metric), "", tables.markdown_table(header, rows), ""]
    return lines


def counts(trials):
    """{state: trials} as Optuna has them, and the failed ones' known causes."""
    states = [t["state"] for t in trials]
    out = {s: states.count(s) for s in ("COMPLETE", "PRUNED", "FAIL", "RUNNING", "WAITING")}
    out["diverged"] = sum(t["diverged"] for t in trials)
    out.update({note: sum(t.get("note") == note for t in trials) for note in ("retried", "surplus")})
    return out


def _counts(trials):
    c = counts(trials)
    text = f"{c['COMPLETE']} complete" + (f" ({c['diverged']} diverged: top-1 0)" if c["diverged"] else "")
    text += f", {c['PRUNED']} pruned"
    if c["FAIL"]:
        why = [f"{c[n]} {w}" for n, w in (("retried", "lost and retried"), ("surplus", "given back")) if c[n]]
        text += f", {c['FAIL']} failed" + (f" ({', '.join(why)})" if why else "")
    return text + "".join(f", {c[s]} {s.lower()}" for s in ("RUNNING", "WAITING") if c[s])


def _budget(variants):
    sizes = {counts(v["trials"])["COMPLETE"] for v in variants.values()}
    return "/".join(str(s) for s in sorted(sizes))


def _tune_split_text(split):
    return f"{split['images']} images (data.tune_fraction={split['fraction']:g} of train after the calib hold-out)"


def intro(summary, untuned_report, pruner):
    """The section's opening: the budget, what a trial trains and scores on, what the two arms are
    (`untuned_report` None: --tune --until-settled, which has the tuned arm only)."""
    lines = [f"Each variant had one Optuna study with the same budget: {_budget(summary['variants'])} "
             "complete trials",
             "(pruned and failed ones are extra, counted below),",
             f"a seeded TPE sampler and the {pruner} pruner on the per-epoch tune top-1.", "",
             "- Trials train for the config's epochs on train minus the calib and tune splits;",
             "  each is scored by its top-1 on the tune split,",
             f"  {_tune_split_text(summary['tune_split'])}."]
    if untuned_report is None:
        return lines + ["- Tuned (this report): each variant's best settings, trained over the seeds",
                        "  the until-settled design added, then evaluated on val, which no trial read.",
                        "- No untuned arm: the design's verdicts compare the tuned heads only.",
                        "  The config's settings would need a design of their own:",
                        "  --until-settled without --tune, in another runs folder.", ""]
    link = f"[{untuned_report}]({untuned_report})"
    return lines + ["- Tuned (this report): each variant's best settings, trained over the seeds.",
                    f"- Untuned ({link}): the config's settings, trained the same way.",
                    "- Both arms train on the same data and are evaluated on val, which no trial read.", ""]


def trials_table(variants):
    """Markdown lines: per variant its config's and its chosen settings, best tune top-1 and trials."""
    header = ["variant", "config's settings (untuned)", "chosen settings (tuned)", "best tune top-1", "trials",
              "epochs trained"]
    rows = []
    for name, v in variants.items():
        best = v["best"]
        finished = [t for t in v["trials"] if t["state"] in ("COMPLETE", "PRUNED")]
        trained = sum(t["epochs"] or 0 for t in finished)
        rows.append([name, v["config_settings"]["text"] or "—", (best["text"] or "—") if best else "—",
                     f"{100 * best['value']:.2f}% (trial {best['number']})" if best else "—",
                     _counts(v["trials"]), f"{trained} of {len(finished) * v['budget_epochs']}"])
    return [tables.markdown_table(header, rows), ""]


def plot_lines(name, v, report_dir):
    """One variant's tuning plots (written into report_dir) and their markdown, with the importance
    plot's caveat when it is fitted to few complete trials."""
    safe = name.replace("/", "_")
    history = f"tuning_{safe}_history.png"
    plots.plot_tuning_history(name, v["trials"], os.path.join(report_dir, history))
    lines = [f"![tuning history of {name}]({history})"]
    if not v["importance"]:
        return lines + [f"- {name}: no importance plot (Optuna's needs two tuned settings",
                        "  and complete trials whose scores differ)", ""]
    complete = counts(v["trials"])["COMPLETE"]
    importance = f"tuning_{safe}_importance.png"
    plots.plot_tuning_importance(name, v["importance"], os.path.join(report_dir, importance), complete)
    lines.append(f"![setting importance of {name}]({importance})")
    if complete < MIN_TRIALS_FOR_IMPORTANCE:
        lines += [f"- {name}: caveat: this importance plot is fitted to {complete} complete trials",
                  f"  (fewer than {MIN_TRIALS_FOR_IMPORTANCE}): its shares are mostly noise, not a ranking of the "
                  "settings."]
    return lines + [""]


def tuning_section(summary, tuned, untuned, report_dir, untuned_report, pruner):
    """Markdown lines (plots written into report_dir); `tuned`/`untuned`: paired results of both arms
    (`untuned` and `untuned_report` None: the tuned arm only, --tune --until-settled)."""
    variants = summary["variants"]
    lines = ["## Tuning", ""] + intro(summary, untuned_report, pruner) + trials_table(variants)
    timing = summary.get("timing")
    if timing:
        lines += [f"This invocation ran {timing['trials']} trial(s) in {timing['wall_s']:.0f} s wall",
                  f"and {timing['cpu_s']:.0f} s CPU (this process and its children).", ""]
    if untuned is not None:
        lines += side_by_side(tuned, untuned)
    changes = verdict_changes(tuned, untuned) if untuned is not None else []
    if changes:
        level = f"{100 * changes[0]['tuned_top1']['level']:g}%"
        lines += ["### Tuned against untuned verdicts", "",
                  f"Tuning changed {sum(c['changed'] for c in changes)} of {len(changes)} verdict(s)",
                  "(the sign of the top-1 difference across trainings, or whether it is beyond training noise).",
                  f"Each line: the top-1 difference to the baseline, mean [{level} t-interval over seeds],",
                  "untuned then tuned.", ""] + verdict_lines(tuned, untuned) + [""]
    lines += ["### Tuning plots", ""]
    for name, v in variants.items():
        lines += plot_lines(name, v, report_dir)
    return lines


def append_section(report_path, lines):
    """report.md with `lines` appended (rewritten atomically)."""
    with open(report_path) as f:
        text = f.read()
    atomic_write_text(report_path, text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")
