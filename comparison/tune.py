"""compare_heads --tune: every variant tuned with the same budget on the tune split, then the tuned
and the untuned settings compared on the held-out split (comparison/command.py calls `main` for --tune;
with --until-settled, comparison/tune_settle.py's, which uses the studies and trials of this module).

    RUNS_DIR/tune/studies.db                   the Optuna storage (default; --storage URL for another:
                                               comparison/tuning_storage.py)
    RUNS_DIR/tune/trials/<variant>/trial-N/    one training run per trial (comparison/tuning.py), its
                                               request recorded (comparison/ledger.py)
    RUNS_DIR/tune/tuned/<variant>-s<seed>/     the verdict runs: each variant's best settings, --seeds
    RUNS_DIR/tune/untuned/<variant>-s<seed>/   the same runs with the config's own settings
    REPORT_DIR/report.md                       the tuned comparison, then the tuning (settings, scores,
                                               the untuned and tuned values side by side, plots) and
                                               how its verdicts differ from the untuned ones
    REPORT_DIR/untuned/report.md               the untuned comparison
    REPORT_DIR/tuning.json, tuning_<variant>_history.png, tuning_<variant>_importance.png

The splits: trials train on train minus calib minus tune and select on tune (data.tune_fraction,
default TUNE_FRACTION when the config holds none out); both verdict arms train on the same data, so
they differ in their settings only, and eval.py reports them on val, which no trial read.
A trial's directory is its own: the request it records (its settings and the config they resolve
to) must match the trial run there, else it is refused in one line; it resumes from its checkpoint,
or restarts from scratch (train.py --overwrite) when it has none (killed before its first save).
Modes: --tune-only stops after the studies (SLURM array tasks); --dry-run says where each study
stands; --report-only reports what is finished; --emit-slurm writes the verdict runs of both arms
as one array job once every study is finished.
"""
import contextlib
import os
import resource
import subprocess
import time

import configs
import data
from common import rundir
from common.children import ChildProcesses
from common.errors import UserError
from common.io import ensure_folder, write_json, writing
from comparison import tracking, tuning, tuning_storage
from comparison.execution import runner
from comparison.ledger import check_request, request_of
from comparison.modes import compare_plan
from comparison.plan import config_stem, default_runs_dir, plan_runs, variant_overrides, variants
from comparison.report import plain_words, tuning_section
from comparison.report.write import report_dir_of
from comparison.storage_url import check_url
from comparison.tuning_summary import say_studies, tuned_words, tuning_summary
from comparison.worker_slots import InProcess, WorkerSlot
from training.checkpoint.files import find_latest, run_artefacts

TUNE_FRACTION = 0.1  # of train (after the calib split), when the config holds out no tune split
SAMPLER_SEED = 0


def tune_overrides(args, base_cfg):
    """The overrides every trial and both verdict arms add (the tune hold-out, evaluated per epoch)."""
    keys = {o.split("=", 1)[0] for o in args.overrides}
    if "train.eval_split" in keys:
        raise UserError("--tune evaluates every run's epochs on the tune split (train.eval_split=tune); drop the "
                        "train.eval_split override")
    fraction = base_cfg.data.tune_fraction if base_cfg.data.tune_fraction > 0 else TUNE_FRACTION
    return tuning.tune_overrides(fraction)


def study_specs(args, base_cfg, tune_dir):
    """{variant name: comparison.tuning.VariantStudy's arguments but its storage} in plan order: what each
    study is, known before the storage opens (--until-settled records it in its design: comparison/tune_settle.py)."""
    stem = config_stem(args)
    num_classes = data.num_classes(base_cfg.data)
    specs = {}
    for name, _, norm, head, alpha in variants(args):
        overrides = args.overrides + variant_overrides(args, head, alpha, norm)
        specs[name] = {"name": f"{stem}/{name}", "head": head,
                       "space": tuning.search_space(head, overrides, num_classes), "overrides": overrides,
                       "trials": args.trials, "epochs": base_cfg.optim.epochs,
                       "eval_every": base_cfg.train.eval_every, "pruner": args.pruner, "seed": SAMPLER_SEED,
                       "trials_dir": os.path.join(tune_dir, "trials", name), "weights": "ema" if args.ema else "raw"}
    return specs


def open_studies(args, base_cfg, tune_dir, specs=None):
    """{variant name: comparison.tuning.VariantStudy} in plan order (`specs`: study_specs', else made here)."""
    storage = tuning_storage.open_storage(args.storage or tuning_storage.default_storage(tune_dir))
    specs = specs or study_specs(args, base_cfg, tune_dir)
    return {name: tuning.VariantStudy(storage=storage, **spec) for name, spec in specs.items()}


def trial_folder(config, run_dir, overrides):
    """Before a trial reads or trains anything in `run_dir`: refuse a folder of other settings (its
    recorded request: comparison/ledger.py) and record this trial's; -> whether it has a complete
    checkpoint to resume from (else the trial starts from scratch)."""
    request = os.path.join(run_dir, rundir.COMPARE_REQUEST)
    with writing(request):  # a folder that cannot be created: one line, exit 74
        ensure_folder(run_dir)
    if run_artefacts(run_dir) and not os.path.isfile(request):
        raise UserError(f"{run_dir} holds a run that no trial recorded (no {rundir.COMPARE_REQUEST}); delete it or "
                        f"use another --runs-dir")
    check_request(run_dir, request_of(config, overrides))
    return find_latest(run_dir, warn=lambda message: None) is not None


class TrialTrainer:
    """How a trial's intervals train: train.py through the comparison's runner (in process, else one job
    worker, else the --launcher command), its output in the trial's RUN_DIR/compare.log."""

    def __init__(self, args, commands, children):
        self.commands, self.children = commands, children
        run = runner(args, children)
        self.in_process = run if isinstance(run, InProcess) else None
        self.worker = WorkerSlot(children, dict(os.environ)) if self.in_process is None and not args.launcher \
            else None

    def start(self, run_dir, overrides):
        return trial_folder(self.commands.config, run_dir, overrides)

    def train(self, overrides, run_dir, fresh):
        """train.py up to the interval `overrides` name; `fresh`: from scratch (--overwrite deletes what a
        run killed before its first checkpoint left), else --resume auto. -> its exit status."""
        cmd = self.commands.train(overrides)
        if fresh:
            assert cmd[-2:] == ["--resume", "auto"], cmd
            cmd = cmd[:-2] + ["--overwrite"]
        log = os.path.join(run_dir, rundir.COMPARE_LOG)
        if self.worker is not None:
            return self.worker.run(cmd, log)
        with open(log, "a") as out:
            if self.in_process is None:
                return self.children.run(cmd, stdout=out, stderr=subprocess.STDOUT)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                return self.in_process.run(cmd)

    def close(self):
        if self.worker is not None:
            self.worker.close()


def stopped_before_unfinished(args, studies, mode, then, emitted):
    """--dry-run or --emit-slurm while a study has fewer than --trials complete trials: --dry-run says it
    would run the trials, `then` the rest (-> True: stop there); --emit-slurm, which writes `emitted` with
    the studies' best settings, is refused in one line. -> False when every study is finished."""
    unfinished = [n for n, s in studies.items() if s.complete() < args.trials]
    if args.dry_run and unfinished:
        print(f"would run the trials of {', '.join(unfinished)}, then {then}")
        return True
    if args.emit_slurm and unfinished:
        raise UserError(f"--emit-slurm with {mode} writes {emitted}, which need finished studies; "
                        f"{', '.join(unfinished)} have fewer than --trials {args.trials} complete trials (tune "
                        f"first: see the cluster recipe in docs/tuning.md)")
    return False


def main(args, argv, base_cfg, commands):
    runs_dir = default_runs_dir(args)
    tune_dir = os.path.join(runs_dir, "tune")
    report_dir = report_dir_of(args, runs_dir, config_stem(args))
    check_url(args.storage or tuning_storage.default_storage(tune_dir))  # before anything is made
    tracking.check_mlflow_store(args, runs_dir)  # before any trial: the store the verdicts are logged into
    args.overrides = args.overrides + tune_overrides(args, base_cfg)
    studies = open_studies(args, base_cfg, tune_dir)
    say_studies(studies)
    if args.dry_run or args.report_only or args.emit_slurm:
        if stopped_before_unfinished(args, studies, "--tune", "the verdict runs", "the verdict runs"):
            return 0
        return verdicts(args, argv, commands, studies, tune_dir, report_dir, None, 0.0)
    with ChildProcesses() as children:  # signals go on to train.py, which saves; the trial is queued again
        timing = run_trials(args, commands, studies, children)
        if args.tune_only:
            return 0
        return verdicts(args, argv, commands, studies, tune_dir, report_dir, runner(args, children), timing)


def run_trials(args, commands, studies, children):
    """Every study up to its budget, its trials run here through `children` (common.children.ChildProcesses);
    -> the tuning section's timing of this process, None when it ran no trial."""
    start, cpu = time.perf_counter(), time.process_time()
    trainer = TrialTrainer(args, commands, children)
    ran = 0
    try:
        for study in studies.values():
            ran += study.optimize(trainer, stopped=lambda: children.stopped)
            children.check_stopped("stopped between trials")
    finally:
        trainer.close()
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu + _children_cpu()
    print(f"tuning: {args.trials} complete trial(s) per variant for {len(studies)} variant(s); this process "
          f"ran {ran} trial(s) in {wall:.0f}s wall, {cpu:.0f}s CPU", flush=True)
    return {"wall_s": wall, "cpu_s": cpu, "trials": ran} if ran else None


def _children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def verdicts(args, argv, commands, studies, tune_dir, report_dir, children, timing):
    """Both arms' verdict runs (or their SLURM array / the reports of what is finished) and the report.
    `children`: the runner both arms share (None: each arm opens its own)."""
    best = {name: study.best() for name, study in studies.items()}
    missing = [name for name, trial in best.items() if trial is None]
    if missing and not args.report_only:
        raise UserError(f"no complete trial for {', '.join(missing)} yet; run the trials first (the same command "
                        f"without --dry-run / --emit-slurm)")
    chosen = {name: tuning.as_overrides(t.params) for name, t in best.items() if t is not None}
    tuned_plan, tuned_dir = plan_runs(args, os.path.join(tune_dir, "tuned"), chosen)
    tuned_plan = [p for p in tuned_plan if p[0] in chosen]
    untuned_plan, untuned_dir = plan_runs(args, os.path.join(tune_dir, "untuned"))
    if args.emit_slurm or args.dry_run:  # one array job (or listing) for both arms
        compare_plan(args, argv, tuned_plan + untuned_plan, tuned_dir, commands, report_dir=report_dir)
        return 0
    with plain_words_of_tuned(studies), tracking.deferred():  # both arms logged once the report is complete
        tuned = compare_plan(args, argv, tuned_plan, tuned_dir, commands, report_dir=report_dir, children=children,
                             title_note=" (tuned settings)")
    with tracking.deferred():
        untuned = compare_plan(args, argv, untuned_plan, untuned_dir, commands,
                               report_dir=os.path.join(report_dir, "untuned"), children=children,
                               title_note=" (untuned: the config's settings)")
    summary = tuning_summary(studies, best, timing, tune_split(commands.config, args.overrides), commands.config)
    write_json(summary, os.path.join(report_dir, "tuning.json"))
    lines = tuning_section.tuning_section(summary, tuned[1], untuned[1], report_dir, untuned_report=os.path.join(
        "untuned", os.path.basename(untuned[0])), pruner=args.pruner)
    tuning_section.append_section(tuned[0], lines)
    print("\n".join(tuning_section.verdict_lines(tuned[1], untuned[1])))
    tracking.log_tuned_comparison(args, commands, os.path.dirname(tune_dir),
                                  {"tuned": tuned_plan, "untuned": untuned_plan}, report_dir)
    print(f"report: {tuned[0]} (tuned, with the tuning section); {untuned[0]} (untuned)")
    return 0


def tune_split(config_path, overrides):
    """{"images", "fraction"}: the tune split every trial scored on, counted from the config the
    trials resolve to (`overrides` with tune_overrides': data/datasets.py's split_positions holds it
    out of train after the calib split)."""
    cfg = configs.load_config(config_path, overrides).data
    return {"images": len(data.build_dataset(cfg, "tune")), "fraction": cfg.tune_fraction}


@contextlib.contextmanager
def plain_words_of_tuned(studies):
    """The tuned arm's plain-words summary says what was tuned, not to tune (comparison/report/plain_words.py)."""
    token = plain_words.TUNED.set(tuned_words(studies))
    try:
        yield
    finally:
        plain_words.TUNED.reset(token)
