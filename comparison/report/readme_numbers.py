"""The recorded comparisons' numbers in the docs, generated from their records: the quick start's in README.md
and docs/quickstart.md (record `quickstart`), the Fashion-MNIST heads' in docs/results.md (records `fashion_mnist`:
every head on cached features; `fashion_mnist_e2e`: three heads trained end to end).

    python scripts/readme_numbers.py            # rewrite the generated blocks of every record
    python scripts/readme_numbers.py --check    # change nothing; exit 1 naming the first block that differs
    python scripts/readme_numbers.py --record runs/compare/quickstart_compare [--overwrite]
    python scripts/readme_numbers.py --of fashion_mnist --record runs/compare/fashion_mnist_e30_heads [--overwrite]
    python scripts/readme_numbers.py --of fashion_mnist_e2e --record runs/compare/fashion_mnist_e2e [--overwrite]

A record (RECORDS: docs/quickstart_record/, docs/fashion_mnist_record/, docs/fashion_mnist_e2e_record/)
holds what the report of a finished comparison (`make quickstart`'s, docs/results.md's) is made of:
each run's small result files (RUN_FILES: what compare_heads --report-only reads of a run; no weights),
for a comparison on cached features the feature folder's description (FEATURE_FILES: no features), and
recorded.json, where and with what they were made (the CPU, torch, Python, the commit, the date).
Each call rebuilds the report from the record with the current code (compare_heads' --report-only path on
a temporary copy of the runs; nothing is trained) and makes each block between the lines
`<!-- MARKER:NAME begin ... -->` and `<!-- MARKER:NAME end -->` of its pages from that report's summary
table and verdict lines: README.md's short table, the full table and the verdicts of docs/quickstart.md and
docs/results.md, each with the sentence saying on what CPU and torch they were recorded. The rest
of the pages is prose, never touched. tests/test_readme_numbers.py runs the check.

--check: the pages as they are against what the code computes now; one line and exit 1 naming the first
block that differs (e.g. a number edited by hand, or code whose numbers changed: then rerun without
--check and commit the pages).
--of NAME: one record only (default: every record; --record takes one).
--record RUNS_DIR: copy the small files of the comparison's runs in RUNS_DIR into the record, then
rewrite the blocks from it. Refused, in one line, when a run lacks one of the files, when the record
holds other runs (--overwrite replaces them) or when the runs do not make a report with the current code
(runs of another config, for instance). Run it on the machine and in the environment that ran the quick
start: recorded.json takes this machine's CPU and this Python's torch, the commit of the git checkout
holding RUNS_DIR (when it is one) and the date the runs were evaluated.

A record whose config has changed since (configs/quickstart_compare.yaml, or a default it resolves to) is
refused as compare_heads refuses such runs: run the comparison (`make quickstart`) and record it again.
Bad input is one line and exit 2 (common/cli.py). The command is scripts/readme_numbers.py, which runs `main`.
"""
import argparse
import contextlib
import csv
import dataclasses
import datetime
import filecmp
import io
import json
import os
import platform
import posixpath
import re
import shutil
import subprocess
import tempfile
import textwrap

import numpy
import torch

from common import rundir
from common.errors import UserError
from common.io import atomic_write_text, current_umask, write_json, writing
from comparison import cli, command, run_results
from comparison.paths import ROOT
from comparison.plan import default_runs_dir, plan_runs
from comparison.report import document
from data import features as features_meta
from evaluation import tables

RECORD_INFO = "recorded.json"  # in a record: where and with what its runs were made
EVAL_FILE = rundir.eval_result_name()
# what the report reads of a run (write.py, document.load_run): the request it checks the run against,
# train.py's summary and curve, eval.py's result and its per-example records
RUN_FILES = (rundir.COMPARE_REQUEST, rundir.SUMMARY, rundir.METRICS, EVAL_FILE,
             os.path.basename(rundir.examples_path(EVAL_FILE)))
FEATURES = "feature_folder"  # in a record of a comparison on cached features: its feature folder's FEATURE_FILES
FEATURE_FILES = (features_meta.META_FILE,)  # what planning the comparison reads of the folder (no features)
EPSILON = 0.05  # the prediction-set level the tables show
# (row label, the report's rows it shows: metric keys of evaluation/tables.py; full: with ± s.d., else the means)
TOP1 = ("top-1", ("top1",), True)
SUPPORT = ("mean support size (of {classes})", ("support_mean",), False)
SUPPORT_SETS = (f"ε = {EPSILON:g}, support: coverage / size",
                (f"ps_support_eps{EPSILON}_coverage", f"ps_support_eps{EPSILON}_size"), False)
README_ROWS = (TOP1, SUPPORT, SUPPORT_SETS)
DOCS_ROWS = (TOP1, ("ECE, mean of per-run / pooled over seeds", ("ece", "ece_pooled"), False), SUPPORT, SUPPORT_SETS,
             (f"ε = {EPSILON:g}, LAC: coverage / size",
              (f"ps_lac_eps{EPSILON}_coverage", f"ps_lac_eps{EPSILON}_size"), False))


@dataclasses.dataclass(frozen=True)
class Record:
    """A recorded comparison and the pages its numbers go to."""
    name: str  # --of NAME
    dir: str  # the record, relative to the repository root
    compare_args: tuple  # its compare_heads arguments, paths relative to the repository root
    pages: dict  # page -> its blocks, in order ('readme': the short table, 'table', 'verdicts')
    marker: str  # the blocks' marker lines: <!-- MARKER:NAME begin ... --> ... <!-- MARKER:NAME end -->
    made_by: str  # what makes its runs, for the one-line hints
    features: str = None  # its --features folder (relative), or None


QUICKSTART = Record(
    name="quickstart", dir="docs/quickstart_record",
    compare_args=("--config", "configs/quickstart_compare.yaml", "--seeds", "0", "1", "2"),  # make quickstart's
    pages={"README.md": ("readme",), "docs/quickstart.md": ("table", "verdicts")},
    marker="quickstart-numbers", made_by="make quickstart")
# The Fashion-MNIST heads of docs/results.md: every head on the features of the 30-epoch recipe run, 5 seeds,
# with the probes' settings of `make fashion` (FASHION_PROBE in the Makefile).
FASHION_HEADS = ("softmax", "sparsemax", "entmax15", "entmax_bisect", "normmax", "sparse_softmax", "taylor_softmax",
                 "am_softmax", "perturbmax")
FASHION_PROBE = ("data.hflip=0", "data.crop_padding=0", "data.reprob=0", "data.label_smoothing=0", "optim.epochs=10")
FASHION = Record(
    name="fashion_mnist", dir="docs/fashion_mnist_record",
    compare_args=("--config", "configs/fashion_mnist.yaml", "--features", "features/fashion_mnist_e30",
                  "--heads", *FASHION_HEADS, "--seeds", "0", "1", "2", "3", "4",
                  "--runs-dir", "runs/compare/fashion_mnist_e30_heads", *FASHION_PROBE),
    pages={"docs/results.md": ("table", "verdicts")},
    marker="results-numbers", made_by="make fashion FASHION_EPOCHS=30 and the comparison of docs/results.md",
    features="features/fashion_mnist_e30")
# docs/results.md's end-to-end heads: the design card's three, each trained through the whole recipe (seed 0;
# softmax's run is the recipe's own seed-0 run). No OOD set: MNIST is not on the machine that made them.
FASHION_E2E_HEADS = ("softmax", "sparsemax", "entmax15")
FASHION_E2E = Record(
    name="fashion_mnist_e2e", dir="docs/fashion_mnist_e2e_record",
    compare_args=("--config", "configs/fashion_mnist.yaml", "--heads", *FASHION_E2E_HEADS, "--seeds", "0",
                  "--ood-dataset", "none", "--runs-dir", "runs/compare/fashion_mnist_e2e"),
    pages={"docs/results.md": ("table", "verdicts")},
    marker="results-e2e-numbers", made_by="the end-to-end comparison of docs/results.md")
RECORDS = {r.name: r for r in (QUICKSTART, FASHION, FASHION_E2E)}
# the quick start's, by the names the tests and older callers use
RECORD_DIR, COMPARE_ARGS, PAGES, MARKER = QUICKSTART.dir, QUICKSTART.compare_args, QUICKSTART.pages, QUICKSTART.marker
NONE = "–"  # a cell of a head without that metric (softmax's support sets)
WIDTH = 100  # the pages' line length for the generated sentences
BLOCK_START = re.compile(r"([-+*]|\d{1,9}[.)])(\s|$)|[#>|<]|```|~~~|=+\s*$")  # Markdown read at a line's start


def begin_line(name, spec=QUICKSTART):
    return f"<!-- {spec.marker}:{name} begin (written by python scripts/readme_numbers.py from {spec.dir}/) -->"


def end_line(name, spec=QUICKSTART):
    return f"<!-- {spec.marker}:{name} end -->"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="rewrite nothing; exit 1 naming the first block that differs from what the code computes")
    mode.add_argument("--record", metavar="RUNS_DIR", default=None,
                      help="copy the small files of a finished comparison's runs (make quickstart's: "
                           "runs/compare/quickstart_compare) into the record of --of first")
    p.add_argument("--of", choices=sorted(RECORDS), default=None,
                   help="this record only (default: every record; --record: quickstart)")
    p.add_argument("--overwrite", action="store_true", help="with --record: replace a record of other runs")
    p.add_argument("--record-dir", default=None,
                   help="the record (default: the one of --of, " + ", ".join(r.dir for r in RECORDS.values()) + ")")
    p.add_argument("--pages", default=ROOT, metavar="DIR",
                   help="the folder holding the pages (default: this checkout)")
    args = p.parse_args(argv)
    if args.overwrite and not args.record:
        p.error("--overwrite goes with --record")
    if args.record_dir and not (args.of or args.record):
        p.error("--record-dir goes with --of NAME (or --record)")
    return args


# ---- the runs ----------------------------------------------------------------------------------------
def compare_argv(spec=QUICKSTART):
    """The record's compare_heads arguments, its config in this checkout (its feature folder stays relative:
    the runs' requests name it so)."""
    args = list(spec.compare_args)
    args[1] = os.path.join(ROOT, args[1])
    return args


@contextlib.contextmanager
def _planning_folder(spec, record_dir):
    """A working folder where the record's comparison can be planned: for one on cached features, a
    temporary one holding the recorded feature description at the comparison's --features path."""
    if spec.features is None:
        yield os.getcwd()
        return
    with tempfile.TemporaryDirectory(prefix="readme_numbers.") as tmp:
        lay_out_features(spec, record_dir, tmp)
        with _working_folder(tmp):
            yield tmp


def lay_out_features(spec, record_dir, into):
    """Copy the record's FEATURE_FILES to INTO/<the comparison's --features folder>."""
    for name in FEATURE_FILES:
        source = os.path.join(record_dir, FEATURES, name)
        if not os.path.isfile(source):
            raise UserError(f"{record_dir} has no {FEATURES}/{name}: the record is incomplete; record it again "
                            f"(--of {spec.name} --record RUNS_DIR --overwrite)")
        os.makedirs(os.path.join(into, spec.features), exist_ok=True)
        shutil.copyfile(source, os.path.join(into, spec.features, name))


def _planned_names(spec):
    """The comparison's run folders (<head>-s<seed>), in plan order, planned in the current folder."""
    plan, _ = plan_runs(cli.parse_args(compare_argv(spec)))
    return [os.path.basename(run_dir) for _, _, run_dir, _ in plan]


def run_names(spec=QUICKSTART, record_dir=None):
    """The recorded comparison's run folders (<head>-s<seed>), in plan order: compare_heads' own plan."""
    with _planning_folder(spec, record_dir or os.path.join(ROOT, spec.dir)):
        return _planned_names(spec)


def _run_files(folder, names, what):
    """[(source path, path relative to a record)] of every recorded file of `folder`'s runs; a missing
    one is one line naming it."""
    out = []
    for name in names:
        for file in RUN_FILES:
            path = os.path.join(folder, name, file)
            if not os.path.isfile(path):
                raise UserError(f"{os.path.join(folder, name)} has no {file}: {what}")
            out.append((path, os.path.join(name, file)))
    return out


@contextlib.contextmanager
def _working_folder(path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def rebuild_report(record_dir, into, spec=QUICKSTART):
    """The report of the recorded runs with the current code, into the folder `into`: compare_heads
    --report-only, run as the recorded comparison was, on a copy of the runs laid out as it laid them out
    (the runs folder its requests name, relative; the feature folder's description where --features names
    it). -> (its folder, the recorded runs' names in plan order)."""
    if spec.features is not None:
        lay_out_features(spec, record_dir, into)
    with _working_folder(into):  # (the planning reads the laid-out feature folder)
        names = _planned_names(spec)
        runs_dir = default_runs_dir(cli.parse_args(compare_argv(spec)))  # relative: the folder the requests name
    for source, rel in _run_files(record_dir, names, f"the record is incomplete; record it again "
                                                     f"(--of {spec.name} --record RUNS_DIR --overwrite)"):
        os.makedirs(os.path.join(into, runs_dir, os.path.dirname(rel)), exist_ok=True)
        shutil.copyfile(source, os.path.join(into, runs_dir, rel))
    report_dir = os.path.join(into, "report")
    argv = compare_argv(spec) + ["--report-only", "--no-mlflow", "--report-dir", report_dir]
    printed = io.StringIO()
    try:
        with _working_folder(into), contextlib.redirect_stdout(printed):
            args = cli.parse_args(argv)
            command.run(args, argv, cli.resolved_config(args))  # as scripts/compare_heads.py's main runs it
    except UserError as err:
        raise UserError(f"the runs recorded in {record_dir} do not make the {spec.name} report with the current "
                        f"code: {err}") from None
    return report_dir, names


# ---- the blocks -----------------------------------------------------------------------------------------
def generate(record_dir, spec=QUICKSTART):
    """{(page, block name): the block's lines} from the report the current code makes of the record."""
    info = read_info(record_dir, spec)
    with tempfile.TemporaryDirectory(prefix="readme_numbers.") as tmp:
        report_dir, names = rebuild_report(record_dir, tmp, spec)
        with open(os.path.join(report_dir, "summary.csv"), newline="", encoding="utf-8") as f:
            table = list(csv.reader(f))
        with open(os.path.join(report_dir, "report.md"), encoding="utf-8") as f:
            verdicts = verdict_lines(f.read())
    first = run_results.read_result(os.path.join(record_dir, names[0]), EVAL_FILE)
    seeds = _cells(table, ["seeds"])[0]
    count = seeds[0] if len(set(seeds)) == 1 else "/".join(seeds)
    sample = f"{count} seed{'' if count == '1' else 's'}, {first['n']} {first['split']} images"
    classes = first["num_classes"]
    link = posixpath.join(spec.dir, RECORD_INFO)  # from the repository root
    makers = {
        "readme": lambda page: [
            *wrap(f"- the comparison table; in part, as it read on {machine(info)} with torch {info['torch']} "
                  f"({sample}; [{spec.dir}]({link})):", indent="  "), "",
            *("  " + line for line in markdown_table(table, README_ROWS, classes)), ""],
        "table": lambda page: [
            *wrap(f"Measured ({sample}) on {machine(info)} with torch {info['torch']} and Python {info['python']}"
                  f"{_at_commit(info)}, evaluated on {info['date']} "
                  f"([{posixpath.basename(spec.dir)}]({posixpath.relpath(link, posixpath.dirname(page))})):"),
            "",
            *markdown_table(table, DOCS_ROWS, classes), ""],
        "verdicts": lambda page: [line for v in verdicts for line in wrap(f"- {v}", indent="  ")] + [""],
    }
    return {(page, name): makers[name](page) for page, names in spec.pages.items() for name in names}


def wrap(text, indent=""):
    """`text` as lines of at most WIDTH characters, continued with `indent`; one line when a break would
    put something Markdown reads as the start of a block (a list item, a heading...) at a line's start."""
    lines = textwrap.wrap(text, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return lines if not any(BLOCK_START.match(line[len(indent):]) for line in lines[1:]) else [text]


def read_info(record_dir, spec=QUICKSTART):
    """The record's recorded.json, checked."""
    path = os.path.join(record_dir, RECORD_INFO)
    again = f"record it again (--of {spec.name} --record RUNS_DIR --overwrite)"
    if not os.path.isfile(path):
        raise UserError(f"{record_dir} holds no record ({RECORD_INFO} missing); make one with --of {spec.name} "
                        f"--record RUNS_DIR after {spec.made_by}")
    try:
        with open(path, encoding="utf-8") as f:
            info = json.load(f)
        missing = [k for k in ("cpu", "cores", "torch", "torch_cpu_capability", "python", "date") if k not in info]
    except (OSError, ValueError, TypeError) as err:
        raise UserError(f"cannot read {path} ({err}); {again}") from None
    if missing:
        raise UserError(f"{path} lacks {', '.join(missing)}; {again}")
    return info


def machine(info):
    """'an AMD EPYC (2 cores, torch CPU capability AVX512)'."""
    cpu = info["cpu"]
    article = "an" if cpu[:1].upper() in "AEIOU" else "a"
    return f"{article} {cpu} ({info['cores']} cores, torch CPU capability {info['torch_cpu_capability']})"


def _at_commit(info):
    if not info.get("commit"):
        return ""
    return f", at commit {info['commit'][:7]}" + (" with uncommitted changes" if info.get("uncommitted") else "")


def verdict_lines(report_text):
    """The report's verdicts: the list under '## Verdicts' (document.verdict_section)."""
    lines = report_text.splitlines()
    try:
        start = lines.index("## Verdicts")
    except ValueError:
        raise UserError("the rebuilt report has no '## Verdicts' section: has comparison/report/document.py changed "
                        "its layout? Update verdict_lines in comparison/report/readme_numbers.py") from None
    out = []
    for line in lines[start + 1:]:
        if line.startswith("- "):
            out.append(line[2:])
        elif out or line.startswith("#"):
            break
    if not out:
        raise UserError("the rebuilt report's '## Verdicts' section has no verdict lines")
    return out


def _labels():
    """{metric key: the report's row label} (evaluation/tables.py, document.py)."""
    labels = {k: label for k, label, _ in tables.METRIC_COLUMNS + tables.prediction_set_columns(
        ["support", "lac"], [EPSILON])}
    return {**labels, "ece": document.ECE_MEAN_LABEL, "ece_pooled": document.ECE_POOLED_LABEL}


def _cells(table, labels):
    """The report table's cells (one list per head) of the rows labelled `labels`."""
    rows = {row[0]: row[1:] for row in table[1:]}
    for label in labels:
        if label not in rows:
            raise UserError(f"the rebuilt report's table has no row '{label}': has the report changed? Update the "
                            f"rows of comparison/report/readme_numbers.py")
    return [rows[label] for label in labels]


def mean_of(cell):
    """'94.90% from '94.90 ± 0.70%'; NONE for a head without it ('n/a')."""
    if cell in ("", "n/a"):
        return NONE
    mean, sep, _ = cell.partition(" ± ")
    return mean + ("%" if sep and cell.endswith("%") else "")


def markdown_table(table, rows, classes):
    """A Markdown table of the report table's `rows` (README_ROWS, DOCS_ROWS), one column per head."""
    labels = _labels()
    heads = table[0][1:]
    out = ["| metric | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for title, keys, full in rows:
        cells = _cells(table, [labels[k] for k in keys])
        shown = []
        for i in range(len(heads)):
            parts = [c[i] if full else mean_of(c[i]) for c in cells]
            shown.append(NONE if all(p == NONE for p in parts) else " / ".join(parts))
        out.append(f"| {title.format(classes=classes)} | " + " | ".join(shown) + " |")
    return out


# ---- the pages ------------------------------------------------------------------------------------------
def _block_span(lines, page, name, spec=QUICKSTART):
    """(index of the begin line, index of the end line) of block `name` in `lines`."""
    begin = [i for i, line in enumerate(lines) if line.strip().startswith(f"<!-- {spec.marker}:{name} begin")]
    end = [i for i, line in enumerate(lines) if line.strip() == end_line(name, spec)]
    if len(begin) != 1 or len(end) != 1 or begin[0] > end[0]:
        raise UserError(f"{page} should hold block {spec.marker}:{name} once, between a line "
                        f"'{begin_line(name, spec)}' and a later line '{end_line(name, spec)}' (found {len(begin)} "
                        f"begin and {len(end)} end lines)")
    return begin[0], end[0]


def _read_page(pages, page):
    path = os.path.join(pages, page)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as err:
        raise UserError(f"cannot read {path} ({err.strerror or err})") from None


def page_text(text, page, blocks, spec=QUICKSTART):
    """`text` with its blocks replaced by the generated ones."""
    lines = text.split("\n")
    for name in spec.pages[page]:
        begin, end = _block_span(lines, page, name, spec)
        lines[begin + 1:end] = blocks[(page, name)]
    return "\n".join(lines)


def first_difference(pages, blocks, spec=QUICKSTART):
    """None when every block of the pages in `pages` is what `blocks` say; else one line naming the
    first that differs and where."""
    for page, names in spec.pages.items():
        lines = _read_page(pages, page).split("\n")
        for name in names:
            begin, end = _block_span(lines, page, name, spec)
            have, want = lines[begin + 1:end], blocks[(page, name)]
            if have != want:
                i = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b), min(len(have), len(want)))
                at = begin + 2 + i
                return (f"{page}: block {spec.marker}:{name} is not what the code computes from {spec.dir} (line "
                        f"{at}: {_snippet(have, i)} should read {_snippet(want, i)}); python scripts/readme_numbers.py "
                        f"rewrites it")
    return None


def _snippet(lines, i, width=60):
    """Line i of `lines`, shortened to `width` characters, quoted; '(no line)' past the end."""
    if i >= len(lines):
        return "(no line)"
    line = lines[i]
    return repr(line if len(line) <= width else line[:width - 1] + "…")


def check_pages(pages, blocks, spec=QUICKSTART):
    """Raise the one-line difference (exit 1) when a block of the pages is not what `blocks` say."""
    found = first_difference(pages, blocks, spec)
    if found:
        err = UserError(found)
        err.exit_code = 1  # a stale page, not a usage mistake (2)
        raise err


def write_pages(pages, blocks, spec=QUICKSTART):
    """Rewrite the pages' blocks; -> the pages changed."""
    changed = []
    for page in spec.pages:
        text = _read_page(pages, page)
        new = page_text(text, page, blocks, spec)
        if new != text:
            atomic_write_text(os.path.join(pages, page), new)
            changed.append(page)
    return changed


# ---- recording ------------------------------------------------------------------------------------------
def cpu_model():
    """/proc/cpuinfo's 'model name' (Linux), else what platform says."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _git(folder, *args):
    try:
        done = subprocess.run(["git", "--no-optional-locks", "-C", folder, *args], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment(runs_dir, files):
    """recorded.json: this machine and Python, the commit of the checkout holding `runs_dir`, and the
    (UTC) date of the newest recorded file."""
    commit = _git(runs_dir, "rev-parse", "HEAD")
    changes = _git(runs_dir, "status", "--porcelain", "--untracked-files=no") if commit else None
    newest = max(os.stat(path).st_mtime for path, _ in files)
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": platform.python_version(),
            "numpy": numpy.__version__, "platform": platform.platform(), "commit": commit,
            "uncommitted": bool(changes) if commit else None,
            "date": datetime.datetime.fromtimestamp(newest, datetime.timezone.utc).date().isoformat(),
            "recorded_by": "python scripts/readme_numbers.py --record"}


def _first_other(record_dir, runs_dir, files, spec):
    """How the record differs from the runs' `files` ('softmax-s0/eval.json differs'), None when it holds
    exactly these runs."""
    for source, rel in files:
        mine = os.path.join(record_dir, rel)
        if not os.path.isfile(mine) or not filecmp.cmp(source, mine, shallow=False):
            return f"{rel} differs from {runs_dir}'s" if os.path.isfile(mine) else f"it has no {rel}"
    wanted = {RECORD_INFO} | {rel.split(os.sep)[0] for _, rel in files}
    extra = sorted(set(os.listdir(record_dir)) - wanted)
    return f"{extra[0]} is none of the {spec.name} comparison's runs" if extra else None


def _feature_files(spec):
    """[(source path, path relative to a record)] of the comparison's feature folder (FEATURE_FILES), the
    folder its --features names, from the repository root."""
    if spec.features is None:
        return []
    folder = os.path.join(ROOT, spec.features)
    out = [(os.path.join(folder, name), os.path.join(FEATURES, name)) for name in FEATURE_FILES]
    missing = next((path for path, _ in out if not os.path.isfile(path)), None)
    if missing:
        raise UserError(f"no {missing}: the {spec.name} comparison's runs were trained on the features there "
                        f"({spec.made_by})")
    return out


def record(runs_dir, record_dir, overwrite, spec=QUICKSTART):
    """Copy the comparison's runs in `runs_dir` into the record (checked: they make the report);
    -> (what happened, the blocks of the new record)."""
    if not os.path.isdir(runs_dir):
        raise UserError(f"--record {runs_dir}: no such folder; give the runs folder of a finished {spec.name} "
                        f"comparison ({spec.made_by}; e.g. {default_runs_dir_of(spec)})")
    features = _feature_files(spec)
    with _working_folder(ROOT):  # planned where the comparison ran: its feature folder is there
        names = _planned_names(spec)
    files = features + _run_files(runs_dir, names, f"not a finished run of the {spec.name} comparison "
                                                   f"({spec.made_by} finishes it)")
    if os.path.isdir(record_dir):
        other = _first_other(record_dir, runs_dir, files, spec)
        if other is None and not overwrite and os.path.isfile(os.path.join(record_dir, RECORD_INFO)):
            return f"{record_dir} already holds these runs ({RECORD_INFO} kept)", generate(record_dir, spec)
        if other is not None and not overwrite:
            raise UserError(f"{record_dir} holds another record ({other}); --overwrite replaces it")
    elif os.path.exists(record_dir):
        raise UserError(f"--record-dir {record_dir} is not a folder")
    parent = os.path.dirname(os.path.abspath(record_dir))
    with writing(record_dir, kept="the record as it was"):  # a full disk or read-only folder: one line, exit 74
        return _replace_record(files, runs_dir, record_dir, parent, spec)


def default_runs_dir_of(spec):
    if spec.features is not None:
        return spec.compare_args[spec.compare_args.index("--runs-dir") + 1]
    return default_runs_dir(cli.parse_args(compare_argv(spec)))


def _replace_record(files, runs_dir, record_dir, parent, spec):
    """record's writes: the runs' files into a staging folder beside the record, then moved into place."""
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".record.", dir=parent)  # beside the record: moved into place in one rename
    try:
        os.chmod(staging, 0o777 & ~current_umask())  # (mkdtemp's folder is 0700)
        for source, rel in files:
            os.makedirs(os.path.join(staging, os.path.dirname(rel)), exist_ok=True)
            shutil.copyfile(source, os.path.join(staging, rel))
        write_json(environment(runs_dir, files), os.path.join(staging, RECORD_INFO))
        blocks = generate(staging, spec)  # the runs make the report with this code, or nothing is recorded
        old = None
        if os.path.isdir(record_dir):  # (--overwrite) out of the way first: a record is always whole
            old = tempfile.mkdtemp(prefix=".replaced.", dir=parent)
            os.replace(record_dir, os.path.join(old, "record"))
        os.replace(staging, record_dir)
        if old:
            shutil.rmtree(old)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return f"recorded {len(files)} files of {runs_dir} in {record_dir}", blocks


def check_markers(pages, spec):
    """Every page readable, each with its blocks' marker lines: one line now, not after the rebuild."""
    for page, names in spec.pages.items():
        lines = _read_page(pages, page).split("\n")
        for name in names:
            _block_span(lines, page, name, spec)


def main(argv=None):
    args = parse_args(argv)
    specs = [RECORDS[args.of or QUICKSTART.name]] if args.record or args.of else list(RECORDS.values())
    for spec in specs:
        check_markers(args.pages, spec)
    for spec in specs:
        record_dir = args.record_dir or os.path.join(ROOT, spec.dir)
        if args.record:
            said, blocks = record(args.record, record_dir, args.overwrite, spec)
            print(said)
        else:
            blocks = generate(record_dir, spec)
        pages = ", ".join(spec.pages)
        if args.check:
            check_pages(args.pages, blocks, spec)
            print(f"{pages}: every block is what the code computes from {spec.dir}")
            continue
        changed = write_pages(args.pages, blocks, spec)
        print(f"rewrote {', '.join(changed)}" if changed else f"{pages}: already current")
    return 0
