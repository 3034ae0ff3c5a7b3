"""The tuning section of compare_heads --tune's report: each variant's chosen settings, best tune
score, trial counts and plots, and how the tuned verdicts differ from the untuned ones.

Input is plain data (comparison/tuning_summary.py, the paired results of both arms'
comparisons), so this module knows nothing of Optuna or the runs.
"""
import os

from common.io import atomic_write_text

from . import plots


def _verdict_class(res):
    """What a verdict says, to tell whether tuning changed it: nothing learned, or the sign of the
    top-1 difference and whether its across-trainings interval excludes 0."""
    if any(c.get("nothing_learned") for c in res["learned"].values()):
        return "nothing learned"
    top1 = res["across"]["top1"]
    if not top1.get("significant"):
        return "no difference beyond training noise"
    return "better" if top1["difference"] > 0 else "worse"


def verdict_changes(tuned, untuned):
    """[(variant, baseline, untuned verdict, tuned verdict, changed?)] for the pairs both arms have."""
    before = {(r["variant"], r["baseline"]): r for r in untuned}
    out = []
    for res in tuned:
        old = before.get((res["variant"], res["baseline"]))
        if old is not None:
            out.append((res["variant"], res["baseline"], old["verdict"], res["verdict"],
                        _verdict_class(old) != _verdict_class(res)))
    return out


def _settings(params):
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items())) or "—"


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


def tuning_section(summary, tuned, untuned, report_dir, untuned_report, pruner):
    """Markdown lines (plots written into report_dir); `tuned`/`untuned`: paired results of both arms."""
    variants = summary["variants"]
    lines = ["## Tuning", "",
             f"Each variant had one Optuna study with the same budget: {_budget(variants)} complete trials (pruned and "
             f"failed ones are extra, counted below), a seeded TPE sampler, the {pruner} pruner on the per-epoch "
             f"tune top-1. A trial trains the "
             f"variant for the config's epochs on train minus the calib and tune splits and is scored by its "
             f"top-1 on the tune split (data.tune_fraction of train). The verdicts above train each variant's best "
             f"settings over the seeds on the same data and evaluate them on val, which no trial read; the "
             f"untuned comparison ([{untuned_report}]({untuned_report})) trains the config's settings the same way.",
             ""]
    header = "| variant | chosen settings | best tune top-1 | trials | epochs trained |"
    lines += [header, "|" + "---|" * 5]
    for name, v in variants.items():
        best = v["best"]
        finished = [t for t in v["trials"] if t["state"] in ("COMPLETE", "PRUNED")]
        trained = sum(t["epochs"] or 0 for t in finished)
        full = len(finished) * v["budget_epochs"]
        row = (f"| {name} | {_settings(best['params'])} | {100 * best['value']:.2f}% (trial {best['number']}) | "
               if best else f"| {name} | — | — | ")
        lines.append(row + f"{_counts(v['trials'])} | {trained} of {full} |")
    timing = summary.get("timing")
    if timing:
        lines += ["", f"This invocation ran {timing['trials']} trial(s) in {timing['wall_s']:.0f} s wall and "
                      f"{timing['cpu_s']:.0f} s CPU (this process and its children)."]
    changes = verdict_changes(tuned, untuned)
    if changes:
        changed = sum(c[4] for c in changes)
        lines += ["", "### Tuned against untuned verdicts", "",
                  f"- Tuning changed {changed} of {len(changes)} verdict(s) (the sign of the top-1 difference across "
                  f"trainings, or whether it is beyond training noise)."]
        lines += [f"- {'CHANGED' if ch else 'same'}: untuned: {old}; tuned: {new}" for _, _, old, new, ch in changes]
    lines += ["", "### Tuning plots", ""]
    for name, v in variants.items():
        safe = name.replace("/", "_")
        history = f"tuning_{safe}_history.png"
        plots.plot_tuning_history(name, v["trials"], os.path.join(report_dir, history))
        lines += [f"![tuning history of {name}]({history})"]
        if v["importance"]:
            imp = f"tuning_{safe}_importance.png"
            plots.plot_tuning_importance(name, v["importance"], os.path.join(report_dir, imp))
            lines += [f"![setting importance of {name}]({imp})"]
        else:
            lines += [f"- {name}: no importance plot (Optuna's needs two tuned settings and complete trials whose "
                      f"scores differ)"]
        lines += [""]
    return lines


def _budget(variants):
    sizes = {counts(v["trials"])["COMPLETE"] for v in variants.values()}
    return "/".join(str(s) for s in sorted(sizes))


def append_section(report_path, lines):
    """report.md with `lines` appended (rewritten atomically)."""
    with open(report_path) as f:
        text = f.read()
    atomic_write_text(report_path, text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n")
