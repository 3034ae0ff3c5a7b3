"""compare_heads --tune --until-settled: each variant tuned once on the tune split (comparison/tune.py's
studies, the same --trials each), then seeds added in looks with each variant's tuned settings until
each head's question against its reference is settled (comparison/settle.py). comparison/command.py
calls `main` for the combination.

    RUNS_DIR/tune/studies.db, RUNS_DIR/tune/trials/   the studies and their trials, as --tune's
    RUNS_DIR/tune/tuned/<variant>-s<seed>/            the looks' runs: each variant's best settings
    RUNS_DIR/tune/tuned/sequential_design.json        the one design: looks, metric, margin and the tuning
                                                      (--trials, --pruner, each study's search space,
                                                      overrides and epochs)
    REPORT_DIR/report.md                              the tuned comparison with its until-settled section,
                                                      then the tuning section; tuning.json and its plots

The tuned arm only: the design compares each tuned head with the tuned reference, and its verdicts
read no untuned run. The config's own settings would be another design, with its own runs folder
(--until-settled without --tune), so no untuned runs are trained.
The design, the tuning included, is checked under the runs folder's lock before the studies open, and
recorded once they have checked their own settings, before the first trial: once a look is taken, a
changed --trials, --pruner, search space, override, margin, metric or looks is refused in one line
before anything runs or is written. A kill loses nothing: a
killed trial is retried from its checkpoint (comparison/tuning.py), finished trials stay, and the
looks replay from the finished runs. --tune-only runs the trials and only checks the design (the
workers of docs/tuning.md share one study and no lock); --dry-run says where the studies and the
looks stand; --emit-slurm writes the next look once every study is finished; --report-only reports.
"""
import json
import os

from common.children import ChildProcesses
from common.errors import UserError
from common.io import write_json
from comparison import settle, tracking, tune, tuning, tuning_storage
from comparison.design_record import runs_folder
from comparison.modes import run_looks, settle_folders
from comparison.plan import config_stem, default_runs_dir
from comparison.report import tuning_section
from comparison.report.write import report_dir_of
from comparison.storage_url import check_url
from comparison.tuning_summary import say_studies, tuning_summary

TITLE_NOTE = " (tuned settings, seeds until settled)"


def tuning_design(specs, trials, pruner):
    """The tuning's part of the sequential design (comparison/design_record.py's "tuning"): the budget and
    what each study is (comparison/tune.py's study_specs), as JSON reads it back."""
    studies = {name: {"study": s["name"], **tuning.study_settings(s["space"], s["overrides"], s["epochs"],
                                                                    s["eval_every"], s["pruner"], s["weights"])}
               for name, s in specs.items()}
    return json.loads(json.dumps({"trials": trials, "pruner": pruner, "studies": studies}))


def main(args, argv, base_cfg, commands):
    runs_dir = default_runs_dir(args)
    tune_dir = os.path.join(runs_dir, "tune")
    tuned_dir = os.path.join(tune_dir, "tuned")
    pairs, stem, report_dir = settle_folders(args, tuned_dir, report_dir_of(args, runs_dir, config_stem(args)))
    check_url(args.storage or tuning_storage.default_storage(tune_dir))  # before anything is made
    tracking.check_mlflow_store(args, runs_dir)  # before any trial: the store the looks are logged into
    args.overrides = args.overrides + tune.tune_overrides(args, base_cfg)
    specs = tune.study_specs(args, base_cfg, tune_dir)
    writes = not (args.dry_run or args.report_only or args.tune_only)
    # one comparison at a time records the design and runs the looks (comparison/design_record.py)
    with runs_folder(tuned_dir, writes=writes) as holder:
        looks = settle.Looks(args, tuned_dir, commands, pairs, holder, record=writes, deferred=True,
                             tuning=tuning_design(specs, args.trials, args.pruner))
        studies = tune.open_studies(args, base_cfg, tune_dir, specs)  # each refuses other settings
        say_studies(studies)
        if tune.stopped_before_unfinished(args, studies, "--tune --until-settled", "the looks",
                                          "the next look's runs"):
            return 0
        looks.record_design()  # every check passed
        timing = None
        if not (args.dry_run or args.report_only or args.emit_slurm):
            with ChildProcesses() as children:  # signals go on to train.py, which saves; the trial is queued again
                timing = tune.run_trials(args, commands, studies, children)
            if args.tune_only:
                return 0
        settled_looks(args, argv, commands, studies, looks, stem, report_dir, timing)
    return 0


def settled_looks(args, argv, commands, studies, looks, stem, report_dir, timing):
    """The looks with each variant's best settings, then the tuning section in their report and one MLflow
    log of the looks' runs (the report complete)."""
    best = {name: study.best() for name, study in studies.items()}
    missing = [name for name, trial in best.items() if trial is None]
    if missing:
        raise UserError(f"no complete trial for {', '.join(missing)} yet; run the trials first (the same command "
                        f"without --dry-run / --report-only / --emit-slurm)")
    looks.tuned({name: tuning.as_overrides(trial.params) for name, trial in best.items()})
    with tune.plain_words_of_tuned(studies), tracking.deferred():  # logged once the tuning section is in
        reported = run_looks(args, argv, commands, looks, stem, report_dir, title_note=TITLE_NOTE)
    if reported is None:  # --dry-run, --emit-slurm
        return
    path, paired = reported
    summary = tuning_summary(studies, best, timing, tune.tune_split(commands.config, args.overrides), commands.config)
    write_json(summary, os.path.join(report_dir, "tuning.json"))
    tuning_section.append_section(path, tuning_section.tuning_section(summary, paired, None, report_dir,
                                                                      untuned_report=None, pruner=args.pruner))
    tracking.log_tuned_comparison(args, commands, default_runs_dir(args), {"tuned": looks.full}, report_dir)
    print(f"the tuning section is added to {path} (tuning.json and its plots beside it)")
