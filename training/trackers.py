"""Experiment trackers through Accelerate: `train.log_with` names them, Accelerate writes them.

train.log_with: auto (TensorBoard when it is installed, else none) | none | one of
configs.schema.TRACKER_NAMES | a list of them. Every tracker gets the resolved config as its parameters (dotted
keys), the train loss, lr and throughput at every log step, each epoch's row (`epoch/train_loss`, `epoch/lr`, ...)
and the val metrics of every evaluation. A named tracker whose package is missing, or is installed but does not
import, is one line naming the package (exit 2), never a silent skip or a traceback.

Where they write: TensorBoard to RUN_DIR/tensorboard/<name>/, the config as the HParams tab's hyperparameters of
that same run (not of a sub-run without metrics, as Accelerate's `store_init_configuration` writes them), with the
epoch train loss and the val top-1 / loss as its metrics; every session starts with a SessionLog START, so a
resumed run purges the steps logged after its checkpoint in every TensorBoard loader, and logs them again. MLflow
to MLFLOW_TRACKING_URI when set (a server, or any store MLflow takes), else to the SQLite store RUN_DIR/mlflow.db
(nothing to start: `mlflow ui --backend-store-uri sqlite:///RUN_DIR/mlflow.db`); its experiment is
MLFLOW_EXPERIMENT_NAME or the config's name, its run named by the run folder, its tags MLFLOW_TAGS (JSON), as
Accelerate reads them. The MLflow run's id is kept in RUN_DIR/trackers.json, so a resumed training goes on logging
into the same MLflow run (a new one, said in a line, when the store no longer holds it), where the points already
held past the checkpoint are not logged twice; a new experiment keeps its artifacts beside an SQLite store, never in
the current folder. The others (wandb, aim, comet_ml, clearml, dvclive) take their own environment variables.

Before the run touches anything (training/run_start.py), `check_stores` opens the MLflow store, waiting at most
STORE_WAIT_S for a server: a store it cannot use is one line naming it, the wait, and the ways out.
"""
import contextlib
import importlib
import importlib.util
import json
import logging
import os
import re
import socket
import threading
from urllib.parse import unquote, urlparse

from common import rundir
from common.errors import UserError
from common.io import read_json, write_json

MLFLOW_DB = "mlflow.db"
MLFLOW_URI_ENV = "MLFLOW_TRACKING_URI"
MLFLOW_EXPERIMENT_ENV = "MLFLOW_EXPERIMENT_NAME"
# The longest the check of a store waits (a server that is down, a hung file system): one line by then, not
# MLflow's minutes of HTTP retries nor the ~100 s its SQLAlchemy store retries a database server that is down.
STORE_WAIT_S = 10
# MLflow's own client settings during the check: one request, at most half the wait to connect and half to answer.
SERVER_CHECK = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": str(STORE_WAIT_S // 2)}
DATABASE_PORTS = {"postgresql": 5432, "mysql": 3306, "mariadb": 3306, "mssql": 1433}  # SQLAlchemy's backends
ARTIFACTS = "mlartifacts"  # an experiment's artifact folder beside its SQLite store (as `mlflow server` names it)
_SQLITE_HEADER = b"SQLite format 3\x00"
EPOCH_PREFIX = "epoch/"  # each epoch's epochs.csv row, as tracker metrics


def installed(name):
    if name == "tensorboard":  # Accelerate's TensorBoard tracker takes tensorboardX too
        return any(importlib.util.find_spec(p) is not None for p in ("tensorboard", "tensorboardX"))
    return importlib.util.find_spec(name) is not None  # each tracker's package has its name


def import_error(name):
    """Why the package of tracker `name` does not import (half-installed, a broken dependency), or None.
    TensorBoard: what Accelerate imports, torch's writer, else tensorboardX."""
    try:
        if name == "tensorboard":
            try:
                importlib.import_module("torch.utils.tensorboard")
            except ModuleNotFoundError:
                importlib.import_module("tensorboardX")
        else:
            importlib.import_module(name)
    except Exception as err:
        return f"{type(err).__name__}: {_first_line(err)}"
    return None


def tracker_names(log_with):
    """train.log_with (a name or a list of names, checked against TRACKER_NAMES by the config
    loader) -> the trackers to start, each package imported; UserError (one line) for a missing
    package or one that does not import."""
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
        why = import_error(name)
        if why:
            way_out = "set train.log_with=none" if len(given) == 1 else f"remove {name} from train.log_with"
            raise UserError(f"train.log_with: the {name} package is installed but does not import ({why}): "
                            f"reinstall it (pip install --force-reinstall {name}), or {way_out}")
    return names


def quiet_mlflow():
    """Import mlflow and keep its store's INFO lines ("Creating initial MLflow database tables...")
    out of the run's log (mlflow sets its loggers up when imported: quietened after that)."""
    import mlflow  # noqa: F401  (optional dependency: train.log_with=mlflow, the comparison's logging)

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


def epoch_metrics(row):
    """An epochs.csv row as tracker metrics (`epoch/train_loss`, ...): its numbers but the epoch and the step
    (the step is the log's step); the evaluation's numbers are logged as val_<weights>/<metric>."""
    return {f"{EPOCH_PREFIX}{k}": v for k, v in row.items()
            if k not in ("epoch", "step") and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _saved(run_dir):
    path = os.path.join(run_dir, rundir.TRACKERS)
    try:
        return read_json(path) if os.path.isfile(path) else {}
    except (OSError, ValueError):
        return {}


# ============================================================================ checking the MLflow store
def mlflow_uri(run_dir):
    """The store the run's MLflow tracker writes to: MLFLOW_TRACKING_URI, else RUN_DIR/mlflow.db."""
    return os.environ.get(MLFLOW_URI_ENV) or "sqlite:///" + os.path.abspath(os.path.join(run_dir, MLFLOW_DB))


def shown_uri(uri):
    """`uri` as a message may show it: a password in it (postgresql://user:SECRET@host/db) masked."""
    parts = urlparse(uri)
    if parts.password is None:
        return uri
    return uri.replace(f":{parts.password}@", ":***@", 1)


def _first_line(err):
    text = str(getattr(err, "orig", None) or err).strip()  # SQLAlchemy's errors: the driver's own words
    errno = re.search(r"\[Errno -?\d+\] ([^'\"()\\]+)", text)  # requests' connection errors: the OS's words
    if errno:
        return errno.group(1).strip()
    line = text.splitlines()[0] if text else type(err).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def _nearest_existing(path):
    path = os.path.abspath(path)
    while not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _folder_problem(folder):
    """Why files cannot be created in `folder` (MLflow makes the missing folders): the nearest existing one must
    be a writable folder."""
    found = _nearest_existing(folder)
    if not os.path.isdir(found):
        return f"{found} is a file, not a folder"
    if not os.access(found, os.W_OK | os.X_OK):  # as the file system answers (a read-only mount, permissions)
        return f"the folder {found} is read-only"
    return None


def _sqlite_problem(path):
    """Why an SQLite store at `path` cannot be used, looked at without opening it (an SQLite file that
    cannot be opened is retried by MLflow for minutes)."""
    if os.path.isdir(path):
        return f"{path} is a folder, not an SQLite database"
    if os.path.lexists(path):
        if not os.path.isfile(path):
            return f"{path} is not a regular file"
        with open(path, "rb") as f:
            header = f.read(len(_SQLITE_HEADER))
        if header and header != _SQLITE_HEADER:  # an empty file is a new database to SQLite
            return f"{path} is not an SQLite database"
        if not os.access(path, os.W_OK):
            return f"{path} is read-only"
    return _folder_problem(os.path.dirname(os.path.abspath(path)))


def _local_path(uri):
    """(kind, path) of a local store: ("sqlite", file), ("file", folder); (None, None) for a server or
    another database."""
    if uri.startswith("sqlite:"):
        from sqlalchemy.engine.url import make_url  # optional: mlflow's SQLite store (sqlalchemy, 0.3 s)

        database = make_url(uri).database
        return ("sqlite", None) if database in (None, "", ":memory:") else ("sqlite", database)
    if uri.startswith("file:"):
        return "file", unquote(urlparse(uri).path)
    if "://" not in uri and not uri.startswith(("databricks", "uc")):
        return "file", uri  # a plain path: MLflow's file store
    return None, None


def artifact_location(uri, fallback_dir):
    """Where a new experiment in the store `uri` keeps its artifacts: the store's own place, never the current
    folder (MLflow's ./mlruns). Beside an SQLite file (its folder's mlartifacts/); the store's own choice for a file
    store, a tracking server or Databricks (None); FALLBACK_DIR/mlartifacts for another database, which has no
    place of its own."""
    kind, path = _local_path(uri)
    if kind == "file" or (kind is None and (uri.startswith(("http:", "https:", "databricks", "uc")))):
        return None
    folder = os.path.dirname(os.path.abspath(path)) if kind == "sqlite" and path else fallback_dir
    return "file://" + os.path.join(os.path.abspath(folder), ARTIFACTS)


@contextlib.contextmanager
def _short_server_timeouts():
    saved = {k: os.environ.get(k) for k in SERVER_CHECK}
    os.environ.update(SERVER_CHECK)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class _Unreachable(Exception):
    """The database server of a store refused or did not take a plain connection."""


def _reach_database(uri):
    """A database server (postgresql://, mysql://, ...) is reached once with a plain connection before MLflow opens
    it: MLflow's SQLAlchemy store retries a server that is down for about 100 s, whatever the wait allows."""
    from sqlalchemy.engine.url import make_url  # optional dependency: MLflow's, imported with it

    try:
        url = make_url(uri)
    except Exception:  # not a URL SQLAlchemy reads: MLflow's own words come next
        return
    port = url.port or DATABASE_PORTS.get(url.get_backend_name())
    if not url.host or not port:  # a local socket
        return
    try:
        socket.create_connection((url.host, port), timeout=STORE_WAIT_S / 2).close()
    except OSError as err:
        raise _Unreachable(f"the database server {url.host}:{port}", err) from None


def _within(seconds, call):
    """call() waited for at most `seconds` (in a daemon thread, left behind when it hangs: the caller gives the
    store up in one line) -> (its result, the exception it raised or TimeoutError)."""
    outcome = {"error": TimeoutError()}

    def target():
        try:
            outcome.update(result=call(), error=None)
        except Exception as err:  # reported by the caller, in one line
            outcome["error"] = err

    thread = threading.Thread(target=target, name="mlflow-store-check", daemon=True)
    thread.start()
    thread.join(seconds)
    return outcome.get("result"), outcome["error"]


def open_mlflow_store(uri):
    """-> (MlflowClient of `uri` or None, why it cannot be used or None). A local store is looked at first and
    opened only when it exists (a new one is made by the run itself); a server is asked once; the answer comes
    within STORE_WAIT_S, which the line states."""
    kind, path = _local_path(uri)
    if kind == "sqlite" and path is not None:
        problem = _sqlite_problem(path)
        if problem or not os.path.exists(path):
            return None, problem
    elif kind == "file":
        if os.path.lexists(path) and not os.path.isdir(path):
            return None, f"{path} is a file, not an MLflow file store (a folder)"
        problem = _folder_problem(path)
        if problem or not os.path.exists(path):
            return None, problem
    quiet_mlflow()
    from mlflow.tracking import MlflowClient  # optional dependency (train.log_with=mlflow, the comparison)

    server = uri.startswith(("http:", "https:"))

    def open_and_ask():
        if kind is None and not server and "://" in uri:
            _reach_database(uri)
        client = MlflowClient(tracking_uri=uri)  # a database store connects (and retries) here
        client.search_experiments(max_results=1)
        return client

    with _short_server_timeouts():
        client, err = _within(STORE_WAIT_S, open_and_ask)
    if err is None:
        return client, None
    what = "the MLflow server" if server else "it"
    if isinstance(err, _Unreachable):
        return None, f"cannot reach {err.args[0]} within {STORE_WAIT_S} s ({_first_line(err.args[1])})"
    if isinstance(err, TimeoutError) or "timed out" in str(err):  # ours, or requests' read timeout
        return None, f"no answer from {what} within {STORE_WAIT_S} s"
    if server:
        return None, f"cannot reach the MLflow server within {STORE_WAIT_S} s ({_first_line(err)})"
    return None, f"cannot open it ({_first_line(err)})"


def check_stores(names, cfg, resuming, say):
    """Main process, under the run lock, before anything in the run directory changes: open the MLflow store
    (`open_mlflow_store`); a store it cannot use, or an experiment of the run's name that was deleted there, is
    one line (UserError). -> {"mlflow_run_id": the MLflow run a resumed training goes on in, or None}."""
    if "mlflow" not in names:
        return {}
    run_dir = cfg.train.output_dir
    uri = mlflow_uri(run_dir)
    drop = "train.log_with=none" if list(names) == ["mlflow"] else "remove mlflow from train.log_with"
    default = not os.environ.get(MLFLOW_URI_ENV)
    client, problem = open_mlflow_store(uri)
    if problem:
        move = f"move {os.path.join(run_dir, MLFLOW_DB)} away (a new store is made there), " if default else ""
        raise UserError(f"train.log_with=mlflow cannot use the MLflow store {shown_uri(uri)}: {problem}; {move}set "
                        f"{MLFLOW_URI_ENV} to another store, or {drop}")
    name = os.environ.get(MLFLOW_EXPERIMENT_ENV) or cfg.name
    experiment = client.get_experiment_by_name(name) if client is not None else None  # None: a new local store
    if experiment is not None and experiment.lifecycle_stage == "deleted":
        raise UserError(f"the MLflow experiment '{name}' in {shown_uri(uri)} was deleted, and MLflow keeps a deleted "
                        f"experiment's name: restore it (mlflow experiments restore --experiment-id "
                        f"{experiment.experiment_id}), set {MLFLOW_EXPERIMENT_ENV} to another name, or {drop}")
    return {"mlflow_run_id": _resumed_run(client, run_dir, uri, say) if resuming else None}


def _resumed_run(client, run_dir, uri, say):
    """The MLflow run of trackers.json when the store (None: a new one) still holds it, else None, said in a line."""
    run_id = _saved(run_dir).get("mlflow_run_id")
    if not run_id:
        return None
    run = _get_run(client, run_id, uri) if client is not None else None
    if run is None or run.info.lifecycle_stage == "deleted":
        say(f"note: the MLflow run {run_id} of this training is not in {shown_uri(uri)} (deleted, or another "
            f"store): the resumed training logs into a new MLflow run")
        return None
    return run_id


def _get_run(client, run_id, uri):
    from mlflow.exceptions import MlflowException  # optional dependency (train.log_with=mlflow)

    try:
        return client.get_run(run_id)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":  # not found: the store was replaced, or the run purged
            raise UserError(f"train.log_with=mlflow cannot read the MLflow run {run_id} of this training in "
                            f"{shown_uri(uri)} ({_first_line(err)})") from None
        return None


# ============================================================================ starting them
def _use_mlflow_store(uri):
    """Point MLflow's client at `uri` for this run, leaving MLFLOW_TRACKING_URI as the user set it (mlflow's
    set_tracking_uri also exports it, which would send the next run of this process to this run's store)."""
    import mlflow  # optional dependency (train.log_with=mlflow)

    before = os.environ.get(MLFLOW_URI_ENV)
    mlflow.set_tracking_uri(uri)
    if before is None:
        os.environ.pop(MLFLOW_URI_ENV, None)
    else:
        os.environ[MLFLOW_URI_ENV] = before


def hparams_metrics(cfg):
    """The scalars the TensorBoard HParams tab shows beside the config: the epoch train loss, the val top-1 and
    loss of each evaluated weights (tags as training/loop.py logs them)."""
    weights = ["raw"] + (["ema"] if cfg.train.ema else [])
    return [f"{EPOCH_PREFIX}train_loss"] + [f"val_{w}/{m}" for w in weights for m in ("top1", "loss")]


def write_tensorboard_hparams(writer, params, metrics):
    """The config as the hyperparameters of the writer's own run, with `metrics` (scalar tags of that run) as
    the HParams tab's metrics: the summaries SummaryWriter.add_hparams writes, without its sub-run."""
    try:
        from torch.utils.tensorboard.summary import hparams  # optional dependency: torch's writer needs tensorboard
    except ModuleNotFoundError:
        from tensorboardX.summary import hparams  # optional dependency: the other writer
    for summary in hparams(params, dict.fromkeys(metrics, 0.0)):
        writer.file_writer.add_summary(summary)
    writer.flush()


def _has_events(folder):
    return os.path.isdir(folder) and any(n.startswith("events.out.tfevents") for n in os.listdir(folder))


def write_session_start(writer, step):
    """A SessionLog START event at `step`. TensorBoard's loaders drop the run's events at or after the step of a
    START that is not the run's first: the steps a killed session logged past its checkpoint, which the resumed
    session logs again. The Python loader (--load_fast=false) takes a run's first START as its beginning and
    purges nothing for it, so every session writes one: a new run at step 0; a resumed one at its purge step, after
    SummaryWriter's own (which is the first of a run begun before its sessions wrote one)."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog  # optional dependency, as torch's writer
    except ModuleNotFoundError:
        from tensorboardX.proto.event_pb2 import Event, SessionLog  # optional dependency: the other writer
    writer.file_writer.add_event(Event(session_log=SessionLog(status=SessionLog.START)), step=step)
    writer.flush()


def skip_logged_points(tracker, run_id, after_step):
    """A resumed MLflow run: the points its killed session logged after the checkpoint's step are not logged again
    (MLflow cannot delete a point; the first one logged at a step stays, one per step)."""
    from mlflow.tracking import MlflowClient  # optional dependency (train.log_with=mlflow)

    client = MlflowClient()  # the run's store (_use_mlflow_store)
    held = {(key, m.step) for key in client.get_run(run_id).data.metrics
            for m in client.get_metric_history(run_id, key) if m.step > after_step}
    if not held:
        return
    log = tracker.log

    def log_new(values, step=None, **kwargs):
        new = {k: v for k, v in values.items() if (k, step) not in held}
        if new:
            log(new, step=step, **kwargs)

    tracker.log = log_new


def start(accelerator, names, cfg, params, resumed_step=None, mlflow_run_id=None):
    """init_trackers for `names` (main process logs; the others do nothing), with the config as parameters.
    `resumed_step`: the checkpoint's step when resuming (the later steps are logged again: TensorBoard purges them,
    MLflow keeps the points it holds, `skip_logged_points`); `mlflow_run_id`: the MLflow run to go on in
    (check_stores). A new MLflow experiment keeps its artifacts in the store's place (`artifact_location`)."""
    if not names:
        return
    run_dir = cfg.train.output_dir
    tb_run = os.path.join(tensorboard_dir(run_dir), cfg.name)
    tb_fresh = not (resumed_step is not None and _has_events(tb_run))  # hparams: once per TensorBoard run
    init_kwargs = {}
    if "mlflow" in names:
        quiet_mlflow()
        _use_mlflow_store(mlflow_uri(run_dir))
        init_kwargs["mlflow"] = {"run_name": os.path.basename(os.path.normpath(run_dir)),  # siblings: told apart
                                 "logging_dir": artifact_location(mlflow_uri(run_dir), run_dir),
                                 **({"run_id": mlflow_run_id} if mlflow_run_id else {})}
    if "tensorboard" in names and resumed_step is not None:
        init_kwargs["tensorboard"] = {"purge_step": resumed_step + 1}
    accelerator.init_trackers(cfg.name, config=None, init_kwargs=init_kwargs)
    for tracker in accelerator.trackers:
        if tracker.name == "tensorboard":
            if accelerator.is_main_process:
                write_session_start(tracker.writer, 0 if resumed_step is None else resumed_step + 1)
                if tb_fresh:
                    write_tensorboard_hparams(tracker.writer, params, hparams_metrics(cfg))
        elif tracker.name == "mlflow" and mlflow_run_id:  # a resume (MLflow refuses a parameter logged twice)
            if accelerator.is_main_process:
                skip_logged_points(tracker, mlflow_run_id, resumed_step)
        else:
            tracker.store_init_configuration(params)
    if "mlflow" in names and accelerator.is_main_process:
        run = accelerator.get_tracker("mlflow", unwrap=True)
        write_json({"mlflow_run_id": run.info.run_id, MLFLOW_URI_ENV: mlflow_uri(run_dir)},
                   os.path.join(run_dir, rundir.TRACKERS))
