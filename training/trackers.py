"""Experiment trackers through Accelerate: `train.log_with` names them, Accelerate writes them.

train.log_with: auto (TensorBoard when it is installed, else none) | none | one of
configs.schema.TRACKER_NAMES | a list of them. Every tracker gets the resolved config as its parameters (dotted keys), the train loss, lr
and throughput at every log step and the val metrics of every evaluation. A named tracker whose
package is missing is one line naming the package (exit 2), never a silent skip.

Where they write: TensorBoard to RUN_DIR/tensorboard/<name>/; MLflow to MLFLOW_TRACKING_URI when set
(a server, or a local store of a whole comparison: scripts/compare_heads.py sets one), else to the
SQLite store RUN_DIR/mlflow.db (nothing to start: `mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db`);
its experiment is MLFLOW_EXPERIMENT_NAME or the run's name, its tags MLFLOW_TAGS (JSON), as
Accelerate reads them. The MLflow run's id is kept in RUN_DIR/trackers.json, so a resumed training
goes on logging into the same MLflow run. The others (wandb, aim, comet_ml, clearml, dvclive) take
their own environment variables.
"""
import importlib.util
import json
import logging
import os

from common import rundir
from common.errors import UserError
from common.io import read_json, write_json

MLFLOW_DB = "mlflow.db"
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"


def installed(name):
    if name == "tensorboard":  # Accelerate's TensorBoard tracker takes tensorboardX too
        return any(importlib.util.find_spec(p) is not None for p in ("tensorboard", "tensorboardX"))
    return importlib.util.find_spec(name) is not None  # each tracker's package has its name


def tracker_names(log_with):
    """train.log_with (a name or a list of names, checked against TRACKER_NAMES by the config
    loader) -> the trackers to start; UserError (one line) for a missing package."""
    given = [log_with] if isinstance(log_with, str) else list(log_with)
    names = []
    for name in given:
        if name in ("auto", "none") and len(given) > 1:
            raise UserError(f"train.log_with={name} cannot be combined with other trackers; give a list of "
                            f"tracker names only")
        if name == "auto":
            names += ["tensorboard"] if installed("tensorboard") else []
        elif name != "none" and name not in names:
            names.append(name)
    for name in names:
        if not installed(name):
            raise UserError(f"train.log_with={name} needs the {name} package, which is not installed: "
                            f"pip install {name}, or remove {name} from train.log_with")
    return names


def quiet_mlflow():
    """Import mlflow and keep its store's INFO lines ("Creating initial MLflow database tables...")
    out of the run's log (mlflow sets its loggers up when imported: quietened after that)."""
    import mlflow  # noqa: F401

    for name in ("alembic", "mlflow"):
        logging.getLogger(name).setLevel(logging.WARNING)


def tensorboard_dir(run_dir):
    """Accelerate writes TensorBoard to LOGGING_DIR/<project name>; this is LOGGING_DIR."""
    return os.path.join(run_dir, rundir.TENSORBOARD)


def flat_params(tree, prefix=""):
    """The config as tracker parameters: dotted keys, scalar values (lists and null as text)."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_params(value, name + "."))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = json.dumps(value)
    return out


def _saved(run_dir):
    path = os.path.join(run_dir, rundir.TRACKERS)
    try:
        return read_json(path) if os.path.isfile(path) else {}
    except (OSError, ValueError):
        return {}


def start(accelerator, names, cfg, params, resuming):
    """init_trackers for `names` (main process logs; the others do nothing), with the config as
    parameters; a resumed run continues its MLflow run."""
    if not names:
        return
    run_dir = cfg.train.output_dir
    init_kwargs = {}
    if "mlflow" in names:
        os.environ.setdefault(MLFLOW_URI_ENV, "sqlite:///" + os.path.abspath(os.path.join(run_dir, MLFLOW_DB)))
        quiet_mlflow()
        mlflow_kwargs = {"run_name": cfg.name}
        run_id = _saved(run_dir).get("mlflow_run_id") if resuming else None
        if run_id:
            mlflow_kwargs["run_id"] = run_id
        init_kwargs["mlflow"] = mlflow_kwargs
    if resuming and init_kwargs.get("mlflow", {}).get("run_id"):
        params = None  # logged when the run started; MLflow refuses a parameter logged twice with another value
    accelerator.init_trackers(cfg.name, config=params, init_kwargs=init_kwargs)
    if "mlflow" in names and accelerator.is_main_process:
        run = accelerator.get_tracker("mlflow", unwrap=True)
        write_json({"mlflow_run_id": run.info.run_id, MLFLOW_URI_ENV: os.environ[MLFLOW_URI_ENV]},
                   os.path.join(run_dir, rundir.TRACKERS))
