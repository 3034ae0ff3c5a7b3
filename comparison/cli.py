"""compare_heads' command line: its options, the checks of their combinations, and the overrides
--features adds to every run. Overrides go through configs.overrides, the one dialect of every command."""
import argparse
import os
import shlex
import sys

import configs
from common.errors import UserError
from comparison.analysis.margins import parse_margins
from comparison.limits import (
    MAX_JOBS,
    MAX_LOOKS,
    MAX_SEED_VALUE,
    MAX_SEEDS,
    MAX_TRIALS,
    MAX_VARIANTS,
    MIN_SEEDS,
    PLAIN_NUMBER,
    WHOLE_NUMBER,
)
from comparison.paths import COMMAND
from comparison.plan import variants
from comparison.storage_url import check_url
from configs.overrides import parse_command_line, split_command_line
from models.registry import HEAD_NAMES

FEATURE_IDENTITY_KEYS = ("features_source_sha256", "features_settings_sha256")  # data.* keys, data/features.py
TUNE_OPTIONS = ("--trials", "--pruner", "--storage", "--tune-only")  # meaningful with --tune only
SETTLE_OPTIONS = ("--max-seeds", "--looks", "--settle-metric")  # meaningful with --until-settled only
# the whole-number options: (least, most, what the number is), checked on the line as written (comparison/limits.py)
_LOOK = "seeds per variant: a look needs 2 for a seed-to-seed s.d., and the design's calibration grows with them"
WHOLE_NUMBERS = {"--seeds": (0, MAX_SEED_VALUE, "a 32-bit seed"),
                 "--jobs": (1, MAX_JOBS, "local runs at once"),
                 "--trials": (1, MAX_TRIALS, "complete trials per variant"),
                 "--max-seeds": (MIN_SEEDS, MAX_SEEDS, _LOOK),
                 "--looks": (MIN_SEEDS, MAX_SEEDS, _LOOK)}


def build_parser(description=None):
    epilog = ("Overrides: key.sub=value or --key.sub VALUE (value parsed as YAML) override the config\n"
              "of every run. They may go anywhere on the line, before or after the options,\n"
              "e.g. --heads softmax sparsemax --seeds 0 1 optim.epochs=1")
    p = argparse.ArgumentParser(description=description, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="base training config (YAML)")
    p.add_argument("--heads", nargs="+", default=["softmax", "sparsemax", "entmax15"],
                   help=f"output heads to compare: {' '.join(HEAD_NAMES)}")
    p.add_argument("--norms", nargs="+", default=None, help="also vary model.norm (affine layernorm batchnorm)")
    p.add_argument("--alphas", nargs="+", type=float, default=None,
                   help="alpha values for entmax_bisect (one variant each)")
    p.add_argument("--learn-alpha", action="store_true", help="entmax_bisect variants learn alpha")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--baseline", default=None,
                   help="head (or variant without its norm suffix) every other variant is compared with "
                        "(default: softmax when compared, else the first head)")
    p.add_argument("--ood-dataset", default="auto", metavar="auto|NAME|none",
                   help="OOD set for eval.py's OOD detection: auto = the built-in data's own "
                        "(builtin10 -> builtin10_ood), none for other datasets; none = skip")
    p.add_argument("--ood-root", default=None, metavar="DIR", help="data root of the OOD set")
    p.add_argument("--features", default=None, metavar="DIR",
                   help="compare heads on cached features (scripts/extract_features.py --output DIR): a linear "
                        "head per run, data.dataset=features data.root=DIR")
    p.add_argument("--runs-dir", default=None, help="where the runs go (default runs/compare/<config name>)")
    p.add_argument("--report-dir", default=None,
                   help="report folder (default reports/<config name>, or RUNS_DIR/report with --runs-dir)")
    p.add_argument("--overwrite", action="store_true",
                   help="write the report into a report folder that holds the report of another runs folder")
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights instead of the raw ones")
    p.add_argument("--launcher", default=None,
                   help='command prefix for train.py and eval.py, e.g. "accelerate launch --num_processes 2"')
    p.add_argument("--jobs", type=int, default=1, help="runs at once (each pinned to its GPUs or CPU threads)")
    p.add_argument("--margin", action="append", default=[], metavar="METRIC=DELTA",
                   help="equivalence margin of a metric in its units (points for top1 and ece), e.g. --margin "
                        "top1=0.5; repeat it for several metrics (default: the metric table's margins, "
                        "comparison/analysis/statistics.py); the report's equivalence and non-inferiority verdicts "
                        "use it")
    p.add_argument("--no-mlflow", action="store_true",
                   help="do not log the comparison to MLflow (default when mlflow is installed: one experiment, "
                        "in MLFLOW_TRACKING_URI or RUNS_DIR/mlflow.db; comparison/tracking.py)")
    tune = p.add_argument_group("tuning (--tune: each variant tuned with Optuna on the tune split, then compared; "
                                "comparison/tune.py)")
    tune.add_argument("--tune", action="store_true",
                      help="tune optim.lr, optim.weight_decay and each head's own settings per variant, the same "
                           "--trials each, on data.tune_fraction of train; then train the best settings over --seeds "
                           "and compare them, and the untuned settings, on val")
    tune.add_argument("--trials", type=int, default=20,
                      help="complete trials per variant (pruned and failed ones are extra, and reported)")
    tune.add_argument("--pruner", default="median", choices=("median", "hyperband", "none"),
                      help="stops trials behind on the per-epoch tune curve (none: every trial trains its budget)")
    tune.add_argument("--storage", default=None, metavar="URL",
                      help="Optuna storage shared by every process tuning this comparison: sqlite:///PATH, any "
                           "SQLAlchemy URL (postgresql://...), or journal:PATH (a file on a shared filesystem); "
                           "default sqlite:///RUNS_DIR/tune/studies.db")
    tune.add_argument("--tune-only", action="store_true",
                      help="run the trials, then stop (SLURM array tasks; the verdict runs come after)")
    settle = p.add_argument_group("seeds until settled (--until-settled: seeds added in looks until each head's "
                                  "question against the reference is settled; comparison/settle.py)")
    settle.add_argument("--until-settled", action="store_true",
                        help="train seeds 0, 1, ... in looks; after each look a head that is superior, inferior or "
                             "equivalent within the margin (group-sequential design, "
                             "comparison/analysis/sequential.py) gets no more seeds, the others the next look's; "
                             "replaces --seeds; with --tune, each head tuned first and its tuned settings trained "
                             "(no untuned arm: comparison/tune_settle.py)")
    settle.add_argument("--max-seeds", type=int, default=None, metavar="N",
                        help="the design's last look (default 12; the looks 3 5 8 12 ... up to N); with --looks, or "
                             "a design already recorded, this run stops after the last look <= N")
    settle.add_argument("--looks", type=int, nargs="+", default=None, metavar="N",
                        help="the seed counts of the looks, declared up front, e.g. --looks 3 5 8 12")
    settle.add_argument("--settle-metric", default="top1", choices=("top1", "ece", "loss"),
                        help="the metric that decides, against its --margin (default top1, margin 0.5 pt)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="list what would run, run nothing")
    mode.add_argument("--emit-slurm", metavar="FILE", default=None,
                      help="write a SLURM array job script (one task per run) instead of running")
    mode.add_argument("--report-only", action="store_true",
                      help="train and evaluate nothing: report the finished runs, name the missing ones")
    return p


def parse_args(argv=None, description=None):
    """The checked arguments; args.overrides holds the command line's overrides, then --features' own.
    `description`: --help's first paragraph (the entry point's docstring says it)."""
    p = build_parser(description)
    argv = list(sys.argv[1:] if argv is None else argv)
    options = split_command_line(p, argv)[0]
    check_list_values(p, options)  # before argparse reads `--seeds 0,1` as a bad number
    check_numbers(p, options)  # and `--max-seeds 1_000` as 1000, or 10^20 seeds as a plan
    args = parse_command_line(p, argv, tool=COMMAND)
    overrides = args.overrides
    check_modes(args, options)
    args.margins = parse_margins(args.margin)  # before anything is planned: a typo is one line at once
    args.overrides = overrides + feature_overrides(args.features, overrides)
    return args


def resolved_config(args):
    """The config the comparison starts from, resolved with the command line's overrides, and the
    variants checked: a bad config, override, --heads or --alphas is one line here, before torch
    loads and before anything runs."""
    variants(args)
    return configs.load_config(os.path.abspath(args.config), args.overrides)


def _given(parser, options, wanted):
    """[[flag, value, ...]] of each option of `wanted` on the line, as written (a list option's values,
    else its one value)."""
    flags = [s for a in parser._actions for s in a.option_strings]
    lists = {s for a in parser._actions if a.nargs == "+" for s in a.option_strings}
    given, values = [], None
    for token in options:
        if token.startswith("--"):
            flag, eq, value = token.partition("=")
            named = [f for f in flags if f == flag] or [f for f in flags if f.startswith(flag)]  # argparse's prefixes
            values = [named[0]] + ([value] if eq else []) if len(named) == 1 and named[0] in wanted else None
            if values is not None:
                given.append(values)
        elif values is not None and (values[0] in lists or len(values) == 1):
            values.append(token)
    return given


def check_list_values(parser, options):
    """A list option's values are separated by spaces: `--heads softmax,sparsemax` is one line showing
    `--heads softmax sparsemax` (a comma is in no head, norm or number)."""
    lists = {s for a in parser._actions if a.nargs == "+" for s in a.option_strings}
    for flag, *items in _given(parser, options, lists):
        if any("," in item for item in items):
            spaced = " ".join(part for item in items for part in item.split(",") if part)
            raise UserError(f"{flag} takes values separated by spaces, not commas: {flag} {spaced}")


def check_numbers(parser, options):
    """The numeric options as written, before argparse reads them: digits only (int() and float() also
    read `1_0` as 10, and `nan`), and each whole number within its WHOLE_NUMBERS limits, the limit named."""
    floats = {s for a in parser._actions if a.type is float for s in a.option_strings}
    for flag, *items in _given(parser, options, set(WHOLE_NUMBERS) | floats):
        pattern = PLAIN_NUMBER if flag in floats else WHOLE_NUMBER
        for item in items:
            if not pattern.fullmatch(item):
                kind, example = ("numbers", "1.5") if flag in floats else ("whole numbers", "3")
                raise UserError(f"{flag} takes {kind} written in digits (e.g. {flag} {example}), got {_cut(item)!r}")
            if flag in WHOLE_NUMBERS:
                low, high, why = WHOLE_NUMBERS[flag]
                digits = item.lstrip("+-").lstrip("0") or "0"
                negative = item.startswith("-") and digits != "0"  # (every least is >= 0)
                value = low - 1 if negative else int(digits) if len(digits) <= len(str(high)) \
                    else high + 1  # (int() of thousands of digits is refused by Python itself)
                if not low <= value <= high:
                    bound = f"at least {low}" if value < low else f"at most {high}"
                    raise UserError(f"{flag} must be {bound} ({why}), got {_cut(item)}")


def _cut(text, limit=30):
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_modes(args, options):
    """Refuse the combinations that cannot mean anything (before any run is planned)."""
    if args.jobs > 1 and (args.emit_slurm or args.report_only):  # (--dry-run: its cost line counts the slots)
        raise UserError("--jobs runs local trainings; it does not combine with --emit-slurm or --report-only")
    if args.emit_slurm and args.launcher:
        raise UserError("--launcher does not apply to --emit-slurm: each array task launches through "
                        "scripts/slurm_train.sh (accelerate launch per node); set GPUS_PER_NODE instead")
    if len(args.seeds) > MAX_SEEDS:
        raise UserError(f"--seeds: at most {MAX_SEEDS} seeds per variant, got {len(args.seeds)}")
    for flag, values in (("--seeds", args.seeds), ("--heads", args.heads), ("--norms", args.norms or ()),
                         ("--alphas", args.alphas or ())):
        twice = [v for i, v in enumerate(values) if v in values[:i]]
        if twice:  # the same runs planned twice
            raise UserError(f"{flag}: {twice[0]} is given twice; give each once")
    count = variant_count(args)
    if count > MAX_VARIANTS:
        raise UserError(f"at most {MAX_VARIANTS} variants per comparison (heads × norms × alphas), got {count}")
    given = [a for a in TUNE_OPTIONS if any(o.split("=")[0] == a for o in options)]
    if given and not args.tune:
        raise UserError(f"{given[0]} applies to --tune; add --tune")
    check_settle(args, options)
    if args.storage is not None:  # before the config is read: a mistyped storage is one line at once
        check_url(args.storage)


def variant_count(args):
    """How many variants comparison/plan.py's variants() plans: each head (entmax_bisect once per --alphas) per norm."""
    per_norm = sum(len(args.alphas or [None]) if head == "entmax_bisect" else 1 for head in args.heads)
    return per_norm * len(args.norms or [None])


def check_settle(args, options):
    """--until-settled's flags: what they need and what they cannot combine with."""
    given = [a for a in SETTLE_OPTIONS if any(o.split("=")[0] == a for o in options)]
    if given and not args.until_settled:
        raise UserError(f"{given[0]} applies to --until-settled; add --until-settled")
    if not args.until_settled:
        return
    if any(o.split("=")[0] == "--seeds" for o in options):
        raise UserError("--until-settled chooses the seeds (0, 1, ... up to each look); drop --seeds, and give "
                        "--max-seeds N or --looks N ... instead")
    if args.looks and len(args.looks) > MAX_LOOKS:
        raise UserError(f"--looks: at most {MAX_LOOKS} looks per design, got {len(args.looks)}")
    if args.looks and any(b <= a for a, b in zip(args.looks, args.looks[1:])):
        raise UserError(f"--looks {' '.join(map(str, args.looks))}: the looks' seed counts must increase, e.g. "
                        f"--looks 3 5 8 12")
    if args.looks and args.max_seeds is not None and args.max_seeds > args.looks[-1]:
        raise UserError(f"--max-seeds {args.max_seeds} lies past the last of --looks ({args.looks[-1]}); the design "
                        f"ends at its last look")


def feature_overrides(features, overrides):
    """The overrides --features DIR adds to every run (checked: DIR must be a feature folder)."""
    if features is None:
        return []
    # heavy: data/features.py loads torch (seconds); --features is checked before torch loads
    from data.features import identity as feature_identity
    from data.features import read_meta

    keys = ("data.dataset", "data.root", *(f"data.{k}" for k in FEATURE_IDENTITY_KEYS))
    clash = [o for o in overrides if o.split("=", 1)[0] in keys]
    if clash:
        raise UserError(f"--features sets {', '.join(keys)}; drop the override '{clash[0]}'")
    # the folder's identity pins every run (train.py refuses other features) and enters each run's
    # request: runs trained on features since re-extracted at DIR are refused, never mixed in
    identity = dict(zip(FEATURE_IDENTITY_KEYS, feature_identity(read_meta(features))))
    return ["data.dataset=features", f"data.root={features}", *(f"data.{k}='{v}'" for k, v in identity.items())]


def command_line(argv):
    """The command as a user would retype it (the report and the SLURM script name it)."""
    return COMMAND + " " + " ".join(shlex.quote(a) for a in argv)
