"""compare_heads --tune's Optuna storage: --storage opened or refused in one line, with Optuna's
heartbeat and retry of the trials whose worker is gone.

    sqlite:///PATH (default RUNS_DIR/tune/studies.db), any SQLAlchemy URL (postgresql://..., mysql://...):
        Optuna's RDBStorage with heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S and its retry
        callback (a stale trial is failed and queued again with its settings and user attributes);
    journal:PATH: Optuna's JournalStorage on a JournalFileBackend (its own file lock), for a shared
        filesystem where SQLite is not safe and no database server runs.

What Optuna lacks, added here (one line each):
- JournalStorage has no heartbeat: JournalHeartbeatStorage adds RDBStorage's (a trial system attribute).
- The heartbeat sees a lost worker GRACE_S late: a trial whose process on this host is gone is retried at once.
- optimize() fails a trial stopped by a signal and Optuna retries stale trials only: `retry` queues it again.
- Processes creating the RDB schema at once race (IntegrityError on alembic_version, 'table already exists'):
  a SQLite study is opened under an flock (in the temporary folder), and the open is retried.
"""
import contextlib
import inspect
import os
import time
import warnings

import optuna
import sqlalchemy
from optuna.storages import journal
from optuna.storages._heartbeat import BaseHeartbeat  # what RDBStorage implements; Optuna exports no other
from sqlalchemy.engine import make_url

from common.errors import UserError
from common.runlock import process_record, stale_reason
from comparison.storage_url import check_url, schema_lock, sqlite_path

HEARTBEAT_S = 60  # a running trial's heartbeat, written by optimize()'s heartbeat thread
GRACE_S = 600  # no heartbeat this long: the trial's worker is taken as lost (another host, a lost node)
MAX_RETRY = 3  # a trial lost this often is not queued again (it kills its worker every time)
OPEN_TRIES = 5  # opening an RDB storage whose schema another process is creating
OWNER = "tune.owner"  # a trial's process: common.runlock.process_record() and the trial's number
BEAT = "tune:heartbeat"  # a journal trial's heartbeat system attribute: [trial id, time]


@contextlib.contextmanager
def quiet():
    """Without Optuna's warnings that the heartbeat and the retry are experimental (and renamed)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def default_storage(tune_dir):
    return "sqlite:///" + os.path.abspath(os.path.join(tune_dir, "studies.db"))


def retry_callback(max_retry):
    """Optuna's retry of failed trials: a WAITING copy (params, user attributes; its system attributes
    name the first trial it retries)."""
    retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)  # Optuna >= 4.9's name
    with quiet():
        return (retry or optuna.storages.RetryFailedTrialCallback)(max_retry=max_retry)


RETRY = retry_callback(MAX_RETRY)
RESUME = retry_callback(None)  # a trial stopped by a signal (a preemption) is queued again however often


def retry_history(trial):
    """The numbers of the trials `trial` (a FrozenTrial) retries, the first one first ([] for none)."""
    with quiet():
        return RETRY.retry_history(trial)


# ------------------------------------------------------------------------------------------- opening
def open_storage(url):
    """The Optuna storage of --storage URL; a URL that cannot be used: one line (UserError), nothing
    created or changed."""
    check_url(url)
    if url.startswith("journal:"):
        return _journal(url, os.path.abspath(url[len("journal:"):]))
    path = sqlite_path(url)
    if path is not None:
        _check_folder(url, os.path.dirname(path), create=True)
        if os.path.isfile(path) and not _writable(path):
            raise UserError(f"--storage {url}: {path} is read-only; make it writable or give another file")
    with schema_lock(path):
        return _rdb(url)


def _rdb(url):
    shown = _shown(url)
    kwargs = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}
    for attempt in range(OPEN_TRIES):
        try:
            with quiet():
                return optuna.storages.RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=HEARTBEAT_S,
                                                  grace_period=GRACE_S, **{_callback_keyword(): RETRY})
        except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.OperationalError) as err:
            # another process created the schema at this moment (it is there now), or held the file a moment
            if isinstance(err, sqlalchemy.exc.OperationalError) and not _schema_race(err):
                raise UserError(f"--storage {shown}: {_first_line(err)}; {_fix(url)}") from None
            if attempt == OPEN_TRIES - 1:
                raise UserError(f"--storage {shown}: the schema could not be created (other processes kept "
                                f"creating it); run again") from None
            time.sleep(0.2 * (attempt + 1))
        except Exception as err:  # SQLAlchemy's and the drivers' (missing driver, refused connection, not a database)
            raise UserError(f"--storage {shown}: {_first_line(err)}; {_fix(url)}") from None


def _schema_race(err):
    text = str(err).lower()
    return "already exists" in text or "database is locked" in text


def _fix(url):
    return "give another file, or move this one away" if url.startswith("sqlite") else \
        "check the URL, that the server accepts connections and that its Python driver is installed"


def _callback_keyword():
    params = inspect.signature(optuna.storages.RDBStorage).parameters
    return "heartbeat_stale_trial_callback" if "heartbeat_stale_trial_callback" in params else "failed_trial_callback"


def _journal(url, path):
    _check_folder(url, os.path.dirname(path), create=False)
    if os.path.isfile(path) and not _writable(path):
        raise UserError(f"--storage {url}: {path} is read-only; make it writable or give another file")
    backend = getattr(journal, "JournalFileBackend", None) or optuna.storages.JournalFileStorage  # Optuna < 4.0
    existed = os.path.exists(path)
    try:
        return JournalHeartbeatStorage(backend(path))
    except UserError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as err:  # JSONDecodeError is a ValueError
        raise UserError(f"--storage {url}: {path} is not an Optuna journal ({_first_line(err)}); give another "
                        f"file, or move this one away") from None
    except OSError as err:
        if not existed:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise UserError(f"--storage {url}: cannot use {path} ({_first_line(err)})") from None


def _check_folder(url, folder, create):
    """The folder of a storage file: an existing, writable folder (`create`: or one that can be made
    under one, made now, after the checks)."""
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UserError(f"--storage {url}: {existing} is a file, not a folder; give a path in a folder")
    if existing != folder and not create:
        raise UserError(f"--storage {url}: the folder {folder} does not exist; create it or choose another path")
    if not _writable(existing):
        raise UserError(f"--storage {url}: the folder {existing} is read-only; give a path in a writable folder")
    os.makedirs(folder, exist_ok=True)


def _writable(path):
    """Whether this process can write `path` (a folder: by creating a file there; os.access answers
    yes to root on a read-only mount)."""
    if os.path.isdir(path):
        probe = os.path.join(path, f".tune-write-check-{os.getpid()}")
        try:
            os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except OSError:
            return False
        os.remove(probe)
        return True
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError:
        return False
    return True


def _shown(url):
    """The URL as a message may show it: without its password."""
    with contextlib.suppress(Exception):
        return make_url(url).render_as_string(hide_password=True)
    return url


def _first_line(err):
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0][:300]}" if text else type(err).__name__


# ------------------------------------------------------------------------------- the journal's heartbeat
class JournalHeartbeatStorage(optuna.storages.JournalStorage, BaseHeartbeat):
    """Optuna's JournalStorage with the heartbeat of its RDBStorage: each beat is a system attribute
    [trial id, time] of the running trial (a retried trial's copy of its original's beat is not its own)."""

    def record_heartbeat(self, trial_id):
        self.set_trial_system_attr(trial_id, BEAT, [trial_id, time.time()])

    def _get_stale_trial_ids(self, study_id):
        now, stale = time.time(), []
        for t in self.get_all_trials(study_id, deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            beat = t.system_attrs.get(BEAT)
            last = beat[1] if beat and beat[0] == t._trial_id else t.datetime_start.timestamp()
            if now - last > GRACE_S:
                stale.append(t._trial_id)
        return stale

    def get_heartbeat_interval(self):
        return HEARTBEAT_S

    def get_heartbeat_stale_trial_callback(self):
        return RETRY

    get_failed_trial_callback = get_heartbeat_stale_trial_callback  # Optuna < 4.9's name


# ------------------------------------------------------------------------------------ lost trials
def claim(trial):
    """Record this process as the owner of `trial` (an optuna Trial), for `reclaim_dead`."""
    trial.set_user_attr(OWNER, {**process_record(), "trial": trial.number})


def reclaim_dead(study):
    """Fail and retry the running trials whose owner process on this host is gone: Optuna's heartbeat
    would see it only GRACE_S later. -> the numbers of the trials retried."""
    retried = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owner = _owner(t)
        if owner is not None and stale_reason(owner) is not None and retry(study, t):
            retried.append(t.number)
    return retried


def _owner(trial):
    """The record of the process running `trial`, None where unknown: a retry carries its original's
    record until it is claimed (a record without the trial's number: written before it was kept)."""
    owner = trial.user_attrs.get(OWNER)
    if not owner:
        return None
    number = owner.get("trial", None if retry_history(trial) else trial.number)
    return owner if number == trial.number else None


def retry(study, trial, callback=RETRY):
    """Fail `trial` (a FrozenTrial) if it still runs, then queue its retry; False if another process
    finished or failed it first."""
    if trial.state == optuna.trial.TrialState.RUNNING:
        try:
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
        except (RuntimeError, ValueError):  # optuna's UpdateFinishedTrialError: another process was first
            return False
    with quiet():
        callback(study, trial)
    return True


def fail_stale(study):
    """Optuna's fail_stale_trials (optimize() runs it before each trial; a waiting worker runs it too)."""
    with quiet():
        optuna.storages.fail_stale_trials(study)
