"""Compare output heads: train every missing run, evaluate each, write a report with statistics and plots.

    python scripts/compare_heads.py --config configs/quickstart_compare.yaml \\
        --heads softmax sparsemax entmax15 [--norms affine layernorm] [--alphas 1.25 1.75] \\
        [--seeds 0 1 2] [--baseline softmax] [--ood-dataset auto|NAME|none] [--jobs N] \\
        [--runs-dir runs/compare] [--report-dir reports/compare] [--overwrite] [key.sub=value ...]
    python scripts/compare_heads.py ... --emit-slurm compare.sbatch   # then: sbatch compare.sbatch
    python scripts/compare_heads.py ... --report-only                 # aggregate the finished runs
    python scripts/compare_heads.py --config CFG --features FEATURE_DIR --heads ... --seeds ...   # cached features
    python scripts/compare_heads.py ... --tune [--trials N] [--pruner median|hyperband|none] [--storage URL]

For each variant (head × norm × α) and seed the run directory is RUNS_DIR/<variant>-s<seed>. The plan
(run directories, configs, commands) is one function of the arguments, the same in every mode.
Training and evaluation go through the two entry points, as subprocesses:
`python train.py --config CFG <overrides> head.name=.. train.seed=.. train.output_dir=.. --resume auto`
`python eval.py --checkpoint RUN_DIR --output RUN_DIR/eval.json --quiet [--ood-dataset NAME]`
(both prefixed with --launcher, e.g. "accelerate launch --num_processes 8", when given). Subprocesses
because Accelerate's state (process group, device, mixed precision) is per process and a
multi-process launcher needs a fresh one anyway (--jobs N without --launcher: one worker process per
job slot runs the steps, see below).
Modes:
  (default)      one run after another, output on the terminal;
  --jobs N       N runs at once, each pinned to its share of the machine: with GPUs, CUDA_VISIBLE_DEVICES
                 gives job slot j the GPUs j, j+N, ... (round-robin); on CPU each job gets
                 OMP_NUM_THREADS = cores // N (at most the OMP_NUM_THREADS you set). Each run's
                 output goes to RUN_DIR/compare.log.
                 Without --launcher each slot is one Python process that runs its train.py and
                 eval.py mains one after another (scripts/compare_worker.py): a Python start with
                 torch costs ~7 s of CPU, which a fresh process per step paid twice per run;
  --emit-slurm F writes a SLURM array job, one task per planned run: scripts/slurm_train.sh trains it
                 (--resume auto, checkpoint + requeue on preemption), then eval.py evaluates it;
  --report-only  aggregates the finished runs and names the missing ones;
  --dry-run      lists what would run and where the report would go.
MLflow (when installed; --no-mlflow: not): after the report, every finished run (its config, tags head / seed /
variant, per-epoch curve and final metrics) and the report's files go into one MLflow experiment named after
the runs folder, in MLFLOW_TRACKING_URI or else the offline store RUNS_DIR/mlflow.db (scripts/compare_tracking.py).
After each run a progress line says how many of the plan's runs are finished and about how long the
rest will take at the pace so far (scripts/compare_progress.py).
Cached features (--features DIR, a folder of scripts/extract_features.py): the same plan, each run a linear
head on the cached features (data.dataset=features data.root=DIR and the folder's identity,
data.features_source_sha256 / features_settings_sha256, added to every run's overrides: a run trained on
features since re-extracted at DIR is refused, never mixed into the report), with the
same report, statistics, prediction sets, selective prediction and OOD detection (--ood-dataset auto: the
folder's OOD features, DIR/ood, when it has them). Without --launcher and --jobs, train.py and eval.py then
run inside this process, one after the other (a probe trains in well under a second; a fresh Python with
torch costs several), exactly as their command lines would run them.
Tuning (--tune, scripts/tune_heads.py and comparison/tuning.py): first one Optuna study per variant, the
same --trials each, on a tune split held out of train (data.tune_fraction); then each variant's best
settings and the config's own are both trained over --seeds and compared on val, which no trial read.
Signals: SIGTERM / SIGINT / SIGUSR1 are forwarded to the running train.py / eval.py children
(common/children.py), which save and stop; compare_heads then exits with their code (143 ...), a
second signal kills them, and no child outlives it.
Resumable: a run with summary.json is trained and skipped; an interrupted one continues from its last
checkpoint (--resume auto); a run evaluated already (eval.json, its per-example records and, when an
OOD set is asked for, its OOD results) is not evaluated again.
Report (REPORT_DIR; default reports/<config name> for the default runs folder, RUNS_DIR/report for
--runs-dir RUNS_DIR): the folder records which runs folder it reports on (compare_source.json) and
a report of another runs folder is refused unless --overwrite. report.md (mean ± std over seeds of every metric; one verdict per variant
against the baseline, across trainings, with sanity checks: chance level, conformal coverage band,
training budget; paired differences across trainings (t-interval and sign-flip test over seeds,
two-level bootstrap, power) and given these trainings (bootstrap over images, McNemar); selective
prediction; OOD detection), runs.csv, summary.csv, paired_statistics.json and the plots val_accuracy.png,
support_hist.png, reliability.png, coverage_vs_set_size.png, risk_coverage.png, ood_histograms.png;
with model.pool=hopfield also the pooling support and pool_support_maps.png (the first validation
images of each run with the patches its pooling uses).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from _root import ROOT  # the repository root, on sys.path (scripts/_root.py)

from common.startup import say_loading  # noqa: E402  (standard library only)

say_loading("compare_heads.py")
from compare_progress import Progress  # noqa: E402
from comparison.worker_slots import InProcess, WorkerSlot, can_run  # noqa: E402
from common.children import ChildProcesses  # noqa: E402
from common.cli import run_cli  # noqa: E402
from common import rundir  # noqa: E402
from common.errors import UserError  # noqa: E402
from common.io import atomic_write_text, ensure_folder, json_text, prepare_output, read_json, write_json, writing  # noqa: E402
from common.runlock import RunLock  # noqa: E402
from configs.overrides import parse_command_line, split_command_line  # noqa: E402
from models.registry import HEAD_NAMES, check_settings  # noqa: E402

FEATURE_IDENTITY_KEYS = ("features_source_sha256", "features_settings_sha256")  # data.* keys, data/features.py
REPORT_SOURCE = "compare_source.json"  # in a report folder: the runs folder its report is of


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Overrides: key.sub=value or --key.sub VALUE (value parsed as YAML) override the config\n"
                                       "of every run. They may go anywhere on the line, before or after the options,\n"
                                       "e.g. --heads softmax sparsemax --seeds 0 1 optim.epochs=1",
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
    p.add_argument("--no-mlflow", action="store_true",
                   help="do not log the comparison to MLflow (default when mlflow is installed: one experiment, "
                        "in MLFLOW_TRACKING_URI or RUNS_DIR/mlflow.db; scripts/compare_tracking.py)")
    tune = p.add_argument_group("tuning (--tune: each variant tuned with Optuna on the tune split, then compared; "
                                "scripts/tune_heads.py)")
    tune.add_argument("--tune", action="store_true",
                      help="tune optim.lr, optim.weight_decay and each head's own settings per variant, the same "
                           "--trials each, on data.tune_fraction of train; then train the best settings over --seeds "
                           "and compare them, and the untuned settings, on val")
    tune.add_argument("--trials", type=int, default=20, help="finished (complete or pruned) trials per variant")
    tune.add_argument("--pruner", default="median", choices=("median", "hyperband", "none"),
                      help="stops trials behind on the per-epoch tune curve (none: every trial trains its budget)")
    tune.add_argument("--storage", default=None, metavar="URL",
                      help="Optuna storage shared by every process tuning this comparison: sqlite:///PATH, "
                           "postgresql://..., or journal:PATH (a file on a shared filesystem); default "
                           "sqlite:///RUNS_DIR/tune/studies.db")
    tune.add_argument("--tune-only", action="store_true",
                      help="run the trials, then stop (SLURM array tasks; the verdict runs come after)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="list what would run, run nothing")
    mode.add_argument("--emit-slurm", metavar="FILE", default=None,
                      help="write a SLURM array job script (one task per run) instead of running")
    mode.add_argument("--report-only", action="store_true",
                      help="train and evaluate nothing: report the finished runs, name the missing ones")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_command_line(p, argv, tool="python scripts/compare_heads.py")
    options, overrides = split_command_line(p, argv)[0], args.overrides
    if args.jobs < 1:
        raise UserError(f"--jobs must be at least 1, got {args.jobs}")
    if args.jobs > 1 and (args.emit_slurm or args.report_only or args.dry_run):
        raise UserError("--jobs runs local trainings; it does not combine with --emit-slurm, --report-only "
                        "or --dry-run")
    if args.emit_slurm and args.launcher:
        raise UserError("--launcher does not apply to --emit-slurm: each array task launches through "
                        "scripts/slurm_train.sh (accelerate launch per node); set GPUS_PER_NODE instead")
    if args.trials < 1:
        raise UserError(f"--trials must be at least 1, got {args.trials}")
    given = [a for a in ("--trials", "--pruner", "--storage", "--tune-only") if any(o.split("=")[0] == a for o in options)]
    if given and not args.tune:
        raise UserError(f"{given[0]} applies to --tune; add --tune")
    args.overrides = overrides + feature_overrides(args.features, overrides)
    return args


def feature_overrides(features, overrides):
    """The overrides --features DIR adds to every run (checked: DIR must be a feature folder)."""
    if features is None:
        return []
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


# ------------------------------------------------------------------------------------------ the plan
def _variants(args):
    """[(variant name, variant stem without the norm, norm, head, alpha)] in plan order."""
    for head in args.heads:
        if head not in HEAD_NAMES:
            from configs.loader import suggest_value

            raise UserError(f"unknown head '{head}' in --heads; valid: {', '.join(HEAD_NAMES)}"
                            f"{suggest_value(head, HEAD_NAMES)}")
    if args.alphas and "entmax_bisect" not in args.heads:
        raise UserError("--alphas applies to entmax_bisect; add it to --heads")
    for a in args.alphas or ():
        try:
            check_settings("entmax_bisect", {"alpha": a, "learn_alpha": args.learn_alpha})
        except UserError as err:
            raise UserError(f"--alphas: {err}") from None
    out = []
    for norm in args.norms or [None]:
        for head in args.heads:
            for alpha in ((args.alphas or [None]) if head == "entmax_bisect" else [None]):
                stem = head + (f"-a{alpha:g}" if alpha is not None else "") \
                    + ("-learned" if head == "entmax_bisect" and args.learn_alpha else "")
                out.append((stem + (f"-{norm}" if norm else ""), stem, norm, head, alpha))
    return out


def default_runs_dir(args):
    return args.runs_dir or os.path.join("runs", "compare", os.path.splitext(os.path.basename(args.config))[0])


def variant_overrides(args, head, alpha, norm):
    """What a variant adds to the comparison's overrides (its head, alpha, norm)."""
    ov = [f"head.name={head}"]
    if alpha is not None:
        ov.append(f"head.alpha={alpha}")
    if head == "entmax_bisect" and args.learn_alpha:
        ov.append("head.learn_alpha=true")
    if norm:
        ov.append(f"model.norm={norm}")
    return ov


def plan_runs(args, runs_dir=None, extra=None):
    """[(variant name, seed, run_dir, overrides)] in the order they will run, and the runs folder.
    `extra`: {variant name: overrides it adds} (--tune: its tuned settings)."""
    runs_dir = runs_dir or default_runs_dir(args)
    plan = []
    for name, _, norm, head, alpha in _variants(args):
        for seed in args.seeds:
            run_dir = os.path.join(runs_dir, f"{name}-s{seed}")
            ov = list(args.overrides) + (extra or {}).get(name, []) \
                + [f"head.name={head}", f"train.seed={seed}", f"train.output_dir={run_dir}"] \
                + variant_overrides(args, head, alpha, norm)[1:]
            plan.append((name, seed, run_dir, ov))
    return plan, runs_dir


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


def baseline_pairs(args):
    """[(variant, its baseline variant)]: every other variant against the baseline of the same norm."""
    variants = _variants(args)
    baseline = args.baseline
    if baseline is None:
        baseline = "softmax" if "softmax" in args.heads else variants[0][1]
    stems = sorted({v[1] for v in variants})
    if baseline not in stems:
        raise UserError(f"--baseline {baseline} is not among the compared variants; valid: {', '.join(stems)}")
    base_of = {norm: name for name, stem, norm, _, _ in variants if stem == baseline}
    return [(name, base_of[norm]) for name, stem, norm, _, _ in variants if stem != baseline]


def resolve_ood(args, cfg):
    """The OOD dataset name eval.py gets (None: no OOD detection)."""
    from data import is_features
    from evaluation.ood_report import default_ood_dataset, ood_dataset_names

    if args.ood_dataset == "none":
        return None
    if is_features(cfg.data):
        return _feature_ood(args, cfg)
    if args.ood_dataset == "auto":
        return default_ood_dataset(cfg.data.dataset)
    if args.ood_dataset not in ood_dataset_names():
        raise UserError(f"unknown --ood-dataset '{args.ood_dataset}'; valid: auto, none, "
                        f"{', '.join(ood_dataset_names())}")
    return args.ood_dataset


def _feature_ood(args, cfg):
    """On cached features the OOD set is OOD features: the folder's own (DIR/ood) or --ood-root's."""
    from data.features import ood_root

    if args.ood_dataset not in ("auto", "features"):
        raise UserError(f"--ood-dataset {args.ood_dataset}: on cached features the OOD set is OOD features; use "
                        f"auto (DIR/ood, scripts/extract_features.py --ood NAME), features with --ood-root DIR, or none")
    if args.ood_root is None and ood_root(cfg.data.root) is None:
        if args.ood_dataset == "auto":
            return None
        raise UserError(f"--ood-dataset features: {cfg.data.root} holds no OOD features; extract them with "
                        f"scripts/extract_features.py --ood NAME, or give --ood-root OOD_FEATURE_DIR")
    return "features"


class Commands:
    """The train and eval commands of a planned run; the same in every mode."""

    def __init__(self, args, config, ood):
        self.config, self.ood, self.ood_root = config, ood, args.ood_root
        self.ema = args.ema
        self.eval_file = rundir.eval_result_name(args.ema)
        self.launcher = shlex.split(args.launcher) if args.launcher else [sys.executable]
        if args.launcher and not any(os.path.basename(c).startswith("python") for c in self.launcher) \
                and "launch" not in self.launcher:
            raise UserError(f"--launcher '{args.launcher}' should end in a Python launcher "
                            f"(e.g. 'accelerate launch --num_processes 2' or 'python')")

    def train_args(self, overrides):
        return ["--config", self.config, *overrides, "--resume", "auto"]

    def eval_args(self, run_dir):
        out = ["--checkpoint", run_dir, "--output", os.path.join(run_dir, self.eval_file), "--quiet"]
        out += ["--ema"] if self.ema else []
        if self.ood:
            out += ["--ood-dataset", self.ood] + (["--ood-root", self.ood_root] if self.ood_root else [])
        return out

    def train(self, overrides):
        return self.launcher + [os.path.join(ROOT, "train.py")] + self.train_args(overrides)

    def evaluate(self, run_dir):
        return self.launcher + [os.path.join(ROOT, "eval.py")] + self.eval_args(run_dir)


def run_status(run_dir, commands):
    """(trained, evaluated): summary.json; eval JSON + per-example records (+ the asked OOD results)."""
    trained = os.path.isfile(os.path.join(run_dir, rundir.SUMMARY))
    path = os.path.join(run_dir, commands.eval_file)
    evaluated = os.path.isfile(path) and os.path.isfile(rundir.examples_path(path))
    if evaluated and commands.ood:
        try:
            with open(path) as f:
                evaluated = (json.load(f).get("ood") or {}).get("dataset") == commands.ood
        except (OSError, ValueError):
            evaluated = False
    return trained, evaluated


# ------------------------------------------------------------------------------------- run requests
def _first_difference(old, new, prefix=""):
    """'optim.lr: 0.004 -> 0.002' for the first differing leaf of two nested dicts."""
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diff = _first_difference(a, b, f"{prefix}{key}.")
            if diff:
                return diff
        elif a != b:
            return f"{prefix}{key}: {a!r} -> {b!r}"
    return None


def _check_request(run_dir, request, create=True):
    """Refuse to mix a run trained with other settings (overrides or config contents) into this
    comparison; record the request when the run is first started. Where the config file lies is not a
    setting: a runs folder moved together with its config is the same comparison."""
    path = os.path.join(run_dir, rundir.COMPARE_REQUEST)
    request = json.loads(json_text(request))  # tuples -> lists, as stored
    if os.path.isfile(path):
        with open(path) as f:
            previous = _in_todays_schema(json.load(f))
        if _settings(previous) != _settings(request):
            diff = _first_difference(previous.get("resolved", {}), request.get("resolved", {})) \
                or " ".join(previous.get("overrides", []))
            raise UserError(f"{run_dir} was trained with other settings ({diff}); "
                            f"use another --runs-dir or delete that run")
    elif create:
        with RunLock(run_dir, purpose="compare_heads"):  # not while another process trains or evaluates there
            write_json(request, path)


def _settings(request):
    """What a request asks for: its overrides and resolved config, not the config file's path."""
    return {key: value for key, value in request.items() if key != "config"}


def _in_todays_schema(request):
    """A stored request with its resolved config read by today's loader: keys added since at their
    defaults, so an older comparison continues. A resolved config today's loader refuses is compared
    as stored."""
    import configs

    if not isinstance(request.get("resolved"), dict):
        return request
    try:
        resolved = configs.config_to_dict(configs.config_from_dict(request["resolved"]))
    except UserError:
        return request
    return {**request, "resolved": json.loads(json_text(resolved))}


def _request(configs, config, overrides):
    return {"config": config, "overrides": overrides,
            "resolved": configs.config_to_dict(configs.load_config(config, overrides))}


# ---------------------------------------------------------------------------------- local execution
def _run(children, cmd, what):
    print(f"$ {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    status = children.run(cmd)  # in the caller's directory: relative run paths mean the same
    children.check_stopped(f"{what} stopped (exit {status})", status)
    if status != 0:
        raise UserError(f"{what} failed (exit {status}); fix the error above and rerun the same command "
                        f"(finished runs are kept, interrupted ones resume)")


def device_env(slot, jobs, environ=None, gpu_count=None, cpu_count=None):
    """Environment of job slot `slot` (0..jobs-1): with GPUs, CUDA_VISIBLE_DEVICES = the visible GPUs
    slot, slot+jobs, ... (round-robin; a slot shares one when there are fewer GPUs than jobs);
    without, OMP_NUM_THREADS = an equal share of the CPU cores (at least 1), never more than an
    OMP_NUM_THREADS the environment already sets (the user's cap is kept, not silently raised)."""
    env = dict(os.environ if environ is None else environ)
    gpu_count = _gpu_count() if gpu_count is None else gpu_count
    if gpu_count > 0:
        visible = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()] \
            or [str(i) for i in range(gpu_count)]
        mine = visible[slot::jobs] or [visible[slot % len(visible)]]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
    else:
        cpu_count = _cpu_count() if cpu_count is None else cpu_count
        share = max(1, cpu_count // jobs)
        asked = env.get("OMP_NUM_THREADS", "").strip()
        if asked.isdigit() and int(asked) >= 1:
            share = min(share, int(asked))
        env["OMP_NUM_THREADS"] = str(share)
    return env


def _gpu_count():
    import torch

    return torch.cuda.device_count()


def _cpu_count():
    """CPU cores this process may use (its affinity mask where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def run_parallel(todo, commands, jobs, children, progress=None):
    """Train and evaluate `todo` [(tag, run_dir, overrides, trained)] with `jobs` runs at once, each
    in its slot's environment (device_env) with its output in RUN_DIR/compare.log.
    Returns (trained, evaluated); UserError naming every failed run at the end (StoppedBySignal,
    with the first stopped child's exit code, once every child has saved after a signal)."""
    slots = list(range(jobs))
    workers = {slot: WorkerSlot(children, device_env(slot, jobs)) for slot in slots}  # started when used
    lock = threading.Lock()
    counts = {"trained": 0, "evaluated": 0}
    failures, stopped = [], []

    def say(msg):
        with lock:
            print(msg, flush=True)

    def one(item):
        tag, run_dir, overrides, trained = item
        if children.stopped:
            return
        with lock:
            slot = slots.pop(0)
        try:
            env = workers[slot].env
            pinned = {k: env[k] for k in ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS") if k in env}
            log = os.path.join(run_dir, rundir.COMPARE_LOG)
            steps = ([("training", commands.train(overrides))] if not trained else []) \
                + [("evaluating", commands.evaluate(run_dir))]
            with writing(log):
                ensure_folder(run_dir)
                out = open(log, "a")
            with out:
                for what, cmd in steps:
                    say(f"{tag}: {what} (slot {slot}, {' '.join(f'{k}={v}' for k, v in pinned.items())}; log {log})")
                    out.write(f"$ {' '.join(shlex.quote(c) for c in cmd)}\n")
                    out.flush()
                    if can_run(cmd):  # one Python start per slot, not two per run (compare_worker.py)
                        status = workers[slot].run(cmd, log)
                    else:
                        status = children.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
                    if children.stopped:
                        with lock:
                            stopped.append((f"{run_dir} ({what} exit {status}; see {log})", status))
                        return
                    if status != 0:
                        with lock:
                            failures.append(f"{run_dir} ({what} exit {status}; see {log})")
                        return
                    if what == "training" and not os.path.isfile(os.path.join(run_dir, rundir.SUMMARY)):
                        with lock:
                            failures.append(f"{run_dir} (train.py wrote no summary.json; see {log})")
                        return
                    with lock:
                        counts["trained" if what == "training" else "evaluated"] += 1
            say(f"{tag}: done" + (f"; {progress.line()}" if progress else ""))
        finally:
            with lock:
                slots.append(slot)

    try:
        with ThreadPoolExecutor(max_workers=jobs) as pool:
            list(pool.map(one, todo))
    finally:
        for worker in workers.values():
            worker.close()
    if stopped:
        children.check_stopped(f"stopped {'; '.join(s for s, _ in stopped)}",
                               next((code for _, code in stopped if code), 0))
    children.check_stopped("stopped between runs")
    if failures:
        raise UserError(f"{len(failures)} run(s) failed: {'; '.join(failures)}; fix and rerun the same command "
                        f"(finished runs are kept, interrupted ones resume)")
    return counts["trained"], counts["evaluated"]


# ------------------------------------------------------------------------------------- SLURM script
SLURM_TEMPLATE = """\
#!/bin/bash
# Head comparison {stem}: a SLURM array job, one task per planned run ({n} runs), written by
#   {command}
# Submit it from anywhere (each task works in the repository): sbatch {script}
# A task trains its run with scripts/slurm_train.sh (accelerate launch per node, --resume auto; near the
# time limit it checkpoints and requeues the task) and then evaluates it with eval.py. Finished work
# is skipped, so a requeued or resubmitted task continues where it stopped. Defaults: one node with
# GPUS_PER_NODE GPUs per run (sbatch --nodes / --gpus-per-node and GPUS_PER_NODE=... change them;
# keep the global batch: see scripts/slurm_train.sh). When the tasks are done:
#   {report_command}
#SBATCH --job-name=compare-{stem}
#SBATCH --array=0-{last}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1          # one `accelerate launch` per node; it spawns one process per GPU
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=72:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%x-%A_%a.out
set -euo pipefail

REPO={repo}   # relative paths of the plan (run directories, data roots) are relative to it
CONFIG={config}
export GPUS_PER_NODE=${{GPUS_PER_NODE:-8}}
TASK=${{SLURM_ARRAY_TASK_ID:?submit this script with sbatch: it is an array job}}

case "$TASK" in
{cases}
  *) echo "no run for array task $TASK (this script plans {n}: 0-{last})"; exit 1;;
esac
cd "$REPO"

if [ ! -f "$RUN_DIR/summary.json" ]; then
  # scripts/slurm_train.sh runs in the background so that this batch shell can pass the time-limit
  # signal (USR1, --signal=B:...) on to it; it then checkpoints, requeues the task and exits non-zero.
  CONFIG="$CONFIG" SLURM_SUBMIT_DIR="$REPO" bash "$REPO/scripts/slurm_train.sh" "${{TRAIN_OVERRIDES[@]}}" &
  TRAIN=$!
  TRAPPED=0
  trap 'TRAPPED=1; kill -USR1 "$TRAIN" 2>/dev/null || true' USR1
  trap 'TRAPPED=1' TERM
  while :; do
    TRAPPED=0
    wait "$TRAIN" && STATUS=0 || STATUS=$?
    [ "$TRAPPED" = 1 ] && kill -0 "$TRAIN" 2>/dev/null || break
  done
  [ "$STATUS" = 0 ] || exit "$STATUS"   # preempted (requeued by slurm_train.sh) or failed
fi

if ! python "$REPO/scripts/compare_heads.py" --check-evaluated "$RUN_DIR" {eval_file} {ood_check}; then
  if [ "$GPUS_PER_NODE" -gt 1 ]; then
    EVAL_LAUNCH=(accelerate launch --multi_gpu --num_machines 1 --num_processes "$GPUS_PER_NODE")
  else
    EVAL_LAUNCH=(python)
  fi
  srun --nodes=1 --ntasks=1 "${{EVAL_LAUNCH[@]}}" "$REPO/eval.py" "${{EVAL_ARGS[@]}}"
fi
"""


def _bash_array(words):
    return "(" + " ".join(shlex.quote(w) for w in words) + ")"


def emit_slurm(path, plan, commands, stem, command, report_command):
    """Write the array job script: task i = plan[i] (train with its overrides, then evaluate).

    The tasks run in the repository root, as scripts/slurm_train.sh does (it starts train.py from
    there): the plan's relative paths mean the same only when compare_heads.py runs there too."""
    if os.path.realpath(os.getcwd()) != os.path.realpath(ROOT):
        raise UserError("--emit-slurm: run compare_heads.py from the repository root (the job runs "
                        "train.py there, as scripts/slurm_train.sh does, so relative run directories and "
                        "data roots must mean the same)")
    cases = []
    for i, (_, _, run_dir, ov) in enumerate(plan):
        cases.append(f"  {i}) RUN_DIR={shlex.quote(run_dir)}\n"
                     f"     TRAIN_OVERRIDES={_bash_array(ov)}\n"
                     f"     EVAL_ARGS={_bash_array(commands.eval_args(run_dir))};;")
    text = SLURM_TEMPLATE.format(
        stem=stem, n=len(plan), last=len(plan) - 1, command=command, script=path, report_command=report_command,
        repo=shlex.quote(ROOT), config=shlex.quote(commands.config),
        cases="\n".join(cases), eval_file=shlex.quote(commands.eval_file),
        ood_check=shlex.quote(commands.ood) if commands.ood else "")
    atomic_write_text(path, text)
    with writing(path):
        os.chmod(path, 0o755)


def check_evaluated_cli(argv):
    """`compare_heads.py --check-evaluated RUN_DIR EVAL_FILE [OOD]`: exit 0 when evaluated (for the
    SLURM script; the same rule as the local modes)."""
    run_dir, eval_file = argv[0], argv[1]

    class _C:
        pass

    c = _C()
    c.eval_file, c.ood = eval_file, (argv[2] if len(argv) > 2 else None)
    return 0 if run_status(run_dir, c)[1] else 1


# ----------------------------------------------------------------------------------------------- main
def _command_line(argv):
    return "python scripts/compare_heads.py " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))


def _report_only_argv(argv):
    """The same arguments with --emit-slurm FILE replaced by --report-only."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--emit-slurm":
            skip = True
        elif not a.startswith("--emit-slurm="):
            out.append(a)
    return out + ["--report-only"]


def main(argv=None):
    raw = list(argv) if argv is not None else sys.argv[1:]
    if raw[:1] == ["--check-evaluated"]:
        return check_evaluated_cli(raw[1:])
    args = parse_args(argv)
    import configs

    config = os.path.abspath(args.config)
    base_cfg = configs.load_config(config, args.overrides)  # fail fast on a bad config / override
    commands = Commands(args, config, resolve_ood(args, base_cfg))
    if args.tune:
        import tune_heads

        return tune_heads.main(args, argv, base_cfg, commands, compare=sys.modules[__name__])
    plan, runs_dir = plan_runs(args)
    compare(args, argv, plan, runs_dir, commands)
    return 0


def compare(args, argv, plan, runs_dir, commands, report_dir=None, children=None, title_note=""):
    """Train and evaluate what `plan` still misses (or, in the other modes, emit / list / report it),
    then write the report; -> (report.md path, paired results), None when nothing was reported
    (--emit-slurm, --dry-run). `children`: a runner to use (--tune runs several plans under one)."""
    import configs

    raw = list(argv) if argv is not None else sys.argv[1:]
    config = commands.config
    pairs = baseline_pairs(args)  # checks --baseline before anything runs
    stem = os.path.splitext(os.path.basename(args.config))[0]
    report_dir = report_dir or report_dir_of(args, runs_dir, stem)
    check_report_dir(report_dir, runs_dir, args.overwrite)  # before any training, not after
    requests = {}
    for _, _, run_dir, ov in plan:
        requests[run_dir] = _request(configs, config, ov)
        _check_request(run_dir, requests[run_dir], create=False)  # also for finished runs: no stale reuse

    if args.emit_slurm:
        for _, _, run_dir, _ in plan:
            _check_request(run_dir, requests[run_dir])
        emit_slurm(args.emit_slurm, plan, commands, stem, _command_line(argv), _command_line(_report_only_argv(raw)))
        print(f"wrote {args.emit_slurm}: a SLURM array job of {len(plan)} task(s), one per run in {runs_dir}; "
              f"submit it with: sbatch {args.emit_slurm}")
        return None
    todo = runs_to_do(plan, commands, args)
    if args.dry_run:
        print(f"report: {os.path.join(report_dir, 'report.md')} (not written by --dry-run)")
        return None
    prepare_output(report_dir, folder=True)  # before any training: a report folder that cannot be written
    start = time.perf_counter()
    progress = Progress(len(todo), skipped=len(plan) - len(todo))
    if children is not None:
        trained_now, evaluated_now = run_todo(todo, commands, requests, args.jobs, children, progress)
    else:
        with ChildProcesses() as launcher:  # signals go on to train.py / eval.py, which save and stop
            trained_now, evaluated_now = run_todo(todo, commands, requests, args.jobs, runner(args, launcher),
                                                  progress)
    path, missing, paired = write_comparison_report(plan, commands, args, pairs, stem, _command_line(argv),
                                                    report_dir, runs_dir, title_note=title_note)
    log_to_mlflow(plan, commands, args, runs_dir, report_dir)
    print(f"{trained_now} training run(s) and {evaluated_now} evaluation(s) done now in "
          f"{time.perf_counter() - start:.0f}s; {len(plan) - len(missing)} of {len(plan)} run(s) in {runs_dir}")
    print(f"report: {path}")
    return path, paired


def runner(args, children):
    """What runs the train.py / eval.py steps: `children` (signals forwarded), or with --features,
    one job and no --launcher, this process (a probe trains in far less time than a Python start takes)."""
    return InProcess(children) if args.features and args.jobs == 1 and not args.launcher else children


def runs_to_do(plan, commands, args):
    """Print each planned run's state; -> [(tag, run_dir, overrides, trained)] still to train or evaluate
    (none under --dry-run / --report-only, which only say what is missing)."""
    todo = []
    for i, (name, seed, run_dir, ov) in enumerate(plan, 1):
        tag = f"[{i}/{len(plan)}] {name} seed {seed}"
        trained, evaluated = run_status(run_dir, commands)
        if trained and evaluated:
            print(f"{tag}: done, skipped ({run_dir})", flush=True)
        elif args.dry_run:
            print(f"{tag}: would {'evaluate' if trained else 'train and evaluate'} {run_dir}")
        elif args.report_only:
            print(f"{tag}: missing (not {'evaluated' if trained else 'trained'}) {run_dir}")
        else:
            todo.append((tag, run_dir, ov, trained))
    return todo


def run_todo(todo, commands, requests, jobs, children, progress=None):
    """Train and evaluate `todo`, one run after another or `jobs` at once, through `children`
    (common.children.ChildProcesses: signals are forwarded); -> (trained, evaluated)."""
    for _, run_dir, _, _ in todo:
        _check_request(run_dir, requests[run_dir])
    if todo and jobs > 1:
        return run_parallel(todo, commands, jobs, children, progress)
    trained_now = evaluated_now = 0
    for tag, run_dir, ov, trained in todo:
        if not trained:
            print(f"{tag}: training", flush=True)
            _run(children, commands.train(ov), f"training {run_dir}")
            trained_now += 1
            if not os.path.isfile(os.path.join(run_dir, rundir.SUMMARY)):
                raise UserError(f"train.py finished without writing {run_dir}/summary.json")
        print(f"{tag}: evaluating", flush=True)
        _run(children, commands.evaluate(run_dir), f"evaluating {run_dir}")
        evaluated_now += 1
        if progress:
            print(progress.line(), flush=True)
    return trained_now, evaluated_now


def log_to_mlflow(plan, commands, args, runs_dir, report_dir):
    """The finished runs and the report in one MLflow experiment (scripts/compare_tracking.py), unless
    --no-mlflow."""
    import compare_tracking
    from evaluation.report import flatten_metrics

    if args.no_mlflow:
        return
    if not compare_tracking.available():
        print("note: mlflow is not installed, so the comparison is not logged to MLflow "
              "(pip install mlflow, or pass --no-mlflow)")
        return
    settings = {name: (head, norm, alpha) for name, _, norm, head, alpha in _variants(args)}
    runs = []
    for name, seed, run_dir, _ in plan:
        if all(run_status(run_dir, commands)):
            head, norm, alpha = settings[name]
            tags = {"head": head, "seed": seed, "variant": name, "norm": norm, "alpha": alpha}
            runs.append((run_dir, flatten_metrics(read_json(os.path.join(run_dir, commands.eval_file))), tags))
    uri, experiment = compare_tracking.log_comparison(runs, runs_dir, report_dir)
    print(f"mlflow: {len(runs)} run(s) and the report in experiment '{experiment}'; see them with: "
          f"mlflow ui --backend-store-uri {uri}")


def write_comparison_report(plan, commands, args, pairs, stem, command, report_dir, runs_dir, title_note=""):
    """Report the finished runs (naming the missing ones) and print its table and sentences;
    -> (report.md path, missing run dirs, paired results)."""
    from evaluation import comparison, summary

    weights = "ema" if args.ema else "raw"
    variants, missing = {}, []
    for name, seed, run_dir, _ in plan:
        if all(run_status(run_dir, commands)):
            variants.setdefault(name, []).append(
                comparison.load_run(run_dir, commands.eval_file, weights=weights, seed=seed))
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
    with RunLock(report_dir, purpose="compare_heads report"):  # one writer of the report folder
        check_report_dir(report_dir, runs_dir, args.overwrite, record=True)
        table, path, paired_results = comparison.write_report(
            variants, report_dir, f"Head comparison: {stem}{title_note}", command, weights=weights,
            notes=notes, pairs=pairs, missing=missing)
    print(f"\n{table}\n")
    verdicts, checks = comparison.verdict_lines(variants, paired_results)
    if verdicts:
        print("Verdicts (across trainings: would another training differ too? details and the numbers given "
              "these trainings in report.md):")
        print("\n".join(f"- {v}" for v in verdicts))
    if checks:
        print("Sanity checks:")
        print("\n".join(f"- {c}" for c in checks))
    print(f"\n{summary.HEADER}")  # last: what a user takes away, derived from the numbers above
    print("\n".join(f"- {line}" for line in summary.plain_words(variants, paired_results,
                                                                comparison.mean_curves(variants))))
    print()
    return path, missing, paired_results

if __name__ == "__main__":
    run_cli(main)
