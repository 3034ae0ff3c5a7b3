"""Experiment trackers through Accelerate (train.log_with, training/trackers.py) and the head comparison
in MLflow (scripts/compare_tracking.py), checked offline against local stores: the run, its
parameters, its metrics per epoch, the report's artifacts; TensorBoard event files; a tracker whose
package is missing is one line, exit 2; the removed train.tensorboard switch names its replacement."""
import os

import pytest

from common.errors import UserError
from configs.loader import config_from_dict
from common.cli import run_cli
from test_train_helpers import read_metrics, run_inprocess, tiny_cfg

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
    """...across a resume: the second session goes on in the first one's MLflow run (trackers.json)."""
    store = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store)
    run = str(tmp_path / "run")
    overrides = ("optim.epochs=2", "data.builtin_train_size=64", "train.log_with=[tensorboard,mlflow]")
    assert run_inprocess(tiny_cfg(run, *overrides, "train.pause_after=1")) == 0  # stops after epoch 1
    cfg = tiny_cfg(run, *overrides)
    assert run_inprocess(cfg, resume="auto") == 0
    client = MlflowClient(tracking_uri=store)
    experiment = client.get_experiment_by_name(cfg.name)
    (found,) = client.search_runs([experiment.experiment_id])  # one run for both sessions
    assert found.data.params["optim.lr"] == str(cfg.optim.lr) and found.data.params["head.name"] == "softmax"
    val = client.get_metric_history(found.info.run_id, "val_raw/top1")
    evals = [r for r in read_metrics(run) if r["kind"] == "eval" and r["weights"] == "raw"]
    assert [(m.step, m.value) for m in val] == [(r["step"], r["top1"]) for r in evals] and len(val) == 2
    assert len(client.get_metric_history(found.info.run_id, "train/loss")) == 4  # every logged step
    events = [f for _, _, fs in os.walk(os.path.join(run, "tensorboard", cfg.name)) for f in fs]
    assert any(f.startswith("events.out.tfevents") for f in events)


def test_the_comparison_is_one_mlflow_experiment_with_its_report():
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
        assert "final/top1" in r.data.metrics and "final/support_mean" in r.data.metrics and "final/ece" in r.data.metrics
        curve = client.get_metric_history(r.info.run_id, "epoch/raw_top1")
        assert len(curve) >= 1 and all(0 <= m.value <= 1 for m in curve)
    (report,) = [r for r in found if r.data.tags.get("kind") == "report"]
    names = {a.path for a in client.list_artifacts(report.info.run_id)}
    assert {"report.md", "runs.csv", "val_accuracy.png"} <= names
