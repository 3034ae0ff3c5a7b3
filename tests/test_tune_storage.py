"""compare_heads --tune --storage (comparison/tuning_storage.py): every storage that cannot be used is
one line (`error: --storage ...`) and exit 2, with nothing created or changed; the journal gets
Optuna's heartbeat and retry like the SQL storages."""
import os
import subprocess
import sys
import time

import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from other_user import as_nobody, skip_unless_nobody_can_run_python  # noqa: E402
from test_tune import CONFIG, ROOT  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("cfg.yaml", "w") as f:
        yaml.safe_dump(CONFIG, f)
    with open("a_file", "w") as f:
        f.write("not a folder\n")
    with open("garbage.journal", "w") as f:
        f.write('this is no JSON\n{"op_code": 0}\n')
    with open("not_a.db", "wb") as f:
        f.write(b"this is not an SQLite database, only some text that is long enough" * 20)
    os.mkdir("a_folder")
    open("empty.db", "wb").close()  # a study database cut to nothing: SQLite would make a new one of it
    return tmp_path


def _tree(root):
    return {os.path.join(d, n): os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(root) for n in names}


def _refused(storage, capsys):
    """-> the one line compare_heads --tune --storage `storage` exits 2 with, having changed nothing."""
    import compare_heads
    from common.cli import run_cli

    before = _tree(".")
    with pytest.raises(SystemExit) as exit_:
        run_cli(compare_heads.main, ["--config", "cfg.yaml", "--tune", "--tune-only", "--runs-dir", "runs",
                                     "--no-mlflow", "--storage", storage])
    out = capsys.readouterr()
    assert exit_.value.code == 2 and "Traceback" not in out.err + out.out
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --storage ") and len(lines[0]) < 400, out.err
    assert _tree(".") == before  # nothing created, nothing changed
    return lines[0]


@pytest.mark.parametrize("storage, says", [
    ("journal:garbage.journal", "is not an Optuna journal (JSONDecodeError"),
    ("journal:a_folder", "a_folder is a folder; name a file in it, e.g. journal:a_folder/tune.journal"),
    ("journal:", "journal: needs a file"),
    ("journal:no/such/folder/t.journal", "the folder"),
    ("journal:a_file/t.journal", "a_file is a file, not a folder"),
    ("sqlite:///a_file/s.db", "a_file is a file, not a folder"),
    ("sqlite:///a_folder", "is a folder; name a database file in it"),
    ("sqlite://", "an in-memory database vanishes when this process exits"),
    ("sqlite:///:memory:", "an in-memory database vanishes"),
    ("sqlite:///not_a.db", "file is not a database"),
    ("sqlite:///empty.db", "empty.db is empty (0 bytes), not an Optuna database"),
    ("runs/studies.db", "not a storage URL; use sqlite:///PATH"),
    ("nosuchdialect://host/db", "NoSuchModuleError"),
    ("postgresql://tune:secret@127.0.0.1:9/tune", "postgresql://tune:***@127.0.0.1:9/tune: "),  # no driver, or refused
])
def test_a_bad_storage_is_one_line_and_exit_2_with_nothing_changed(sandbox, capsys, storage, says):
    line = _refused(storage, capsys)
    assert says in line and "secret" not in line, line


def test_a_zero_byte_default_storage_is_refused_before_anything_is_written(sandbox, capsys):
    """RUNS_DIR/tune/studies.db (no --storage) cut to 0 bytes: refused before the MLflow store, the trial folders
    or the database itself are touched."""
    import compare_heads
    from common.cli import run_cli

    os.makedirs(os.path.join("runs", "tune"))
    open(os.path.join("runs", "tune", "studies.db"), "wb").close()
    before = _tree(".")
    with pytest.raises(SystemExit) as exit_:
        run_cli(compare_heads.main, ["--config", "cfg.yaml", "--tune", "--tune-only", "--runs-dir", "runs"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert lines[0].endswith("runs/tune/studies.db is empty (0 bytes), not an Optuna database: its studies were lost "
                             "or it was never one; delete it to start new studies, or give the database that holds "
                             "them"), lines[0]
    assert _tree(".") == before


def test_a_server_that_refuses_is_one_line(sandbox, capsys):
    """A real refusal needs a driver (none is a dependency): the one installed, else skipped (the missing
    driver's line is tested above)."""
    pytest.importorskip("pymysql")
    line = _refused("mysql+pymysql://tune@127.0.0.1:9/tune", capsys)
    assert "OperationalError" in line and "Connection refused" in line, line


PROBE = """
import sys
sys.path.insert(0, {root!r})
from common.errors import UserError
from comparison.tuning_storage import open_storage
for url in sys.argv[1:]:
    try:
        open_storage(url)
        print("opened", url)
    except UserError as err:
        print(err)
"""


def test_a_read_only_folder_or_file_is_one_line(tmp_path):
    """Probed by writing (root passes os.access on a read-only folder, so as root the probe runs as nobody:
    skipped, saying why, where nobody cannot reach this Python or the project)."""
    import tempfile

    if os.geteuid() == 0:
        skip_unless_nobody_can_run_python(ROOT, ["optuna", "sqlalchemy"])  # what PROBE imports
    base = tempfile.mkdtemp(dir="/tmp")  # world-traversable, unlike pytest's tmp_path under root
    try:
        ro = os.path.join(base, "ro")
        os.makedirs(ro)
        with open(os.path.join(ro, "old.db"), "wb") as f:
            f.write(b"an old study database")  # (not empty: an empty one is refused as such, read-only or not)
        os.chmod(os.path.join(ro, "old.db"), 0o444)
        os.chmod(ro, 0o555)
        os.chmod(base, 0o755)
        user = as_nobody if os.geteuid() == 0 else None
        urls = [f"sqlite:///{ro}/s.db", f"journal:{ro}/t.journal", f"sqlite:///{ro}/sub/s.db", f"sqlite:///{ro}/old.db"]
        out = subprocess.run([sys.executable, "-c", PROBE.format(root=ROOT), *urls], preexec_fn=user, cwd=base,
                             capture_output=True, text=True, timeout=120)
        lines = out.stdout.strip().splitlines()
        assert len(lines) == 4 and "Traceback" not in out.stderr, out.stdout + out.stderr
        for line, url in zip(lines, urls):
            assert line.startswith(f"--storage {url}: ") and "read-only" in line, line
        assert sorted(os.listdir(ro)) == ["old.db"]
    finally:
        os.chmod(os.path.join(base, "ro"), 0o755)
        subprocess.run(["rm", "-rf", base])


def test_the_journal_has_optunas_heartbeat_and_retries_a_silent_trial(tmp_path, monkeypatch):
    """JournalHeartbeatStorage: optimize()'s heartbeat thread beats; a running trial silent for GRACE_S is
    failed by Optuna's fail_stale_trials and retried with its settings by the retry callback."""
    import optuna

    from comparison import tuning_storage

    storage = tuning_storage.open_storage(f"journal:{tmp_path}/t.journal")
    study = optuna.create_study(study_name="s", storage=storage)
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    beat = study.trials[0].system_attrs[tuning_storage.BEAT]
    assert beat[0] == study.trials[0]._trial_id and abs(beat[1] - time.time()) < 60
    with pytest.warns(UserWarning, match="Heartbeat"):  # a trial left running, as by a killed worker
        lost = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    tuning_storage.fail_stale(study)
    assert study.trials[1].state.name == "RUNNING"  # its grace is not over
    monkeypatch.setattr(tuning_storage, "GRACE_S", -1)
    tuning_storage.fail_stale(study)
    trials = optuna.load_study(study_name="s", storage=tuning_storage.open_storage(f"journal:{tmp_path}/t.journal")
                               ).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "WAITING"]
    assert trials[2].params == {"x": lost.params["x"]} and trials[2].system_attrs["failed_trial"] == 1


def test_trial_lines_show_settings_to_four_significant_digits():
    from comparison.tuning import as_overrides, shown_settings

    params = {"optim.lr": 0.0024407638958535128, "optim.weight_decay": 0.05, "head.k": 3}
    assert shown_settings(params) == "head.k=3, optim.lr=0.002441, optim.weight_decay=0.05"
    assert "optim.lr=0.0024407638958535128" in as_overrides(params)  # the trial itself keeps every digit
