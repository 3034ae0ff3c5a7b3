"""compare_heads --tune (comparison/tuning.py, scripts/tune_heads.py): the same trial budget per head,
selection on the tune split only, resumable after SIGKILL, shared storage, the chosen settings in
the report and the verdict runs. Cached features (tests/feature_folder.py) keep every trial to a
fraction of a second."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import yaml

import configs
import data
from common.search_space import parse_search
from configs.schema import SEARCH
from models.registry import HPARAMS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from feature_folder import write_feature_folder  # noqa: E402
from test_train_helpers import reset_accelerate_state  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

CONFIG = {"data": {"batch_size": 32, "hflip": 0.0, "crop_padding": 0},
          "optim": {"name": "adamw", "lr": 1e-2, "lr_base_batch": 32, "epochs": 2, "warmup_epochs": 0},
          "train": {"ema": False, "log_with": "none", "progress": False, "log_every": 5, "save_every": 2}}


@pytest.fixture(scope="module")
def feats(tmp_path_factory):
    return write_feature_folder(str(tmp_path_factory.mktemp("feat") / "f"), classes=6, spread=0.35)


@pytest.fixture
def sandbox(tmp_path, feats, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("cfg.yaml", "w") as f:
        yaml.safe_dump(CONFIG, f)
    return tmp_path


def _args(feats, *extra):
    return ["--config", "cfg.yaml", "--features", feats, "--runs-dir", "runs", "--report-dir", "rep",
            "--ood-dataset", "none", "--no-mlflow", "--tune", *extra]


def _compare(argv):
    import compare_heads

    reset_accelerate_state()
    return compare_heads.main(argv)


def _studies(storage="sqlite:///runs/tune/studies.db"):
    import optuna

    from comparison.tuning import open_storage

    store = open_storage(storage)
    return {s.study_name: optuna.load_study(study_name=s.study_name, storage=store)
            for s in optuna.get_all_study_summaries(store)}


def _finished(study):
    return [t for t in study.get_trials() if t.state.name in ("COMPLETE", "PRUNED")]


# ------------------------------------------------------------------------------------ declarations
def test_every_search_range_lies_inside_its_keys_range():
    for name, hp in HPARAMS.items():
        if hp.search:
            rng = parse_search(hp.search)
            for end in (rng.low, rng.high):
                value = int(end) if rng.integer else end
                assert hp.check(value) == value, name
    assert set(SEARCH) == {"optim.lr", "optim.weight_decay"}
    for key, text in SEARCH.items():
        rng = parse_search(text)
        for end in (rng.low, rng.high):
            cfg = configs.config_from_dict({key.split(".")[0]: {key.split(".")[1]: end}})
            assert getattr(cfg.optim, key.split(".")[1]) == end
    with pytest.raises(ValueError, match="low < high"):
        parse_search("log [0, 1]")


def test_search_space_leaves_out_what_the_comparison_pins():
    from comparison.tuning import search_space

    assert set(search_space("softmax", ["head.name=softmax"], 10)) == {"optim.lr", "optim.weight_decay"}
    assert set(search_space("am_softmax", ["optim.lr=0.01"], 10)) == {"optim.weight_decay", "head.scale", "head.margin"}
    assert "head.alpha" not in search_space("entmax_bisect", ["head.alpha=1.25"], 10)
    assert search_space("sparse_softmax", [], 4)["head.k"].high == 4


def test_tuning_options_need_tune():
    import compare_heads

    with pytest.raises(Exception, match="--trials applies to --tune"):
        compare_heads.parse_args(["--config", "cfg.yaml", "--trials", "3"])
    with pytest.raises(Exception, match="--trials must be at least 1"):
        compare_heads.parse_args(["--config", "cfg.yaml", "--tune", "--trials", "0"])


def test_sampled_floats_read_back_as_the_same_numbers():
    from comparison.tuning import yaml_value

    for v in (1e-05, 0.00123, 3.0, 1e20, 2.5e-7, 7):
        assert yaml.safe_load(yaml_value(v)) == v


# ------------------------------------------------------------------------------------------ splits
def test_tune_split_is_disjoint_from_calib_train_and_val():
    pos = data.split_positions(500, 0.1, 0.2)
    assert sum(len(p) for p in pos.values()) == 500 and len(np.unique(np.concatenate(list(pos.values())))) == 500
    assert (len(pos["calib"]), len(pos["tune"])) == (50, 90)
    assert np.array_equal(data.split_positions(500, 0.1, 0.0)["calib"], data.calib_indices(500, 0.1))
    cfg = configs.config_from_dict({"data": {"builtin_train_size": 120, "builtin_val_size": 40, "image_size": 8,
                                             "calib_fraction": 0.1, "tune_fraction": 0.25}}).data
    raw = data.build_dataset(configs.config_from_dict({"data": {**{k: getattr(cfg, k) for k in (
        "builtin_train_size", "builtin_val_size", "image_size")}}}).data, "train")
    val = data.build_dataset(cfg, "val")
    pos = data.split_positions(120, 0.1, 0.25)
    for split in ("train", "calib", "tune"):
        ds = data.build_dataset(cfg, split)
        assert torch.equal(ds.images, raw.images[pos[split]]) and torch.equal(ds.labels, raw.labels[pos[split]])
    tune = data.build_dataset(cfg, "tune").images.flatten(1)
    assert not (tune[:, None] == val.images.flatten(1)[None]).all(-1).any()  # no val image among them


def test_features_tune_split_is_held_out_of_train(feats):
    cfg = configs.config_from_dict({"data": {"dataset": "features", "root": feats, "tune_fraction": 0.25}}).data
    train, tune = data.build_dataset(cfg, "train"), data.build_dataset(cfg, "tune")
    assert len(train) + len(tune) == 240 and len(tune) == 60
    assert not set(train.index.tolist()) & set(tune.index.tolist())
    with pytest.raises(Exception, match="data.tune_fraction > 0"):
        data.build_dataset(configs.config_from_dict({"data": {"dataset": "features", "root": feats}}).data, "tune")


# ------------------------------------------------------------------------------------------ --tune
def test_same_budget_per_head_chosen_settings_in_report_and_runs(sandbox, feats, monkeypatch, capsys):
    read = []
    build = data.build_dataset
    monkeypatch.setattr(data, "build_dataset", lambda cfg, split: read.append(split) or build(cfg, split))
    argv = _args(feats, "--heads", "softmax", "sparse_softmax", "--seeds", "0", "--trials", "3")
    assert _compare(argv + ["--tune-only"]) == 0
    assert "val" not in read and "tune" in read  # the trials never read the val split
    assert _compare(argv) == 0
    studies = _studies()
    assert sorted(studies) == ["cfg/softmax", "cfg/sparse_softmax"]
    report = open("rep/report.md").read()
    for name, study in studies.items():
        assert len(_finished(study)) == 3
        best = study.best_trial
        assert "head.k" in best.params or name == "cfg/softmax"
        variant = name.split("/")[1]
        cfg = yaml.safe_load(open(f"runs/tune/tuned/{variant}-s0/config.yaml"))
        for key, value in best.params.items():
            section, leaf = key.split(".")
            assert cfg[section][leaf] == value
            assert f"{key}={value:.3g}" in report if isinstance(value, float) else f"{key}={value}" in report
        assert yaml.safe_load(open(f"runs/tune/untuned/{variant}-s0/config.yaml"))["optim"]["lr"] == 1e-2
        trial_cfg = yaml.safe_load(open(os.path.join(best.user_attrs["tune.run_dir"], "config.yaml")))
        assert trial_cfg["train"]["eval_split"] == "tune" and trial_cfg["data"]["tune_fraction"] == 0.1
    assert os.path.isfile("rep/tuning_softmax_history.png") and os.path.isfile("rep/untuned/report.md")
    assert "Tuned against untuned verdicts" in report
    capsys.readouterr()
    counts = {name: len(study.get_trials()) for name, study in studies.items()}
    assert _compare(argv) == 0  # everything done: no trial and no run again
    assert {name: len(study.get_trials()) for name, study in _studies().items()} == counts
    assert ": training" not in capsys.readouterr().out


def _cli(argv, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "scripts", "compare_heads.py"), *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True, **kw)


def _wait_for(condition, proc, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            if condition():
                return True
        except Exception:  # the storage is being created
            pass
        if proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def test_sigkill_mid_study_then_rerun_finishes_exactly_the_budget(sandbox, feats):
    argv = _args(feats, "--heads", "softmax", "--trials", "3", "--tune-only", "optim.epochs=6")

    def mid_trial():  # a trial has trained an epoch of its 6 and is still running
        study = _studies()["cfg/softmax"]
        return len(_finished(study)) >= 1 and any(
            t.state.name == "RUNNING" and os.path.isfile(os.path.join(t.user_attrs.get("tune.run_dir", "-"), "epochs.csv"))
            for t in study.get_trials())

    proc = _cli(argv)
    caught = _wait_for(mid_trial, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert caught, "the process finished before it could be killed mid-trial"
    killed = [t for t in _studies()["cfg/softmax"].get_trials() if t.state.name == "RUNNING"]
    assert len(killed) == 1
    assert _compare(argv) == 0
    trials = _studies()["cfg/softmax"].get_trials()
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == 3
    assert [t.state.name for t in trials if t.number == killed[0].number] == ["FAIL"]
    retry = [t for t in finished if t.user_attrs.get("tune.retry_of") == killed[0].number]
    assert len(retry) == 1 and retry[0].params == killed[0].params  # re-run with the same settings ...
    assert retry[0].user_attrs["tune.run_dir"] == killed[0].user_attrs["tune.run_dir"]  # ... resumed in its run
    assert len({t.user_attrs["tune.run_dir"] for t in finished}) == 3


def test_two_processes_share_one_journal_storage(sandbox, feats):
    storage = "journal:" + os.path.join(str(sandbox), "tune.journal")
    argv = _args(feats, "--heads", "sparsemax", "--trials", "8", "--tune-only", "--storage", storage,
                 "--pruner", "none")
    other = _cli(argv)
    assert _wait_for(lambda: len(_finished(_studies(storage)["cfg/sparsemax"])) >= 1, other)
    assert _compare(argv) == 0
    assert other.wait(timeout=120) == 0
    trials = _studies(storage)["cfg/sparsemax"].get_trials()
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
    assert len(finished) == 8
    assert len({t.user_attrs["tune.run_dir"] for t in finished}) == 8
    assert len({t.user_attrs["tune.owner"]["pid"] for t in finished}) == 2  # both did some of the trials


def test_the_budget_counts_pruned_and_diverged_trials(tmp_path):
    """VariantStudy's loop with a stand-in for train.py (it writes the epochs.csv rows train.py would):
    later trials score lower and are pruned past half the budget; a non-finite loss counts as top-1 0."""
    import csv

    from comparison.tuning import DIVERGED, EPOCHS, VariantStudy, open_storage, search_space

    study = VariantStudy(storage=open_storage(f"sqlite:///{tmp_path}/s.db"), name="c/softmax", head="softmax",
                         space=search_space("softmax", [], 10), overrides=["head.name=softmax"], trials=6, epochs=4,
                         eval_every=1, pruner="median", seed=0, trials_dir=str(tmp_path / "trials"), say=lambda m: None)
    calls = []

    def train(overrides, run_dir):
        number = int(run_dir.rsplit("-", 1)[1])
        epoch = int(next(o for o in overrides if o.startswith("train.pause_after=")).split("=")[1])
        calls.append((number, epoch))
        if number == 5:
            return 3  # train.py's exit for a non-finite loss
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "epochs.csv"), "a", newline="") as f:
            csv.writer(f).writerows(([["epoch", "raw_top1"]] if epoch == 1 else []) + [[epoch, 0.9 - 0.1 * number]])
        return 0

    assert study.optimize(train) == 6
    trials = study.study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3 + ["PRUNED"] * 2 + ["COMPLETE"]
    assert [t.user_attrs[EPOCHS] for t in trials] == [4, 4, 4, 3, 3, 1]  # pruned at the first epoch past half
    assert trials[5].value == 0.0 and trials[5].user_attrs[DIVERGED]
    assert study.optimize(train) == 0 and len(calls) == 12 + 6 + 1  # a finished study runs nothing more
