"""The hand-off to the report: which folder it goes to (and that the folder is this comparison's),
the finished runs it is written from (document.py writes it), --until-settled's section
(the look each head stopped at and why: report.md and summary.json), and what the terminal shows of
it: the table, the verdicts, the sanity checks and the plain-words summary."""
import json
import math
import os

from common.errors import UserError
from common.io import atomic_write_text, read_json, write_json
from common.runlock import RunLock
from comparison.analysis.equivalence import format_difference, margin_text, with_unit
from comparison.analysis.margins import METRIC_TABLE
from comparison.report import document, plain_words
from comparison.report.document import SUMMARY_FILE
from evaluation.tables import markdown_table

REPORT_SOURCE = "compare_source.json"  # in a report folder: the runs folder its report is of
SEQUENTIAL_HEADING = "## Seeds until settled (sequential design)"
_BEFORE = ("## Equivalence and non-inferiority", "## Paired differences", "## Plots")  # where that section goes


def report_dir_of(args, runs_dir, stem):
    """The report folder: --report-dir, else beside its runs (RUNS_DIR/report; reports/<config name>
    for the default runs folder), so two comparisons never share one by default."""
    if args.report_dir:
        return args.report_dir
    return os.path.join(runs_dir, "report") if args.runs_dir else os.path.join("reports", stem)


def check_report_dir(report_dir, runs_dir, overwrite, record=False):
    """Refuse to write over the report of another runs folder (unless `overwrite`); with `record`,
    note in the folder which runs folder its report is of: its path, and where it lies from the
    report folder, so that a project moved or copied as a whole (another mount point, another
    machine) still reports into its own folder."""
    path = os.path.join(report_dir, REPORT_SOURCE)
    mine = os.path.realpath(runs_dir)
    mine_relative = os.path.relpath(mine, os.path.realpath(report_dir))
    try:
        with open(path) as f:
            theirs = json.load(f)
        if not isinstance(theirs, dict):
            raise ValueError("not a JSON object")
    except (FileNotFoundError, NotADirectoryError):  # (a path through a file: prepare_output says so, exit 74)
        theirs = {}  # a new folder, or a report written before folders recorded their runs
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read {path} ({err}); give another --report-dir, or --overwrite to replace it")
    known = theirs.get("runs_dir")
    same = known in (None, mine) or theirs.get("runs_dir_relative") == mine_relative
    if not same and not overwrite:
        raise UserError(f"{report_dir} holds the report of the runs in {known}, not {runs_dir}; give another "
                        f"--report-dir, or --overwrite to replace that report")
    if record:
        write_json({"runs_dir": mine, "runs_dir_relative": mine_relative}, path)


def write_comparison_report(plan, commands, args, pairs, stem, command, report_dir, runs_dir, title_note="",
                            sequential=None):
    """Report the finished runs (naming the missing ones) and print its table and sentences;
    -> (report.md path, missing run dirs, paired results). `sequential`: --until-settled's outcome
    (comparison/settle.Looks.document), added to report.md and summary.json; the plain words' bottom
    line then reads its verdicts (plain_words.py's SEQUENTIAL)."""
    weights = "ema" if args.ema else "raw"
    variants, missing = {}, []
    for name, seed, run_dir, _ in plan:
        if all(commands.status(run_dir)):
            variants.setdefault(name, []).append(
                document.load_run(run_dir, commands.eval_file, weights=weights, seed=seed))
        else:
            missing.append(run_dir)
    if not variants:
        raise UserError(f"none of the {len(plan)} planned runs is finished yet; run without "
                        f"--report-only (or submit the --emit-slurm script) first")
    if missing:
        print(f"missing ({len(missing)} of {len(plan)} planned run(s), left out of the report): "
              + ", ".join(missing))
    first = next(iter(variants.values()))[0]["result"]
    calib = (first.get("prediction_sets") or {}).get("calibration") or {}
    notes = [calib["note"]] if calib.get("note") else []
    pairs = [(a, b) for a, b in pairs if a in variants and b in variants]
    with plain_words.sequential_verdicts(sequential), \
            RunLock(report_dir, purpose="compare_heads report"):  # one writer of the report folder
        check_report_dir(report_dir, runs_dir, args.overwrite, record=True)
        table, path, paired_results = document.write_report(
            variants, report_dir, f"Head comparison: {stem}{title_note}", command, weights=weights,
            notes=notes, pairs=pairs, missing=missing, margins=args.margins)
        if sequential is not None:
            add_sequential(report_dir, sequential)
    print(f"\n{table}\n")
    with plain_words.sequential_verdicts(sequential):
        say_conclusions(variants, paired_results)
    if sequential is not None:
        print("Until settled (sequential design; report.md's section says how to read it):")
        print("\n".join(f"- {c['reason']}" for c in sequential["comparisons"]) + "\n")
    return path, missing, paired_results


def add_sequential(report_dir, doc):
    """--until-settled's outcome into the report: summary.json's "sequential", and report.md's section
    before the equivalence verdicts (which read the same seeds as a fixed design would)."""
    summary_path = os.path.join(report_dir, SUMMARY_FILE)
    write_json({**read_json(summary_path), "sequential": doc}, summary_path)
    path = os.path.join(report_dir, "report.md")
    with open(path) as f:
        text = f.read()
    section = "\n".join(sequential_section(doc)).rstrip("\n") + "\n"
    anchor = next((f"\n{h}\n" for h in _BEFORE if f"\n{h}\n" in text), None)
    text = text.replace(anchor, f"\n{section}{anchor}", 1) if anchor else f"{text}\n{section}"
    atomic_write_text(path, text)


def sequential_section(doc):
    """Markdown lines: how the seeds were added, then one row and one sentence per head."""
    design, metric = doc["design"], doc["metric"]
    label, looks = METRIC_TABLE[metric].label, ", ".join(map(str, design["looks"]))

    rows = [_sequential_row(c, metric) for c in doc["comparisons"]]
    header = ["head − reference", "stopped at look", "seeds", "verdict", "repeated CI at that look", "state"]
    alpha = design["alpha"]
    return [SEQUENTIAL_HEADING, "",
            f"Seeds were added in looks (at {looks} seeds; this run up to {doc['max_seeds_now']}) until each "
            f"head's question against its reference was settled on {label} against the "
            f"{margin_text(metric, design['margin'])} margin: the group-sequential design of "
            f"comparison/analysis/sequential.py (Lan–DeMets O'Brien–Fleming-type α-spending on the paired t statistic, "
            f"{design['method']} boundaries, α = {100 * alpha:g}% per head, not adjusted across heads), recorded in "
            f"`{doc['design_file']}`. A head stops at the first look where its repeated confidence interval (its "
            f"level holds at every look at once) shows it superior or inferior (the {100 * (1 - alpha):g}% "
            f"interval excludes 0) or equivalent (the {100 * (1 - 2 * alpha):g}% interval lies inside the margin); "
            f"at the last look the verdict is whatever holds. A stopped head got no more seeds; its reference has "
            f"as many as its longest head. The other sections read the same runs as if their seed count had been "
            f"fixed in advance (their intervals and p-values do not count the looks); the verdicts here are the "
            f"design's.", "",
            markdown_table(header, rows), ""] + [f"- {c['reason']}" for c in doc["comparisons"]] + [""]


def _sequential_row(entry, metric):
    """One head's row: the look it stopped at, its seeds, verdict, repeated interval and state."""
    def end(x, sign):
        return sign + "∞" if x is None or math.isinf(x) else format_difference(metric, x)  # JSON's ∞: None

    look = f"{entry['look']} of {entry['looks']}" if entry["look"] else "none yet"
    verdict = entry["verdict"] if entry["stopped"] else f"{entry['verdict']} (not settled)"
    low, high = entry["interval"]
    interval = with_unit(metric, f"[{end(low, '−')}, {end(high, '+')}]") + f" ({100 * entry['interval_level']:g}%)" \
        if entry["look"] else ""
    return [f"{entry['variant']} − {entry['baseline']}", look, str(entry["seeds"]), verdict, interval, entry["state"]]


def say_conclusions(variants, paired_results):
    """The verdicts and sanity checks, then the plain-words summary: what a user takes away."""
    verdicts, checks = document.verdict_lines(variants, paired_results)
    if verdicts:
        print("Verdicts (across trainings: would another training differ too? details and the numbers given "
              "these trainings in report.md):")
        print("\n".join(f"- {v}" for v in verdicts))
    if checks:
        print("Sanity checks:")
        print("\n".join(f"- {c}" for c in checks))
    print(f"\n{plain_words.HEADER}")  # last: what a user takes away, derived from the numbers above
    print("\n".join(f"- {line}" for line in plain_words.plain_words(variants, paired_results,
                                                                    document.mean_curves(variants))))
    print()
