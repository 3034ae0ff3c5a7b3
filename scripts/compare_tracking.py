"""A head comparison in MLflow: one experiment per comparison, one MLflow run per trained run.

scripts/compare_heads.py calls `log_comparison` after writing its report, when MLflow is installed
(--no-mlflow turns it off). Offline by default: the store is MLFLOW_TRACKING_URI when set (a
tracking server works the same), else the SQLite file RUNS_DIR/mlflow.db, which needs nothing
started beforehand:

    mlflow ui --backend-store-uri sqlite:///RUNS_DIR/mlflow.db

The experiment is named after the runs folder (the comparison's config name by default). Each run
holds the resolved config as parameters, tags (head, seed, variant, norm, alpha, run_dir, and a tune
trial when the caller gives one), its per-epoch curve (train loss, lr, val metrics of the raw and EMA
weights, epochs.csv, at each epoch's step) and its final metrics (eval.py's result). A run trained
with train.log_with=mlflow into the same store is completed in place (its id is in RUN_DIR/trackers.json);
otherwise the run is found again by its run_dir tag, so rerunning the comparison updates it rather than
adding a second one. The report (report.md, the CSV and JSON files, the plots) is logged as the
artifacts of one more MLflow run, tagged kind=report.
"""
import csv
import importlib.util
import math
import os

import configs
from common import rundir
from common.io import read_json
from training.trackers import MLFLOW_DB, MLFLOW_URI_ENV, flat_params, quiet_mlflow

REPORT_TAG = "report"


def available():
    return importlib.util.find_spec("mlflow") is not None


def tracking_uri(runs_dir):
    return os.environ.get(MLFLOW_URI_ENV) or "sqlite:///" + os.path.abspath(os.path.join(runs_dir, MLFLOW_DB))


def experiment_name(runs_dir):
    return os.path.basename(os.path.normpath(os.path.abspath(runs_dir)))


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
    """The MLflow run of `run_dir`: its own (train.log_with=mlflow, same store) or an earlier sync's."""
    saved = os.path.join(run_dir, rundir.TRACKERS)
    if os.path.isfile(saved):
        record = read_json(saved)
        if record.get(MLFLOW_URI_ENV) == uri and record.get("mlflow_run_id"):
            try:
                return client.get_run(record["mlflow_run_id"]).info.run_id
            except Exception:  # noqa: BLE001 - a run deleted from the store: log a new one
                pass
    found = client.search_runs([experiment_id], filter_string=f"tags.run_dir = '{os.path.abspath(run_dir)}'",
                               max_results=1)
    return found[0].info.run_id if found else None


def log_run(client, experiment_id, uri, run_dir, result, tags):
    """Create or complete the MLflow run of one finished, evaluated run."""
    from mlflow.entities import Metric, Param, RunTag

    run_id = _find_run(client, experiment_id, run_dir, uri)
    own = run_id is not None and client.get_run(run_id).data.params  # params already logged (by train.py)
    if run_id is None:
        run_id = client.create_run(experiment_id, run_name=os.path.basename(os.path.normpath(run_dir))).info.run_id
    params = [] if own else [Param(k, str(v)[:6000]) for k, v in
                             flat_params(configs.config_to_dict(configs.load_run_config(run_dir))).items()]
    metrics = []
    for row in _epoch_rows(run_dir):
        step = int(_float(row.get("step")) or 0)
        for key, text in row.items():
            value = _float(text)
            if key not in ("epoch", "step") and value is not None:
                metrics.append(Metric(f"epoch/{key}", value, 0, step))
    final = {k: v for k, v in result.items() if _finite(v)}
    metrics += [Metric(f"final/{k}", float(v), 0, 0) for k, v in final.items()]
    all_tags = [RunTag(k, str(v)) for k, v in {**tags, "run_dir": os.path.abspath(run_dir)}.items() if v is not None]
    for start in range(0, len(metrics), 900):  # MLflow's log_batch takes at most 1000 metrics
        client.log_batch(run_id, metrics=metrics[start:start + 900])
    for start in range(0, len(params), 90):  # and 100 params
        client.log_batch(run_id, params=params[start:start + 90])
    client.log_batch(run_id, tags=all_tags)
    client.set_terminated(run_id)
    return run_id


def log_report(client, experiment_id, report_dir):
    found = client.search_runs([experiment_id], filter_string=f"tags.kind = '{REPORT_TAG}'", max_results=1)
    run_id = found[0].info.run_id if found else client.create_run(experiment_id, run_name=REPORT_TAG,
                                                                  tags={"kind": REPORT_TAG}).info.run_id
    for name in sorted(os.listdir(report_dir)):
        path = os.path.join(report_dir, name)
        if os.path.isfile(path) and not os.path.islink(path) and not name.startswith("."):
            client.log_artifact(run_id, path)
    client.set_terminated(run_id)
    return run_id


def log_comparison(runs, runs_dir, report_dir):
    """`runs`: [(run_dir, eval result dict, tags dict)] of the finished runs. -> (tracking URI, experiment)."""
    from mlflow.tracking import MlflowClient

    quiet_mlflow()
    uri, name = tracking_uri(runs_dir), experiment_name(runs_dir)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(name)
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(
        name, artifact_location=None if os.environ.get(MLFLOW_URI_ENV) else
        mlflow_artifacts_uri(runs_dir))
    for run_dir, result, tags in runs:
        log_run(client, experiment_id, uri, run_dir, result, tags)
    log_report(client, experiment_id, report_dir)
    return uri, name


def mlflow_artifacts_uri(runs_dir):
    """Artifacts beside the local store (RUNS_DIR/mlartifacts), not in the working directory."""
    return "file://" + os.path.abspath(os.path.join(runs_dir, "mlartifacts"))
