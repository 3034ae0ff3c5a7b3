"""--storage's URL checked before anything is read or created (compare_heads answers a mistyped one before
torch and Optuna load; comparison/tuning_storage.py opens it), and the lock a new SQLite study is made under."""
import contextlib
import hashlib
import os
import tempfile

try:
    import fcntl  # POSIX: the lock around a new SQLite study's schema
except ImportError:  # Windows: the retries alone
    fcntl = None

from common.errors import UserError

MEMORY = ("sqlite://", "sqlite:///:memory:")
URL_HELP = "use sqlite:///PATH, an SQLAlchemy URL (postgresql://...), or journal:PATH (a file on a shared filesystem)"


def check_url(url):
    """The checks --storage passes before anything is read or created (cli.py calls it at parse time)."""
    if url.startswith("journal:"):
        path = url[len("journal:"):]
        if not path:
            raise UserError(f"--storage {url}: journal: needs a file, e.g. journal:/shared/compare/tune.journal")
        if os.path.isdir(path):
            raise UserError(f"--storage {url}: {path} is a folder; name a file in it, e.g. "
                            f"journal:{os.path.join(path, 'tune.journal')}")
        return
    if "://" not in url:
        raise UserError(f"--storage {url}: not a storage URL; {URL_HELP}")
    if url.split("?")[0] in MEMORY or "mode=memory" in url:
        raise UserError(f"--storage {url}: an in-memory database vanishes when this process exits and no other "
                        f"process can share it; give a file, sqlite:///PATH")
    path = sqlite_path(url)
    if path is not None and os.path.isdir(path):
        raise UserError(f"--storage {url}: {path} is a folder; name a database file in it, e.g. "
                        f"sqlite:///{os.path.join(path, 'studies.db')}")
    if path is not None and _empty(path):  # SQLite would make it a new database, its studies gone
        raise UserError(f"--storage {url}: {path} is empty (0 bytes), not an Optuna database: its studies were lost "
                        f"or it was never one; delete it to start new studies, or give the database that holds them")


def _empty(path):
    """A study file of 0 bytes, as no worker is making it now (one that is holds schema_lock while it is empty)."""
    if not (os.path.isfile(path) and os.path.getsize(path) == 0):
        return False
    with schema_lock(path):
        return os.path.isfile(path) and os.path.getsize(path) == 0


@contextlib.contextmanager
def schema_lock(path):
    """One process at a time opens a new SQLite study file: RDBStorage creates (or migrates) its schema on
    open, and several workers started at once raced there ('table already exists', IntegrityError on
    alembic_version). An flock on a file in the temporary folder named by the path's hash, so nothing
    is added beside the study (SQLite is for one host: a shared filesystem takes journal:PATH); other
    databases rely on the retries in tuning_storage._rdb."""
    if path is None or fcntl is None:
        yield
        return
    name = hashlib.sha256(os.path.realpath(path).encode()).hexdigest()[:16]
    with open(os.path.join(tempfile.gettempdir(), f"optuna-schema-{name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def sqlite_path(url):
    """The file of an sqlite:///PATH URL (None for other URLs)."""
    if not url.startswith("sqlite:///"):
        return None
    return os.path.abspath(url[len("sqlite:///"):].split("?")[0])
