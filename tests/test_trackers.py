"""Experiment trackers through Accelerate (train.log_with, training/trackers.py) and the head comparison
in MLflow (comparison/tracking.py), read back with MLflow's and TensorBoard's own clients, offline against
local stores: the run, its parameters, its metrics per epoch with real timestamps, the report's artifacts;
TensorBoard's per-epoch scalars and the HParams tab's data in one run; a tracker whose package is missing or
does not import, or an MLflow store that cannot be used, is one line, exit 2, before anything in the run
directory changes (a resume included); the removed train.tensorboard switch names its replacement."""
import contextlib
import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from common.cli import run_cli
from common.errors import UserError
from configs.loader import config_from_dict
from test_train_helpers import (
    TRAIN_PY,
    KillAfter,
    Killed,
    main_inprocess,
    read_metrics,
    run_inprocess,
    subprocess_env,
    tiny_cfg,
    write_cfg,
)
from training.trackers import STORE_WAIT_S

mlflow = pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402


def test_log_with_values_and_the_removed_tensorboard_switch():
    log_with = lambda train: config_from_dict({"train": train}).train.log_with  # noqa: E731
    assert log_with({}) == "auto"
    assert log_with({"log_with": ["tensorboard", "mlflow"]}) == ("tensorboard", "mlflow")
    for train, expected in (({"log_with": "mlfow"}, "must be one of auto, none, tensorboard"),
                            ({"log_with": ["mlflow", "wand"]}, "(each)"),
                            ({"tensorboard": False}, r"'train.tensorboard'; set train.log_with instead .*false was "
                                                     r"log_with=none")):
        with pytest.raises(UserError, match=expected) as err:
            config_from_dict({"train": train})
        assert "\n" not in str(err.value)


def test_a_missing_tracker_package_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    import train
    from training import trackers

    real = trackers.importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec", lambda name: None if name == "comet_ml" else real(name))
    cfg = tiny_cfg(str(tmp_path / "run"), "train.log_with=[tensorboard,comet_ml]")
    from configs import save_config
    save_config(cfg, str(tmp_path / "c.yaml"))
    with pytest.raises(SystemExit) as e:
        run_cli(train.main, ["--config", str(tmp_path / "c.yaml")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err == ("error: train.log_with=comet_ml needs the comet_ml package, which is not "
                                         "installed: pip install comet_ml, or remove comet_ml from train.log_with\n")
    assert not (tmp_path / "run").exists()  # refused before the run directory was touched


def test_training_logs_to_mlflow_and_tensorboard_through_accelerate(tmp_path, monkeypatch):
    """...across a resume: the second session goes on in the first one's MLflow run (trackers.json). The first is
    killed between two checkpoints (step 2 and 4) after logging step 3: the resumed session logs step 3 again, and
    MLflow and every TensorBoard loader hold each step once."""
    store = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    run = str(tmp_path / "run")
    overrides = ("optim.epochs=2", "data.builtin_train_size=64", "train.log_with=[tensorboard,mlflow]")
    with pytest.raises(Killed):  # 2 updates per epoch: a checkpoint at step 2, step 3 logged, killed at 4
        run_inprocess(tiny_cfg(run, *overrides), hooks=KillAfter(4))
    assert [r["step"] for r in read_metrics(run) if r["kind"] == "train"] == [1, 2, 3]
    cfg = tiny_cfg(run, *overrides)
    assert run_inprocess(cfg, resume="auto") == 0
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name(cfg.name)
    (found,) = client.search_runs([experiment.experiment_id])  # one run for both sessions
    assert found.info.run_name == "run"  # named by its folder, not by its config like every sibling
    assert found.data.params["optim.lr"] == str(cfg.optim.lr) and found.data.params["head.name"] == "softmax"
    val = client.get_metric_history(found.info.run_id, "val_raw/top1")
    evals = [r for r in read_metrics(run) if r["kind"] == "eval" and r["weights"] == "raw"]
    assert [(m.step, m.value) for m in val] == [(r["step"], r["top1"]) for r in evals] and len(val) == 2
    losses = [(r["step"], r["loss"]) for r in read_metrics(run) if r["kind"] == "train"]
    for key in ("train/loss", "train/lr", "train/img_per_s"):  # each logged step once (step 3 was logged twice)
        assert [m.step for m in client.get_metric_history(found.info.run_id, key)] == [1, 2, 3, 4], key
    assert [(m.step, m.value) for m in client.get_metric_history(found.info.run_id, "train/loss")] == losses
    epochs = client.get_metric_history(found.info.run_id, "epoch/train_loss")
    assert [m.value for m in epochs] == [float(r["train_loss"]) for r in read_epochs(run)] and len(epochs) == 2
    assert_logged_within_the_run(client, found.info.run_id)
    assert_tensorboard_run(os.path.join(run, "tensorboard", cfg.name), cfg, read_epochs(run))
    for loader, points in tensorboard_loaders(os.path.join(run, "tensorboard"), cfg.name, "train/loss").items():
        assert [step for step, _ in points] == [1, 2, 3, 4], loader  # TensorBoard's Python loader: 1, 2, 3, 3, 4
        assert [value for _, value in points] == pytest.approx([loss for _, loss in losses]), loader  # float32


def read_epochs(run_dir):
    import csv

    with open(os.path.join(run_dir, "epochs.csv"), newline="") as f:
        return list(csv.DictReader(f))


def assert_logged_within_the_run(client, run_id):
    """Every metric of the MLflow run is timestamped within the run's wall-clock window."""
    run = client.get_run(run_id)
    start, end = run.info.start_time, run.info.end_time
    assert start and end and start <= end
    for key in run.data.metrics:
        times = [m.timestamp for m in client.get_metric_history(run_id, key)]
        assert times and all(start <= t <= end for t in times), (key, start, end, times)


def assert_tensorboard_run(folder, cfg, epoch_rows):
    """One TensorBoard run (no sub-run) holds the per-epoch scalars and the HParams tab's data: the config as
    hyperparameters, and metrics that are scalars of that same run; as TensorBoard itself reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    assert [d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d))] == []
    events = EventAccumulator(folder, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    curve = events.Scalars("epoch/train_loss")
    assert [e.step for e in curve] == [int(r["step"]) for r in epoch_rows]
    assert [e.value for e in curve] == pytest.approx([float(r["train_loss"]) for r in epoch_rows])  # float32
    content = events.PluginTagToContent(metadata.PLUGIN_NAME)
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    shown = [m.name.tag for m in experiment.metric_infos]
    assert "epoch/train_loss" in shown and "val_raw/top1" in shown and set(shown) <= scalars
    hparams = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG]).hparams
    assert hparams["optim.lr"].number_value == pytest.approx(cfg.optim.lr)
    assert hparams["head.name"].string_value == "softmax"


def tensorboard_loaders(logdir, run, tag):
    """{loader: [(step, value)] of scalar `tag` of TensorBoard run `run` under `logdir`}, as each of TensorBoard's
    loaders reads the event files: the legacy EventAccumulator, the Python loader (--load_fast=false, the plugin
    accumulator) and the Rust data server (--load_fast=true, where its binary is installed)."""
    from tensorboard.backend.event_processing import (  # optional dependency, as in assert_tensorboard_run
        event_accumulator,
        plugin_event_accumulator,
    )
    from tensorboard.util import tensor_util  # optional dependency

    folder = os.path.join(logdir, run)
    legacy = event_accumulator.EventAccumulator(folder, size_guidance={"scalars": 0})
    legacy.Reload()
    python = plugin_event_accumulator.EventAccumulator(folder, size_guidance={"tensors": 0})
    python.Reload()
    out = {"legacy": [(e.step, e.value) for e in legacy.Scalars(tag)],
           "python": [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in python.Tensors(tag)]}
    if importlib.util.find_spec("tensorboard_data_server") is not None:
        out["rust"] = rust_loader_scalars(logdir, run, tag)
    return out


def rust_loader_scalars(logdir, run, tag):
    """[(step, value)] of `tag` as TensorBoard's Rust data server serves it (one load of `logdir`)."""
    import tensorboard_data_server  # optional dependency: the binary TensorBoard's --load_fast uses
    from tensorboard import context  # optional dependency, as above
    from tensorboard.data.server_ingester import ServerBinary, SubprocessServerDataIngester
    from tensorboard.util import grpc_util

    binary = ServerBinary(tensorboard_data_server.server_binary(), version=None)
    server = SubprocessServerDataIngester(binary, logdir, reload_interval=0,
                                          channel_creds_type=grpc_util.ChannelCredsType.LOCAL)
    server.start()
    try:
        for _ in range(100):  # loaded once, shortly after it starts
            read = server.data_provider.read_scalars(context.RequestContext(), experiment_id="", plugin_name="scalars",
                                                     downsample=10_000)
            if tag in read.get(run, {}):
                return [(p.step, p.value) for p in read[run][tag]]
            time.sleep(0.05)
        raise AssertionError(f"TensorBoard's data server never served {run}/{tag}")
    finally:
        server._stdin_handle.close()  # --die-after-stdin: the server exits


def test_the_comparison_is_one_mlflow_experiment_with_its_report(tmp_path):
    from test_compare import HEADS, tiny_comparison

    root, stdout = tiny_comparison()
    runs_dir = os.path.join(root, "runs")
    store = f"sqlite:///{os.path.join(runs_dir, 'mlflow.db')}"
    assert f"mlflow ui --backend-store-uri {store}" in stdout
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name("runs")  # named after the runs folder
    found = client.search_runs([experiment.experiment_id])
    by_head = {r.data.tags.get("head"): r for r in found if r.data.tags.get("kind") != "report"}
    assert sorted(by_head) == sorted(HEADS) and len(found) == len(HEADS) + 1
    for head, r in by_head.items():
        assert r.data.tags["seed"] == "0" and r.data.tags["variant"] == head and r.data.params["head.name"] == head
        assert r.info.run_name == f"{head}-s0"  # its folder under the runs folder
        assert_points_at_their_own_time(client, r, eval_file="eval.json")
        assert (r.data.tags["kind"], r.data.tags["norm"], r.data.tags["alpha"]) == ("run", "affine", "none")
        assert_logged_within_the_run(client, r.info.run_id)
        assert {"final/top1", "final/support_mean", "final/ece"} <= set(r.data.metrics)
        curve = client.get_metric_history(r.info.run_id, "epoch/raw_top1")
        assert len(curve) >= 1 and all(0 <= m.value <= 1 for m in curve)
    (report,) = [r for r in found if r.data.tags.get("kind") == "report"]
    names = {a.path for a in client.list_artifacts(report.info.run_id)}
    assert {"report.md", "runs.csv", "val_accuracy.png"} <= names
    assert report.data.tags["report_dir"] == os.path.join(root, "report")
    assert_artifacts_are_the_folder(store, report.info.run_id, os.path.join(root, "report"), tmp_path)


def assert_points_at_their_own_time(client, run, eval_file):
    """Each point of a run the comparison logs is timestamped when it happened: an epoch/ point at its epochs.csv
    row's wall_time (steps in order, times rising), a final/ one at the evaluation's (its file's last change)."""
    run_dir = run.data.tags["run_dir"]
    rows = read_epochs(run_dir)
    clock = [(int(r["step"]), int(float(r["wall_time"]) * 1000)) for r in rows]
    assert len(clock) >= 2 and all(a[1] < b[1] for a, b in zip(clock, clock[1:]))
    for key in ("epoch/train_loss", "epoch/lr"):
        assert [(m.step, m.timestamp) for m in client.get_metric_history(run.info.run_id, key)] == clock, key
    evals = [(m.step, m.timestamp) for m in client.get_metric_history(run.info.run_id, "epoch/raw_top1")]
    assert evals and set(evals) <= set(clock)  # the epochs evaluated
    evaluated = int(os.path.getmtime(os.path.join(run_dir, eval_file)) * 1000)
    finals = [k for k in run.data.metrics if k.startswith("final/")]
    assert finals and {m.timestamp for k in finals for m in client.get_metric_history(run.info.run_id, k)} == {
        evaluated}


def assert_artifacts_are_the_folder(store, run_id, folder, tmp_path):
    """The run's artifacts, downloaded with MLflow's client, are the folder's files, byte for byte."""
    from mlflow.artifacts import download_artifacts

    got = download_artifacts(run_id=run_id, artifact_path="", dst_path=str(tmp_path / "artifacts"),
                             tracking_uri=store)
    files = lambda top: {k: v for k, v in tree(top).items() if v is not None}  # noqa: E731
    assert files(got) == {k: v for k, v in files(folder).items() if not os.path.basename(k).startswith(".")}


# ============================================================================ checks before the run changes anything
def tree(folder):
    """{relative path: bytes (None for a folder)} of everything under `folder`."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs:
            out[os.path.relpath(os.path.join(root, name), folder)] = None
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), folder)] = f.read()
    return out


@contextlib.contextmanager
def read_only(folder):
    """`folder` read-only for this process, as a read-only mount is: root ignores permissions, so it is made
    immutable (chattr +i) there; skipped where neither works."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        undo = lambda: os.chmod(folder, 0o755)  # noqa: E731
    elif shutil.which("chattr") and subprocess.run(["chattr", "+i", folder], capture_output=True).returncode == 0:
        undo = lambda: subprocess.run(["chattr", "-i", folder], check=True)  # noqa: E731
    else:
        pytest.skip("no way to make a folder read-only for root here (chattr)")
    try:
        yield
    finally:
        undo()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def _store_case(case, tmp):
    """-> (MLFLOW_TRACKING_URI or None, what the one line says is wrong) for one unusable store."""
    run = tmp / "run"
    if case == "a regular file":
        (tmp / "notes.txt").write_text("not a database\n")
        return f"sqlite:///{tmp}/notes.txt", f"{tmp}/notes.txt is not an SQLite database"
    if case == "a file store on a regular file":
        (tmp / "notes.txt").write_text("not a store\n")
        return str(tmp / "notes.txt"), f"{tmp}/notes.txt is a file, not an MLflow file store (a folder)"
    if case == "under a file":
        (tmp / "notes.txt").write_text("a file\n")
        return f"sqlite:///{tmp}/notes.txt/sub/mlflow.db", f"{tmp}/notes.txt is a file, not a folder"
    if case == "a server that is down":
        uri = f"http://127.0.0.1:{free_port()}"
        return uri, f"cannot reach the MLflow server within {STORE_WAIT_S} s (Connection refused)"
    if case == "a database server that is down":  # MLflow's SQLAlchemy store would retry it for ~100 s
        port = free_port()
        return (f"postgresql://user:secret@127.0.0.1:{port}/mlflow",
                f"cannot reach the database server 127.0.0.1:{port} within {STORE_WAIT_S} s (Connection refused)")
    if case == "RUN_DIR/mlflow.db a folder":
        (run / "mlflow.db").mkdir()
        return None, f"{run}/mlflow.db is a folder, not an SQLite database"
    if case == "RUN_DIR/mlflow.db not a database":
        (run / "mlflow.db").write_bytes(b"\x00garbage" * 100)
        return None, f"{run}/mlflow.db is not an SQLite database"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["a regular file", "a file store on a regular file", "under a file",
                                  "a server that is down", "a database server that is down",
                                  "RUN_DIR/mlflow.db a folder", "RUN_DIR/mlflow.db not a database"])
def test_an_unusable_mlflow_store_is_one_line_before_the_run_changes(tmp_path, monkeypatch, case):
    run = tmp_path / "run"
    run.mkdir()
    config = write_cfg(tiny_cfg(str(run), "train.log_with=mlflow"), tmp_path / "c.yaml")
    uri, problem = _store_case(case, tmp_path)
    if uri:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = tree(tmp_path)
    proc = main_inprocess("--config", config)
    store = uri.replace(":secret@", ":***@") if uri else f"sqlite:///{run}/mlflow.db"  # a password is masked
    assert "secret" not in proc.stderr
    move = "" if uri else f"move {run}/mlflow.db away (a new store is made there), "
    assert proc.returncode == 2 and proc.stderr == (f"error: train.log_with=mlflow cannot use the MLflow store "
                                                    f"{store}: {problem}; {move}set MLFLOW_TRACKING_URI to another "
                                                    f"store, or train.log_with=none\n")
    assert tree(tmp_path) == before  # nothing written: no config.yaml, no store, no lock left


def test_a_read_only_store_folder_is_one_line(tmp_path, monkeypatch):
    folder, run = tmp_path / "ro", tmp_path / "run"
    folder.mkdir()
    run.mkdir()
    config = write_cfg(tiny_cfg(str(run), "train.log_with=[tensorboard,mlflow]"), tmp_path / "c.yaml")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{folder}/mlflow.db")
    with read_only(str(folder)):
        proc = main_inprocess("--config", config)
    assert proc.returncode == 2 and proc.stderr == (
        f"error: train.log_with=mlflow cannot use the MLflow store sqlite:///{folder}/mlflow.db: the folder {folder} "
        f"is read-only; set MLFLOW_TRACKING_URI to another store, or remove mlflow from train.log_with\n")
    assert os.listdir(run) == [] and os.listdir(folder) == []


def test_a_resume_refused_for_its_store_truncates_nothing(tmp_path, monkeypatch):
    """The damaged RUN_DIR/mlflow.db is found before the resume cuts metrics.jsonl back to the checkpoint."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = tmp_path / "run"
    overrides = ("optim.epochs=2", "data.builtin_train_size=64", "train.log_with=mlflow")
    assert run_inprocess(tiny_cfg(str(run), *overrides, "train.pause_after=1")) == 0  # a checkpoint at epoch 1
    with open(run / "metrics.jsonl", "a") as f:  # logged after the checkpoint (the run was killed later)
        f.write('{"kind": "train", "step": 99, "epoch": 2, "loss": 1.0}\n')
    (run / "mlflow.db").write_bytes(b"damaged" * 64)
    before = tree(run)
    proc = main_inprocess("--config", write_cfg(tiny_cfg(str(run), *overrides), tmp_path / "c.yaml"),
                          "--resume", "auto")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"error: train.log_with=mlflow cannot use the MLflow store sqlite:///{run}/"
                                  f"mlflow.db: {run}/mlflow.db is not an SQLite database;")
    assert tree(run) == before  # metrics.jsonl, epochs.csv, config.yaml, checkpoints: byte-identical


def test_a_half_installed_tracker_package_is_one_line(tmp_path):
    """An mlflow that is found but does not import (a broken install): one line before the run dir exists."""
    fake = tmp_path / "site" / "mlflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("cannot import name \'protos\' (a broken install)")\n')
    config = write_cfg(tiny_cfg(str(tmp_path / "run"), "train.log_with=mlflow"), tmp_path / "c.yaml")
    proc = subprocess.run([sys.executable, TRAIN_PY, "--config", config], capture_output=True, text=True, timeout=300,
                          env=subprocess_env(PYTHONPATH=str(tmp_path / "site")))
    assert proc.returncode == 2 and proc.stderr == (
        "error: train.log_with: the mlflow package is installed but does not import (ImportError: cannot import "
        "name 'protos' (a broken install)): reinstall it (pip install --force-reinstall mlflow), or set "
        "train.log_with=none\n")
    assert not (tmp_path / "run").exists()


def test_the_comparison_experiment_is_named_by_its_path_in_a_shared_store(tmp_path, monkeypatch):
    from comparison.tracking import experiment_name

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert experiment_name(str(tmp_path / "a" / "runs")) == "runs"  # its own store holds one comparison
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.example:5000")
    names = {experiment_name(str(tmp_path / d / "runs")) for d in ("a", "b")}
    assert names == {str(tmp_path / "a" / "runs"), str(tmp_path / "b" / "runs")}


@pytest.mark.usefixtures("one_thread")
def test_a_tuned_comparison_logs_into_its_own_store_once_its_report_is_complete(tmp_path, monkeypatch):
    """Both arms' verdict runs in the comparison's store and experiment (told apart by their arm tag), and the
    report run's artifacts the final report folder: report.md with its tuning section, tuning.json, the plots."""
    import yaml

    from feature_folder import write_feature_folder
    from test_tune import CONFIG, _compare  # tests/test_tune.py's tiny settings: cached features

    feats = write_feature_folder(str(tmp_path / "feat"), classes=6, spread=0.35)
    monkeypatch.chdir(tmp_path)
    with open("cfg.yaml", "w") as f:
        yaml.safe_dump(CONFIG, f)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    argv = ["--config", "cfg.yaml", "--features", feats, "--runs-dir", "runs", "--report-dir", "rep",
            "--ood-dataset", "none", "--tune", "--heads", "softmax", "--seeds", "0", "--trials", "1"]
    assert _compare(argv) == 0
    assert not [p for p in ("runs/tune/tuned/mlflow.db", "runs/tune/untuned/mlflow.db") if os.path.exists(p)]
    store = f"sqlite:///{os.path.abspath('runs/mlflow.db')}"
    client = MlflowClient(tracking_uri=store)
    assert {e.name for e in client.search_experiments()} == {"runs", "Default"}  # no "tuned" nor "untuned"
    found = client.search_runs([client.get_experiment_by_name("runs").experiment_id])
    runs = {r.data.tags["arm"]: r for r in found if r.data.tags["kind"] == "run"}
    assert sorted(runs) == ["tuned", "untuned"] and len(found) == 3
    assert runs["tuned"].data.tags["run_dir"] == os.path.abspath("runs/tune/tuned/softmax-s0")
    assert [runs[arm].info.run_name for arm in ("tuned", "untuned")] == ["tune/tuned/softmax-s0",
                                                                       "tune/untuned/softmax-s0"]  # told apart
    (report,) = [r for r in found if r.data.tags["kind"] == "report"]
    assert "\n## Tuning\n" in open("rep/report.md").read()  # the section appended after the tuned report
    assert os.path.isfile("rep/tuning.json") and os.path.isfile("rep/untuned/report.md")
    assert_artifacts_are_the_folder(store, report.info.run_id, "rep", tmp_path)


def test_a_resume_goes_on_in_its_mlflow_run_while_the_store_holds_it(tmp_path, monkeypatch):
    """training.trackers.check_stores on RUN_DIR/mlflow.db: the saved run is continued; a run deleted from the
    store gives a note and a new run; an experiment of the run's name deleted there is one line."""
    from types import SimpleNamespace

    from common.io import write_json
    from training.trackers import check_stores

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    run = tmp_path / "run"
    run.mkdir()
    cfg = SimpleNamespace(name="tiny", train=SimpleNamespace(output_dir=str(run)))
    notes = []
    assert check_stores(["mlflow"], cfg, resuming=True, say=notes.append) == {"mlflow_run_id": None}  # no store yet
    client = MlflowClient(tracking_uri=f"sqlite:///{run}/mlflow.db")
    experiment_id = client.create_experiment("tiny")
    run_id = client.create_run(experiment_id).info.run_id
    write_json({"mlflow_run_id": run_id}, str(run / "trackers.json"))
    assert check_stores(["mlflow"], cfg, resuming=True, say=notes.append) == {"mlflow_run_id": run_id}
    assert check_stores(["mlflow"], cfg, resuming=False, say=notes.append) == {"mlflow_run_id": None}
    assert notes == []
    client.delete_run(run_id)
    assert check_stores(["mlflow"], cfg, resuming=True, say=notes.append) == {"mlflow_run_id": None}
    assert notes == [f"note: the MLflow run {run_id} of this training is not in sqlite:///{run}/mlflow.db (deleted, "
                     f"or another store): the resumed training logs into a new MLflow run"]
    client.delete_experiment(experiment_id)
    with pytest.raises(UserError, match=r"^the MLflow experiment 'tiny' in .* was deleted, .*: restore it \(mlflow "
                                        r"experiments restore --experiment-id \d+\), set MLFLOW_EXPERIMENT_NAME to "
                                        r"another name, or train.log_with=none$"):
        check_stores(["mlflow"], cfg, resuming=True, say=notes.append)


def test_a_tuned_comparison_checks_its_mlflow_store_before_the_first_trial(tmp_path, monkeypatch):
    import yaml

    from test_tune import CONFIG, _compare

    monkeypatch.chdir(tmp_path)
    with open("cfg.yaml", "w") as f:
        yaml.safe_dump(CONFIG, f)
    (tmp_path / "notes.txt").write_text("not a database\n")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/notes.txt")
    argv = ["--config", "cfg.yaml", "--runs-dir", "runs", "--report-dir", "rep", "--ood-dataset", "none", "--tune",
            "--heads", "softmax", "--seeds", "0", "--trials", "1"]
    with pytest.raises(UserError) as err:
        _compare(argv)
    assert str(err.value) == (f"the comparison cannot log to the MLflow store sqlite:///{tmp_path}/notes.txt: "
                              f"{tmp_path}/notes.txt is not an SQLite database; set MLFLOW_TRACKING_URI to another "
                              f"store, or pass --no-mlflow")
    assert sorted(os.listdir(tmp_path)) == ["cfg.yaml", "notes.txt"]  # no trial, no runs folder
