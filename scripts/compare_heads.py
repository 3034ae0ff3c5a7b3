"""Compare output heads: train every missing run, evaluate each, write a report with statistics and plots.

    python scripts/compare_heads.py --config configs/quickstart_compare.yaml \\
        --heads softmax sparsemax entmax15 [--norms affine layernorm] [--alphas 1.25 1.75] \\
        [--seeds 0 1 2] [--baseline softmax] [--ood-dataset auto|NAME|none] [--jobs N] \\
        [--runs-dir runs/compare] [--report-dir reports/compare] [--overwrite] [key.sub=value ...]
    python scripts/compare_heads.py ... --emit-slurm compare.sbatch   # then: sbatch compare.sbatch
    python scripts/compare_heads.py ... --report-only                 # aggregate the finished runs
    python scripts/compare_heads.py --config CFG --features FEATURE_DIR --heads ... --seeds ...   # cached features
    python scripts/compare_heads.py ... --tune [--trials N] [--pruner median|hyperband|none] [--storage URL]
    python scripts/compare_heads.py ... --until-settled [--max-seeds 20 | --looks 3 5 8 12] [--margin top1=0.5]

For each variant (head × norm × α) and seed the run directory is RUNS_DIR/<variant>-s<seed>. The plan
(run directories, configs, commands) is one function of the arguments, the same in every mode.
Training and evaluation go through the two entry points, as subprocesses:
`python train.py --config CFG <overrides> head.name=.. train.seed=.. train.output_dir=.. --resume auto`
`python eval.py --checkpoint RUN_DIR --output RUN_DIR/eval.json --quiet [--ood-dataset NAME]`
(both prefixed with --launcher, e.g. "accelerate launch --num_processes 8", when given). Subprocesses
because Accelerate's state (process group, device, mixed precision) is per process and a
multi-process launcher needs a fresh one anyway (without --launcher: one worker process per
job slot runs the steps, see below).
Modes:
  (default)      one run after another, output on the terminal; without --launcher one worker
                 process runs every step (scripts/compare_worker.py), as under --jobs N;
  --jobs N       N runs at once, each pinned to its share of the machine: with GPUs, CUDA_VISIBLE_DEVICES
                 gives job slot j the GPUs j, j+N, ... (round-robin); on CPU each job gets
                 OMP_NUM_THREADS = cores // N (at most the OMP_NUM_THREADS you set). Each run's
                 output goes to RUN_DIR/compare.log.
                 Without --launcher each slot is one Python process that runs its train.py and
                 eval.py mains one after another (scripts/compare_worker.py): a Python start with
                 torch costs ~7 s of CPU, which a fresh process per step paid twice per run;
  --emit-slurm F writes a SLURM array job, one task per planned run (the template: comparison/slurm_array.sh):
                 scripts/slurm_train.sh trains it (--resume auto, checkpoint + requeue on preemption),
                 then eval.py evaluates it;
  --report-only  aggregates the finished runs and names the missing ones;
  --dry-run      lists what would run and where the report would go.
MLflow (when installed; --no-mlflow: not): after the report, every finished run (its config, tags head / seed /
variant, per-epoch curve and final metrics) and the report's files go into one MLflow experiment named after
the runs folder, in MLFLOW_TRACKING_URI or else the offline store RUNS_DIR/mlflow.db (comparison/tracking.py).
After each run a progress line says how many of the plan's runs are finished and about how long the
rest will take at the pace so far (comparison/progress.py). Before it, the plan's first line is its cost:
the runs to do, their wall time on the --jobs slots and their GPU / CPU core-hours, at the per-run cost
measured from the finished runs of the runs folder (comparison/cost.py), or that none is measured yet.
Seeds until settled (--until-settled, comparison/settle.py): seeds 0, 1, ... in looks (--looks, or 3 5 8 12 ...
up to --max-seeds); after each look each head's question against the baseline (--settle-metric, top-1, at its
--margin) is read by the group-sequential design of comparison/analysis/sequential.py, and a head superior, inferior or
equivalent gets no more seeds. The design is recorded in RUNS_DIR/sequential_design.json and a rerun that
changes it after a look is refused; the report says at which look each head stopped and why.
Cached features (--features DIR, a folder of scripts/extract_features.py): the same plan, each run a linear
head on the cached features (data.dataset=features data.root=DIR and the folder's identity,
data.features_source_sha256 / features_settings_sha256, added to every run's overrides: a run trained on
features since re-extracted at DIR is refused, never mixed into the report), with the
same report, statistics, prediction sets, selective prediction and OOD detection (--ood-dataset auto: the
folder's OOD features, DIR/ood, when it has them). Without --launcher and --jobs, train.py and eval.py then
run inside this process, one after the other (a probe trains in well under a second; a fresh Python with
torch costs several), exactly as their command lines would run them.
Tuning (--tune, comparison/tune.py and comparison/tuning.py): first one Optuna study per variant, the
same --trials each, on a tune split held out of train (data.tune_fraction); then each variant's best
settings and the config's own are both trained over --seeds and compared on val, which no trial read.
With --until-settled too (comparison/tune_settle.py): the studies, then the looks of the tuned settings only,
one design (looks, margin and the tuning) in RUNS_DIR/tune/tuned/sequential_design.json.
Signals: SIGTERM / SIGINT / SIGUSR1 are forwarded to the running train.py / eval.py children
(common/children.py), which save and stop; compare_heads then exits with their code (143 ...), a
second signal kills them, and no child outlives it.
Resumable: a run with summary.json is trained and skipped; an interrupted one continues from its last
checkpoint (--resume auto); a run evaluated already (eval.json, its per-example records and, when an
OOD set is asked for, its OOD results) is not evaluated again. Both files are checked before anything reads
them (comparison/run_results.py): a damaged one, or another run's, is one line naming it, and the run is
evaluated again (--report-only, which evaluates nothing, refuses).
Report (REPORT_DIR; default reports/<config name> for the default runs folder, RUNS_DIR/report for
--runs-dir RUNS_DIR): the folder records which runs folder it reports on (compare_source.json) and
a report of another runs folder is refused unless --overwrite. report.md (mean ± std over seeds of every
metric; one verdict per variant against the baseline, across trainings, with sanity checks: chance level,
conformal coverage band, training budget; paired differences across trainings (t-interval and sign-flip
test over seeds, two-level bootstrap, power) and given these trainings (bootstrap over images, McNemar);
selective prediction; OOD detection), runs.csv, summary.csv, paired_statistics.json, summary.json (the
equivalence and non-inferiority verdicts against --margin METRIC=DELTA, default margins in the metric table;
with --until-settled the look each head stopped at) and the plots val_accuracy.png,
support_hist.png, reliability.png, coverage_vs_set_size.png, risk_coverage.png, ood_histograms.png;
with model.pool=hopfield also the pooling support and pool_support_maps.png (the first validation
images of each run with the patches its pooling uses).

The code: the package comparison/, one module per job (comparison/__init__.py lists them).
"""
import sys

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from common.cli import run_cli
from common.startup import say_loading
from comparison import cli  # (neither torch nor timm: the command line and the config are checked before they load)
from comparison.slurm import check_evaluated


def parse_args(argv=None):
    """The checked arguments (comparison/cli.py), with this docstring's first paragraph in --help."""
    return cli.parse_args(argv, description=__doc__.split("\n\n")[0])


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--check-evaluated"]:  # an array task's question (comparison/slurm_array.sh), not a comparison
        return check_evaluated(argv[1:])
    args = parse_args(argv)
    base_cfg = cli.resolved_config(args)
    say_loading("compare_heads.py")
    from comparison import command  # heavy: torch, timm and Accelerate (seconds), after the checks

    return command.run(args, argv, base_cfg)


if __name__ == "__main__":
    run_cli(main)
