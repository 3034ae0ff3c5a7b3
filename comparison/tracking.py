"""A head comparison in MLflow: one experiment per comparison, one MLflow run per trained run, one for its report.

A comparison calls `log_to_mlflow` after writing its report, when MLflow is installed (--no-mlflow
turns it off). Offline by default: the store is MLFLOW_TRACKING_URI when set (a
tracking server works the same), else the SQLite file RUNS_DIR/mlflow.db, which needs nothing
started beforehand:

    mlflow ui --backend-store-uri sqlite:///RUNS_DIR/mlflow.db

The experiment is named after the runs folder in its own store (RUNS_DIR/mlflow.db holds one comparison), and by
the runs folder's absolute path in a shared store (MLFLOW_TRACKING_URI), where two comparisons' folders may share a
name. Every run of the comparison is an MLflow run of that experiment, named by its folder under the runs folder
(softmax-s0; tune/tuned/softmax-s0). It holds the resolved config as parameters, tags (kind=run, head, seed,
variant, norm: the run's model.norm, alpha: entmax_bisect's α or "none", run_dir; arm=tuned|untuned in a tuned
comparison), its per-epoch curve (train loss, lr, val metrics of the raw and EMA weights, epochs.csv, at each
epoch's step and at the time its row was written, epochs.csv's wall_time) and its final metrics (eval.py's result,
at the evaluation's time). A run trained with train.log_with=mlflow into the same store and experiment is completed
in place (its id is in RUN_DIR/trackers.json; a step train.py logged already is not logged twice); one trained
into another experiment (the config's) stays there, and the comparison's experiment gets its own run. A run is
found again by its run_dir tag, so rerunning the comparison updates it rather than adding a second one. The report
folder (report.md, the CSV and JSON files, the plots, subfolders as they are) is logged as the artifacts of one
more MLflow run, tagged kind=report and report_dir. Artifacts go to the store's own place: beside an SQLite store
(RUNS_DIR/mlartifacts for the comparison's own), never the current folder (training.trackers.artifact_location).

compare_heads --tune (comparison/tune.py) logs once, after its report is complete: both arms' verdict runs
(RUNS_DIR/tune/tuned/, RUNS_DIR/tune/untuned/, told apart by their arm tag) into the comparison's own store and
experiment, and the final report folder (report.md with its tuning section, tuning.json, the tuning plots,
untuned/) as the report run's artifacts; `deferred` keeps each arm's own comparison from logging before that.
"""
import contextlib
import contextvars
import csv
import importlib.util
import math
import os

import configs
from common import rundir
from common.errors import UserError
from common.io import read_json
from comparison import run_results
from evaluation.tables import flatten_metrics
from training.logging import WALL_TIME
from training.trackers import (
    MLFLOW_DB,
    MLFLOW_URI_ENV,
    artifact_location,
    flat_params,
    open_mlflow_store,
    quiet_mlflow,
    shown_uri,
)

REPORT_TAG = "report"
RUN_TAG = "run"
_DEFERRED = contextvars.ContextVar("comparison_mlflow_deferred", default=False)


def log_to_mlflow(plan, commands, args, runs_dir, report_dir):
    """The finished runs of `plan` and the report in one MLflow experiment, unless --no-mlflow (or `deferred`)."""
    if _DEFERRED.get() or not wanted(args):
        return
    uri, experiment = log_comparison(finished_runs(plan, commands), runs_dir, report_dir)
    say_logged(len(plan), uri, experiment)


def log_tuned_comparison(args, commands, runs_dir, arms, report_dir):
    """compare_heads --tune, once its report is complete: `arms` {"tuned": plan, "untuned": plan}, their finished
    runs tagged with their arm, into the store and experiment of the comparison in `runs_dir`; the report folder
    (the untuned report in its untuned/ subfolder) as the report run's artifacts."""
    if not wanted(args):
        return
    runs = [(run_dir, result, {**tags, "arm": arm}, evaluated_ms)
            for arm, plan in arms.items() for run_dir, result, tags, evaluated_ms in finished_runs(plan, commands)]
    uri, experiment = log_comparison(runs, runs_dir, report_dir)
    say_logged(len(runs), uri, experiment)


@contextlib.contextmanager
def deferred():
    """Within it, `log_to_mlflow` logs nothing: compare_heads --tune logs both arms itself, once its report is
    complete (`log_tuned_comparison`)."""
    token = _DEFERRED.set(True)
    try:
        yield
    finally:
        _DEFERRED.reset(token)


def wanted(args):
    if args.no_mlflow:
        return False
    if not available():
        print("note: mlflow is not installed, so the comparison is not logged to MLflow "
              "(pip install mlflow, or pass --no-mlflow)")
        return False
    return True


def check_mlflow_store(args, runs_dir):
    """Before a comparison trains anything: the store it will log into can be used (else one line naming it)."""
    if args.no_mlflow or not available():
        return
    uri = tracking_uri(runs_dir)
    _, problem = open_mlflow_store(uri)
    if problem:
        raise UserError(f"the comparison cannot log to the MLflow store {shown_uri(uri)}: {problem}; "
                        f"set {MLFLOW_URI_ENV} to another store, or pass --no-mlflow")


def say_logged(count, uri, experiment):
    print(f"mlflow: {count} run(s) and the report in experiment '{experiment}'; see them with: "
          f"mlflow ui --backend-store-uri {shown_uri(uri)}")


def finished_runs(plan, commands):
    """[(run_dir, eval result, tags, when it was evaluated in ms)] of the runs of `plan` that are trained and
    evaluated."""
    runs = []
    for name, seed, run_dir, _ in plan:
        if all(commands.status(run_dir)):
            tags = {"seed": seed, "variant": name}
            evaluated_ms = int(os.path.getmtime(os.path.join(run_dir, commands.eval_file)) * 1000)
            runs.append((run_dir, flatten_metrics(run_results.read_result(run_dir, commands.eval_file)), tags,
                         evaluated_ms))
    return runs


def available():
    return importlib.util.find_spec("mlflow") is not None


def tracking_uri(runs_dir):
    return os.environ.get(MLFLOW_URI_ENV) or "sqlite:///" + os.path.abspath(os.path.join(runs_dir, MLFLOW_DB))


def experiment_name(runs_dir):
    """The runs folder's name in the comparison's own store; its absolute path in a shared one."""
    path = os.path.normpath(os.path.abspath(runs_dir))
    return path if os.environ.get(MLFLOW_URI_ENV) else os.path.basename(path)


def _finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _epoch_rows(run_dir):
    path = os.path.join(run_dir, rundir.EPOCHS)
    if not os.path.isfile(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def _float(text):
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _find_run(client, experiment_id, run_dir, uri):
    """The MLflow run of `run_dir` in the comparison's experiment: its own (train.log_with=mlflow into the same store
    and experiment) or an earlier sync's. Its own run in another experiment (the config's) stays there."""
    saved = os.path.join(run_dir, rundir.TRACKERS)
    if os.path.isfile(saved):
        record = read_json(saved)
        if record.get(MLFLOW_URI_ENV) == uri and record.get("mlflow_run_id"):
            try:
                own = client.get_run(record["mlflow_run_id"]).info
            except Exception:
                own = None
            if own is not None and own.experiment_id == experiment_id:
                return own.run_id
    found = client.search_runs([experiment_id], filter_string=f"tags.run_dir = '{os.path.abspath(run_dir)}'",
                               max_results=1)
    return found[0].info.run_id if found else None


def run_tags(cfg, run_dir, tags):
    """The run's tags: the caller's, its head, and its norm and α as the run's config has them ("none": a head
    without an α setting), so every run carries every tag."""
    alpha = cfg.head.alpha if cfg.head.name == "entmax_bisect" else "none"
    return {"kind": RUN_TAG, "head": cfg.head.name, "norm": cfg.model.norm, "alpha": alpha, **tags,
            "run_dir": os.path.abspath(run_dir)}


def _epoch_times_ms(run_dir, rows):
    """Each epochs.csv row's time in ms: its wall_time column. A row of a run trained before epochs.csv had one is
    dated back from the file's last change through the later rows' time_s (an estimate, in order)."""
    later = os.path.getmtime(os.path.join(run_dir, rundir.EPOCHS))
    times = []
    for row in reversed(rows):
        at = _float(row.get(WALL_TIME))
        at = later if at is None else at
        times.append(int(at * 1000))
        later = at - (_float(row.get("time_s")) or 0.0)
    return times[::-1]


def run_metrics(run_dir, result, evaluated_ms):
    """[mlflow Metric]: the per-epoch curve (epochs.csv, at each epoch's step and time) and eval.py's final
    metrics (at the evaluation's time)."""
    from mlflow.entities import Metric  # optional: mlflow (seconds to import; --no-mlflow never does)

    metrics = []
    rows = _epoch_rows(run_dir)
    for row, at_ms in zip(rows, _epoch_times_ms(run_dir, rows) if rows else []):
        step = int(_float(row.get("step")) or 0)
        for key, text in row.items():
            value = _float(text)
            if key not in ("epoch", "step", WALL_TIME) and value is not None:
                metrics.append(Metric(f"epoch/{key}", value, at_ms, step))
    return metrics + [Metric(f"final/{k}", float(v), evaluated_ms, 0) for k, v in result.items() if _finite(v)]


def _not_logged(client, run, metrics):
    """`metrics` less those the run already holds at the same step (logged by train.py, or by an earlier sync): a
    rerun adds no second point at a step."""
    held = set()
    for key in {m.key for m in metrics} & set(run.data.metrics):
        held |= {(key, m.step) for m in client.get_metric_history(run.info.run_id, key)}
    return [m for m in metrics if (m.key, m.step) not in held]


def log_run(client, experiment_id, uri, run_dir, result, tags, evaluated_ms, name):
    """Create or complete the MLflow run `name` of one finished, evaluated run. A run it creates spans the times
    of its points (the training's, not the sync's)."""
    from mlflow.entities import Param, RunTag  # optional: mlflow, as above

    cfg = configs.load_run_config(run_dir)
    points = run_metrics(run_dir, result, evaluated_ms)
    run_id = _find_run(client, experiment_id, run_dir, uri)
    if run_id is None:
        first_ms = min((m.timestamp for m in points), default=None)
        run_id = client.create_run(experiment_id, start_time=first_ms, run_name=name).info.run_id
    run = client.get_run(run_id)
    if run.info.run_name != name:  # train.py's own run, named after its config like its siblings
        client.update_run(run_id, name=name)
    own = bool(run.data.params)  # params already logged (by train.py, or an earlier sync)
    params = [] if own else [Param(k, str(v)[:6000]) for k, v in flat_params(configs.config_to_dict(cfg)).items()]
    metrics = _not_logged(client, run, points)
    all_tags = [RunTag(k, str(v)) for k, v in run_tags(cfg, run_dir, tags).items()]
    for start in range(0, len(metrics), 900):  # MLflow's log_batch takes at most 1000 metrics
        client.log_batch(run_id, metrics=metrics[start:start + 900])
    for start in range(0, len(params), 90):  # and 100 params
        client.log_batch(run_id, params=params[start:start + 90])
    client.log_batch(run_id, tags=all_tags)
    client.set_terminated(run_id, end_time=max([run.info.end_time or 0] + [m.timestamp for m in points]) or None)
    return run_id


def report_files(report_dir):
    """[(path, artifact folder or None)]: the report folder's files as they lie (subfolders kept), but hidden
    files (the folder's own records) and links."""
    out = []
    for folder, dirs, files in os.walk(report_dir):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and not os.path.islink(os.path.join(folder, d)))
        rel = os.path.relpath(folder, report_dir)
        for name in sorted(files):
            path = os.path.join(folder, name)
            if not name.startswith(".") and os.path.isfile(path) and not os.path.islink(path):
                out.append((path, None if rel == "." else rel.replace(os.sep, "/")))
    return out


def log_report(client, experiment_id, report_dir):
    """The report folder as the artifacts of the experiment's report run (tagged kind=report and report_dir; found
    again by them on a rerun)."""
    where = os.path.abspath(report_dir)
    found = client.search_runs([experiment_id], max_results=1,
                               filter_string=f"tags.kind = '{REPORT_TAG}' and tags.report_dir = '{where}'")
    run_id = found[0].info.run_id if found else client.create_run(experiment_id, run_name=REPORT_TAG).info.run_id
    client.set_tag(run_id, "kind", REPORT_TAG)
    client.set_tag(run_id, "report_dir", where)
    for path, folder in report_files(report_dir):
        client.log_artifact(run_id, path, artifact_path=folder)
    client.set_terminated(run_id)
    return run_id


def log_comparison(runs, runs_dir, report_dir):
    """`runs`: [(run_dir, eval result dict, tags dict, evaluated ms)] of the finished runs, each logged as the
    MLflow run named by its folder under `runs_dir` (softmax-s0, tune/tuned/softmax-s0). The experiment keeps its
    artifacts in the store's own place (training.trackers.artifact_location). -> (tracking URI, experiment)."""
    from mlflow.tracking import MlflowClient  # optional: mlflow, as above

    quiet_mlflow()
    uri, name = tracking_uri(runs_dir), experiment_name(runs_dir)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(
        name, artifact_location=artifact_location(uri, runs_dir))
    for run_dir, result, tags, evaluated_ms in runs:
        run_name = os.path.relpath(os.path.abspath(run_dir), os.path.abspath(runs_dir)).replace(os.sep, "/")
        log_run(client, experiment_id, uri, run_dir, result, tags, evaluated_ms, run_name)
    log_report(client, experiment_id, report_dir)
    return uri, name
