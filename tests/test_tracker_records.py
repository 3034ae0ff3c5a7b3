"""Tracker records a user can trust, read back with MLflow's own client (tests/test_trackers.py reads a training's
MLflow run and TensorBoard files across a kill and a resume): a comparison into a shared store
(MLFLOW_TRACKING_URI) with train.log_with=mlflow holds its runs in its own experiment, named apart, each point at
the time it happened, and its artifacts beside the store, never in the current folder; a run trained before
epochs.csv had a clock is dated back from the file; a store that does not answer is one line within the wait the
line states."""
import csv
import os
import socket
import time
from types import SimpleNamespace

import pytest
import yaml

from common.errors import UserError
from comparison.tracking import check_mlflow_store, run_metrics
from feature_folder import write_feature_folder
from test_trackers import assert_artifacts_are_the_folder, assert_points_at_their_own_time, free_port
from test_tune import CONFIG, _compare  # tests/test_tune.py's tiny settings: cached features
from training import trackers

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_a_comparison_in_a_shared_store_holds_its_runs_apart_at_their_times(tmp_path, monkeypatch):
    """train.log_with=mlflow into MLFLOW_TRACKING_URI: train.py's runs go to the config's experiment (named by their
    folder), and the comparison's experiment holds every run too, named by its folder, beside its report run."""
    feats = write_feature_folder(str(tmp_path / "feat"), classes=6, spread=0.35)
    (tmp_path / "store").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    with open("cfg.yaml", "w") as f:
        yaml.safe_dump({**CONFIG, "train": {**CONFIG["train"], "log_with": "mlflow"}}, f)
    store = f"sqlite:///{tmp_path}/store/shared.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    assert _compare(["--config", "cfg.yaml", "--features", feats, "--runs-dir", "runs", "--report-dir", "rep",
                     "--ood-dataset", "none", "--heads", "softmax", "sparsemax", "--seeds", "0"]) == 0
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name(os.path.abspath("runs"))
    assert experiment.artifact_location == f"file://{tmp_path}/store/mlartifacts"  # beside the store
    found = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in found) == ["report", "softmax-s0", "sparsemax-s0"]
    for r in found:
        if r.data.tags["kind"] == "run":
            assert r.data.tags["run_dir"] == os.path.abspath(f"runs/{r.info.run_name}")
            assert r.data.params["head.name"] == r.data.tags["head"]
            assert_points_at_their_own_time(client, r, eval_file="eval.json")
    others = [e for e in client.search_experiments() if e.experiment_id != experiment.experiment_id
              and e.name != "Default"]  # the config's, where train.py logged
    assert len(others) == 1 and others[0].artifact_location == f"file://{tmp_path}/store/mlartifacts"
    trained = client.search_runs([others[0].experiment_id])
    assert sorted(r.info.run_name for r in trained) == ["softmax-s0", "sparsemax-s0"]
    (report,) = [r for r in found if r.data.tags["kind"] == "report"]
    assert os.path.isfile(f"{tmp_path}/store/mlartifacts/{report.info.run_id}/artifacts/report.md")
    assert_artifacts_are_the_folder(store, report.info.run_id, "rep", tmp_path)
    assert sorted(os.listdir(".")) == ["cfg.yaml", "rep", "runs"]  # no ./mlruns


def test_a_run_without_a_clock_in_epochs_csv_is_dated_back_from_the_file(tmp_path):
    """epochs.csv of a run trained before it had a wall_time column: each row is dated from the file's last change
    back through the later rows' time_s; a row with a clock keeps it, and dates the rows before it."""
    rows = [{"epoch": 1, "step": 4, "train_loss": 2.0, "time_s": 10.0},
            {"epoch": 2, "step": 8, "train_loss": 1.5, "time_s": 20.0},
            {"epoch": 3, "step": 12, "train_loss": 1.0, "time_s": 30.0}]
    path = tmp_path / "epochs.csv"
    write_rows(path, rows)
    os.utime(path, (1_700_000_000, 1_700_000_000))
    points = {(m.key, m.step): m.timestamp for m in run_metrics(str(tmp_path), {"top1": 0.5}, 123)}
    assert [points["epoch/train_loss", step] for step in (4, 8, 12)] == [1_699_999_950_000, 1_699_999_970_000,
                                                                          1_700_000_000_000]
    assert points["final/top1", 0] == 123  # at the evaluation's time
    write_rows(path, rows + [{"epoch": 4, "step": 16, "train_loss": 0.5, "time_s": 40.0, "wall_time": 1_700_000_100.5}])
    times = [m.timestamp for m in run_metrics(str(tmp_path), {}, 0) if m.key == "epoch/train_loss"]
    assert times == [1_700_000_010_500, 1_700_000_030_500, 1_700_000_060_500, 1_700_000_100_500]


def write_rows(path, rows):
    """epochs.csv as training/logging.py's EpochCSV writes it: the later rows' new columns empty in the earlier."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[-1]), restval="")
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize("uri, where", [
    ("sqlite:////data/mlflow/store.db", "file:///data/mlflow/mlartifacts"),
    ("sqlite:///:memory:", "file:///runs/mlartifacts"),
    ("postgresql://user@db.example:5432/mlflow", "file:///runs/mlartifacts"),
    ("/data/mlruns", None), ("file:///data/mlruns", None), ("http://mlflow.example:5000", None),
    ("https://mlflow.example", None), ("databricks", None)])
def test_a_new_experiment_keeps_its_artifacts_in_the_stores_place(uri, where):
    """Beside an SQLite store; the store's own choice for a file store, a server, Databricks; never the current
    folder (MLflow's ./mlruns), which a database without a place of its own would get."""
    assert trackers.artifact_location(uri, "/runs") == where


def test_a_store_that_does_not_answer_is_one_line_within_the_stated_wait(monkeypatch):
    """A server that takes the connection and never answers: given up after STORE_WAIT_S (1 s here), said so."""
    monkeypatch.setattr(trackers, "STORE_WAIT_S", 1)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel takes the connection; nobody answers
        started = time.monotonic()
        client, problem = trackers.open_mlflow_store(f"http://127.0.0.1:{silent.getsockname()[1]}")
        waited = time.monotonic() - started
    assert client is None and problem == "no answer from the MLflow server within 1 s"
    assert waited < 3


def test_a_comparison_answers_a_database_server_that_is_down_in_one_line(tmp_path, monkeypatch):
    """Reached once with a plain connection: one line at once, not after the ~100 s MLflow's SQLAlchemy store retries
    it (the database's driver need not be installed)."""
    port = free_port()
    uri = f"mysql://user:secret@127.0.0.1:{port}/mlflow"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    started = time.monotonic()
    with pytest.raises(UserError) as err:
        check_mlflow_store(SimpleNamespace(no_mlflow=False), str(tmp_path / "runs"))
    waited = time.monotonic() - started
    shown = uri.replace(":secret@", ":***@")  # the password never shows
    assert str(err.value) == (f"the comparison cannot log to the MLflow store {shown}: cannot reach the database "
                              f"server 127.0.0.1:{port} within {trackers.STORE_WAIT_S} s (Connection refused); set "
                              f"MLFLOW_TRACKING_URI to another store, or pass --no-mlflow")
    assert waited < trackers.STORE_WAIT_S and not (tmp_path / "runs").exists()


def test_a_password_in_the_store_uri_never_shows_in_a_message():
    from training.trackers import shown_uri

    assert shown_uri("postgresql://ann:s3cr%40t@db.example:5432/mlflow") == "postgresql://ann:***@db.example:5432/mlflow"
    assert shown_uri("http://127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert shown_uri("sqlite:////tmp/x/mlflow.db") == "sqlite:////tmp/x/mlflow.db"
