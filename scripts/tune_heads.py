"""compare_heads --tune: every variant tuned with the same budget on the tune split, then the tuned
and the untuned settings compared on the held-out split (what compare_heads.py calls for --tune).

    RUNS_DIR/tune/studies.db                   the Optuna storage (default; --storage URL for another)
    RUNS_DIR/tune/trials/<variant>/trial-N/    one training run per trial (comparison/tuning.py)
    RUNS_DIR/tune/tuned/<variant>-s<seed>/     the verdict runs: each variant's best settings, --seeds
    RUNS_DIR/tune/untuned/<variant>-s<seed>/   the same runs with the config's own settings
    REPORT_DIR/report.md                       the tuned comparison, then the tuning (settings, scores,
                                               plots) and how its verdicts differ from the untuned ones
    REPORT_DIR/untuned/report.md               the untuned comparison
    REPORT_DIR/tuning.json, tuning_<variant>_history.png, tuning_<variant>_importance.png

The splits: trials train on train minus calib minus tune and select on tune (data.tune_fraction,
default TUNE_FRACTION when the config holds none out); both verdict arms train on the same data, so
they differ in their settings only, and eval.py reports them on val, which no trial read.
Modes: --tune-only stops after the studies (SLURM array tasks); --dry-run says where each study
stands; --report-only reports what is finished; --emit-slurm writes the verdict runs of both arms
as one array job once every study is finished.
"""
import contextlib
import json
import os
import subprocess
import time

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from common.errors import UserError  # noqa: E402
from common.io import ensure_folder, write_json, writing  # noqa: E402
from comparison.worker_slots import InProcess, WorkerSlot  # noqa: E402
from comparison import tuning  # noqa: E402
from common.children import ChildProcesses  # noqa: E402

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


def open_studies(args, base_cfg, compare, tune_dir):
    """{variant name: comparison.tuning.VariantStudy} in plan order."""
    import data

    storage = tuning.open_storage(args.storage or tuning.default_storage(tune_dir))
    stem = os.path.splitext(os.path.basename(args.config))[0]
    num_classes = data.num_classes(base_cfg.data)
    studies = {}
    for name, _, norm, head, alpha in compare._variants(args):
        overrides = args.overrides + compare.variant_overrides(args, head, alpha, norm)
        studies[name] = tuning.VariantStudy(
            storage=storage, name=f"{stem}/{name}", head=head, space=tuning.search_space(head, overrides, num_classes),
            overrides=overrides, trials=args.trials, epochs=base_cfg.optim.epochs,
            eval_every=base_cfg.train.eval_every, pruner=args.pruner, seed=SAMPLER_SEED,
            trials_dir=os.path.join(tune_dir, "trials", name), weights="ema" if args.ema else "raw")
    return studies


def trial_trainer(args, commands, children, compare):
    """train(overrides, run_dir) -> exit status: train.py through compare_heads' runner (in process,
    else one job worker, else the --launcher command), its output in the trial's RUN_DIR/compare.log.
    Also returns what to close at the end."""
    from common import rundir

    run = compare.runner(args, children)
    run = run if isinstance(run, InProcess) else None
    worker = WorkerSlot(children, dict(os.environ)) if run is None and not args.launcher else None

    def train(overrides, run_dir):
        cmd = commands.train(overrides)
        log = os.path.join(run_dir, rundir.COMPARE_LOG)
        with writing(log):  # a trial folder that cannot be created: one line (exit 74)
            ensure_folder(run_dir)
        if worker is not None:
            return worker.run(cmd, log)
        with open(log, "a") as out:
            if run is None:
                return children.run(cmd, stdout=out, stderr=subprocess.STDOUT)
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                return run.run(cmd)

    return train, (worker.close if worker is not None else (lambda: None))


def main(args, argv, base_cfg, commands, compare):
    runs_dir = compare.default_runs_dir(args)
    tune_dir = os.path.join(runs_dir, "tune")
    stem = os.path.splitext(os.path.basename(args.config))[0]
    report_dir = compare.report_dir_of(args, runs_dir, stem)
    args.overrides = args.overrides + tune_overrides(args, base_cfg)
    studies = open_studies(args, base_cfg, compare, tune_dir)
    say_studies(studies)
    if args.dry_run or args.report_only or args.emit_slurm:
        unfinished = [n for n, s in studies.items() if s.finished() < args.trials]
        if args.dry_run and unfinished:
            print(f"would run the trials of {', '.join(unfinished)}, then the verdict runs")
            return 0
        if args.emit_slurm and unfinished:
            raise UserError(f"--emit-slurm with --tune writes the verdict runs, which need finished studies; "
                            f"{', '.join(unfinished)} have fewer than --trials {args.trials} (tune first: see the "
                            f"README's SLURM recipe)")
        return verdicts(args, argv, commands, compare, studies, runs_dir, tune_dir, report_dir, None, 0.0)
    start, cpu = time.perf_counter(), time.process_time()
    with ChildProcesses() as children:  # signals go on to train.py, which saves; the trial is queued again
        train, close = trial_trainer(args, commands, children, compare)
        ran = 0
        try:
            for study in studies.values():
                ran += study.optimize(train, stopped=lambda: children.stopped)
                children.check_stopped("stopped between trials")
        finally:
            close()
        wall = time.perf_counter() - start
        cpu = time.process_time() - cpu + _children_cpu()
        print(f"tuning: {args.trials} finished trial(s) per variant for {len(studies)} variant(s); this process "
              f"{wall:.0f}s wall, {cpu:.0f}s CPU")
        if args.tune_only:
            return 0
        runner = compare.runner(args, children)
        return verdicts(args, argv, commands, compare, studies, runs_dir, tune_dir, report_dir, runner,
                        {"wall_s": wall, "cpu_s": cpu, "trials": ran} if ran else None)


def _children_cpu():
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def say_studies(studies):
    for name, study in studies.items():
        counts = study.counts()
        space = ", ".join(f"{k} {r.text()}" for k, r in study.space.items()) or "nothing to tune"
        print(f"[tune {name}] {study.finished()}/{study.trials} trial(s) finished "
              f"({', '.join(f'{v} {k.lower()}' for k, v in sorted(counts.items())) or 'none yet'}); searching {space}")


def verdicts(args, argv, commands, compare, studies, runs_dir, tune_dir, report_dir, runner, timing):
    """Both arms' verdict runs (or their SLURM array / the reports of what is finished) and the report."""
    from evaluation import tuning_report

    best = {name: study.best() for name, study in studies.items()}
    missing = [name for name, trial in best.items() if trial is None]
    if missing and not args.report_only:
        raise UserError(f"no complete trial for {', '.join(missing)}: every trial was pruned or failed; rerun with "
                        f"--pruner none or more --trials")
    chosen = {name: tuning.as_overrides(t.params) for name, t in best.items() if t is not None}
    tuned_plan, tuned_dir = compare.plan_runs(args, os.path.join(tune_dir, "tuned"), chosen)
    tuned_plan = [p for p in tuned_plan if p[0] in chosen]
    untuned_plan, untuned_dir = compare.plan_runs(args, os.path.join(tune_dir, "untuned"))
    if args.emit_slurm or args.dry_run:  # one array job (or listing) for both arms
        compare.compare(args, argv, tuned_plan + untuned_plan, tuned_dir, commands, report_dir=report_dir)
        return 0
    tuned = compare.compare(args, argv, tuned_plan, tuned_dir, commands, report_dir=report_dir, children=runner,
                            title_note=" (tuned settings)")
    untuned = compare.compare(args, argv, untuned_plan, untuned_dir, commands,
                              report_dir=os.path.join(report_dir, "untuned"), children=runner,
                              title_note=" (untuned: the config's settings)")
    summary = tuning_summary(studies, best, timing)
    write_json(summary, os.path.join(report_dir, "tuning.json"))
    lines = tuning_report.tuning_section(summary, tuned[1], untuned[1], report_dir, untuned_report=os.path.join(
        "untuned", os.path.basename(untuned[0])), pruner=args.pruner)
    tuning_report.append_section(tuned[0], lines)
    print("\n".join(line for line in lines if line.startswith("- ")))
    print(f"report: {tuned[0]} (tuned, with the tuning section); {untuned[0]} (untuned)")
    return 0


def tuning_summary(studies, best, timing):
    """What the report shows of each study (plain data: evaluation/tuning_report.py plots it)."""
    out = {"timing": timing or None, "variants": {}}
    for name, study in studies.items():
        trials = []
        for t in study.study.get_trials(deepcopy=False):
            if t.user_attrs.get(tuning.SURPLUS):
                continue
            trials.append({"number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
                           "epochs": t.user_attrs.get(tuning.EPOCHS), "diverged": bool(t.user_attrs.get(tuning.DIVERGED)),
                           "run_dir": t.user_attrs.get(tuning.RUN_DIR)})
        out["variants"][name] = {
            "study": study.name, "space": {k: r.text() for k, r in study.space.items()}, "trials": trials,
            "budget_epochs": study.epochs, "best": None if best[name] is None else {
                "number": best[name].number, "value": best[name].value, "params": best[name].params},
            "importance": importance(study)}
    return json.loads(json.dumps(out))


def importance(study):
    """Optuna's parameter importances (fANOVA) of the study, or None where it cannot say (it needs
    two tuned settings and complete trials that differ)."""
    import optuna

    complete = [t for t in study.study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(study.space) < 2 or len(complete) < 2:
        return None
    try:
        return {k: float(v) for k, v in optuna.importance.get_param_importances(study.study, evaluator=(
            optuna.importance.FanovaImportanceEvaluator(seed=0))).items()}
    except (ValueError, RuntimeError):
        return None
