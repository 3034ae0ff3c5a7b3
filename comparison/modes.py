"""One plan through the mode asked: --emit-slurm writes its array job, --dry-run lists it,
--report-only reports what is finished; otherwise its missing steps run here (one after another, or
--jobs N at once) before the report and the MLflow log. --tune sends each of its arms through here;
--until-settled sends each look's plan (comparison/settle.py decides which seeds it holds), and so does
--tune --until-settled, with the tuned settings (comparison/tune_settle.py)."""
import os
import time

from common import rundir
from common.children import ChildProcesses
from common.errors import UserError
from common.io import prepare_output
from comparison import cost, settle, tracking
from comparison.cli import command_line
from comparison.commands import is_trained
from comparison.design_record import runs_folder
from comparison.execution import run_todo, runner
from comparison.ledger import check_request, request_of
from comparison.plan import baseline_pairs, config_stem, default_runs_dir
from comparison.progress import Progress
from comparison.report.write import check_report_dir, report_dir_of, write_comparison_report
from comparison.slurm import emit_slurm, report_only_argv
from comparison.tracking import log_to_mlflow


def compare_plan(args, argv, plan, runs_dir, commands, report_dir=None, children=None, title_note=""):
    """Train and evaluate what `plan` still misses (or, in the other modes, emit / list / report it),
    then write the report; -> (report.md path, paired results), None when nothing was reported
    (--emit-slurm, --dry-run). `children`: a runner to use (--tune runs several plans under one)."""
    pairs, stem, report_dir = check_folders(args, runs_dir, report_dir)
    requests = plan_requests(plan, commands)
    if not args.report_only:
        print(cost.plan_line(plan, unfinished(plan, commands), commands, runs_dir, _slots(args)), flush=True)
    if args.emit_slurm:
        emit(args, argv, plan, runs_dir, commands, stem, requests)
        return None
    todo = runs_to_do(plan, commands, args)
    if args.dry_run:
        print(f"report: {os.path.join(report_dir, 'report.md')} (not written by --dry-run)")
        return None
    prepare_output(report_dir, folder=True)  # before any training: a report folder that cannot be written
    tracking.check_mlflow_store(args, runs_dir)  # and an MLflow store that cannot be used: one line now
    start = time.perf_counter()
    if children is not None:
        counts = run_todo(todo, commands, requests, args.jobs, children, _progress(plan, todo, args))
    else:
        with ChildProcesses() as launcher:  # signals go on to train.py / eval.py, which save and stop
            counts = run_todo(todo, commands, requests, args.jobs, runner(args, launcher), _progress(plan, todo, args))
    return report_and_log(args, argv, plan, runs_dir, commands, pairs, stem, report_dir, start, counts,
                          title_note=title_note)


def check_folders(args, runs_dir, report_dir=None):
    """(pairs, stem, report folder), checked before anything runs: --baseline, and that the report
    folder is this runs folder's."""
    pairs = baseline_pairs(args)
    stem = config_stem(args)
    report_dir = report_dir or report_dir_of(args, runs_dir, stem)
    check_report_dir(report_dir, runs_dir, args.overwrite)  # before any training, not after
    return pairs, stem, report_dir


def plan_requests(plan, commands):
    """{run_dir: request} of a plan, each checked against what its folder recorded (finished runs
    too: no stale reuse). A request is made when first needed (a config read each): now for every
    run started (its folder records one) and each variant's first run (its settings checked before
    anything runs), else when the run is about to start, so a long --until-settled plan costs no more
    than its started runs."""
    requests = _Requests(commands.config, {run_dir: ov for _, _, run_dir, ov in plan})
    first = {}
    for name, _, run_dir, _ in plan:
        first.setdefault(name, run_dir)
        if first[name] == run_dir or os.path.isfile(os.path.join(run_dir, rundir.COMPARE_REQUEST)):
            check_request(run_dir, requests[run_dir], create=False)
    return requests


class _Requests(dict):
    """{run_dir: request of its overrides}, each made when first asked for."""

    def __init__(self, config, overrides):
        super().__init__()
        self.config, self.overrides = config, overrides

    def __missing__(self, run_dir):
        self[run_dir] = request_of(self.config, self.overrides[run_dir])
        return self[run_dir]


def unfinished(plan, commands):
    """The run folders of `plan` not yet trained and evaluated."""
    return {run_dir for _, _, run_dir, _ in plan if not all(commands.status(run_dir))}


def emit(args, argv, plan, runs_dir, commands, stem, requests, next_command=None):
    """--emit-slurm: record every run's request, write the array job. `next_command`: what the script
    says to run when its tasks are done (default: the --report-only command)."""
    for _, _, run_dir, _ in plan:
        check_request(run_dir, requests[run_dir])
    emit_slurm(args.emit_slurm, plan, commands, stem, command_line(argv),
               next_command or command_line(report_only_argv(argv)))
    print(f"wrote {args.emit_slurm}: a SLURM array job of {len(plan)} task(s), one per run in {runs_dir}; "
          f"submit it with: sbatch {args.emit_slurm}")


def _slots(args):
    """The slots the cost line schedules on: --jobs, or every array task of --emit-slurm at once."""
    return cost.ARRAY if args.emit_slurm else args.jobs


def _progress(plan, todo, args):
    return Progress(len(todo), skipped=len(plan) - len(todo), slots=args.jobs)


def report_and_log(args, argv, plan, runs_dir, commands, pairs, stem, report_dir, start, counts, title_note="",
                   sequential=None):
    """The report of the finished runs of `plan`, the MLflow log, and the closing lines."""
    path, missing, paired = write_comparison_report(plan, commands, args, pairs, stem, command_line(argv),
                                                    report_dir, runs_dir, title_note=title_note,
                                                    sequential=sequential)
    log_to_mlflow(plan, commands, args, runs_dir, report_dir)
    print(f"{counts[0]} training run(s) and {counts[1]} evaluation(s) done now in "
          f"{time.perf_counter() - start:.0f}s; {len(plan) - len(missing)} of {len(plan)} run(s) in {runs_dir}")
    print(f"report: {path}")
    return path, paired


def runs_to_do(plan, commands, args):
    """Print each planned run's state; -> [(tag, run_dir, overrides, trained)] still to train or evaluate
    (none under --dry-run / --report-only, which only say what is missing)."""
    states = [(is_trained(run_dir), commands.evaluation(run_dir)) for _, _, run_dir, _ in plan]
    damaged = [(run_dir, why) for (_, _, run_dir, _), (trained, why) in zip(plan, states)
               if trained and why is not None and why.damaged]
    if args.report_only and damaged:  # before any line: it reports nothing it cannot read
        run_dir, why = damaged[0]
        raise UserError(f"{why.reason}; --report-only evaluates nothing: evaluate the run again with "
                        f"{commands.eval_line(run_dir)}, or rerun without --report-only (it does that)"
                        + (f" ({len(damaged) - 1} more run(s) like it)" if len(damaged) > 1 else ""))
    todo = []
    for i, ((name, seed, run_dir, ov), (trained, why)) in enumerate(zip(plan, states), 1):
        tag = f"[{i}/{len(plan)}] {name} seed {seed}"
        again = f" again ({why.reason})" if trained and why is not None and why.damaged else ""
        if trained and why is None:
            print(f"{tag}: done, skipped ({run_dir})", flush=True)
        elif args.dry_run:
            print(f"{tag}: would {'evaluate' if trained else 'train and evaluate'}{again} {run_dir}")
        elif args.report_only:
            print(f"{tag}: missing (not {'evaluated' if trained else 'trained'}) {run_dir}")
        else:
            if again:
                print(f"{tag}: {why.reason}; evaluating it again", flush=True)
            todo.append((tag, run_dir, ov, trained))
    return todo


# ---- --until-settled ------------------------------------------------------------------------------------
def compare_until_settled(args, argv, commands):
    """Looks of seeds until each head's question against its reference is settled (comparison/settle.py):
    here, each look's missing runs run (one after another or --jobs N), then the decisions are read
    again, until no head needs more; --dry-run lists the next look, --emit-slurm writes it as an array
    job (one look at a time: rerun after it to emit the next), --report-only reports the looks so far."""
    runs_dir = default_runs_dir(args)
    pairs, stem, report_dir = settle_folders(args, runs_dir)
    # one comparison at a time writes the runs folder's design and runs its looks (comparison/design_record.py)
    with runs_folder(runs_dir, writes=not (args.dry_run or args.report_only)) as holder:
        run_looks(args, argv, commands, settle.Looks(args, runs_dir, commands, pairs, holder), stem, report_dir)
    return 0


def settle_folders(args, runs_dir, report_dir=None):
    """check_folders' (pairs, stem, report folder) of an --until-settled comparison, which needs a pair."""
    pairs, stem, report_dir = check_folders(args, runs_dir, report_dir)
    if not pairs:
        raise UserError("--until-settled settles each head against a reference: give at least two --heads")
    return pairs, stem, report_dir


def run_looks(args, argv, commands, looks, stem, report_dir, title_note=""):
    """The looks of `looks` (a settle.Looks, the runs folder held) through the mode asked, then the report;
    -> report_and_log's (report.md path, paired results), None when nothing was reported (--dry-run,
    --emit-slurm). --tune --until-settled (comparison/tune_settle.py) calls it with the tuned settings."""
    runs_dir, pairs = looks.runs_dir, looks.pairs
    requests = plan_requests(looks.full, commands)
    plan, missing = looks.now()
    if not args.report_only:  # (--report-only: its report says where each head stands)
        for line in cost.settle_lines(looks, missing, _slots(args)):
            print(line, flush=True)
        looks.say()
    if args.emit_slurm:
        _emit_look(args, argv, looks, plan, missing, runs_dir, commands, stem, requests)
        return None
    start, counts = time.perf_counter(), (0, 0)
    if args.dry_run or args.report_only:
        runs_to_do(plan, commands, args)  # lists the look's runs: done, would run, or missing
        if args.dry_run:
            print(f"report: {os.path.join(report_dir, 'report.md')} (not written by --dry-run)")
            return None
    else:
        prepare_output(report_dir, folder=True)  # before any training: a report folder that cannot be written
        plan, counts = _run_looks(args, looks, plan, missing, commands, requests)
    return report_and_log(args, argv, plan, runs_dir, commands, pairs, stem, report_dir, start, counts,
                          title_note=title_note, sequential=looks.document())


def _run_looks(args, looks, plan, missing, commands, requests):
    """Each look's missing runs here, then the decisions read again, until no head needs more seeds;
    -> (the last look's plan, (trained, evaluated) now)."""
    counts = (0, 0)
    with ChildProcesses() as launcher:  # signals go on to train.py / eval.py, which save and stop
        run = runner(args, launcher)
        while missing:
            print(looks.header(plan, missing), flush=True)
            todo = runs_to_do([entry for entry in plan if entry[2] in missing], commands, args)
            done = run_todo(todo, commands, requests, args.jobs, run, _progress(plan, todo, args))
            counts = (counts[0] + done[0], counts[1] + done[1])
            plan, missing = looks.now()
            if missing:  # (after the last look the report says where each head stopped)
                looks.say()
    return plan, counts


def _emit_look(args, argv, looks, plan, missing, runs_dir, commands, stem, requests):
    """--emit-slurm --until-settled: the array job of the next look's missing runs, or why there is none."""
    if not missing:
        print(f"nothing to emit: no head needs more seeds ({looks.why_done()}); the report: "
              f"{command_line(report_only_argv(argv))}")
        return
    look = [entry for entry in plan if entry[2] in missing]
    emit(args, argv, look, runs_dir, commands, stem, requests,
         next_command=f"{command_line(argv)}   (the next look; when no head needs more seeds, it says so: then "
                      f"{command_line(report_only_argv(argv))})")
