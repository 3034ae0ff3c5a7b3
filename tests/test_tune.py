"""compare_heads --tune (comparison/tuning.py, comparison/tune.py): the same number of complete trials
per head, selection on the tune split only, the chosen settings in the report and the verdict runs,
the report's counts Optuna's. Cached features (tests/feature_folder.py) keep every trial to a fraction
of a second. Workers, SIGKILL and foreign trial folders: tests/test_tune_workers.py; storages:
tests/test_tune_storage.py."""
import json
import os
import re
import sys

import numpy as np
import pytest
import torch
import yaml

import configs
import data
from common.search_space import parse_search
from comparison.tuning import shown_settings
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

    from comparison.tuning_storage import open_storage

    store = open_storage(storage)
    return {s.study_name: optuna.load_study(study_name=s.study_name, storage=store)
            for s in optuna.get_all_study_summaries(store)}


def _complete(study):
    return [t for t in study.get_trials() if t.state.name == "COMPLETE"]


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
    summary = json.load(open("rep/tuning.json"))["variants"]
    for name, study in studies.items():
        assert len(_complete(study)) == 3
        best = study.best_trial
        assert "head.k" in best.params or name == "cfg/softmax"
        variant = name.split("/")[1]
        cfg = yaml.safe_load(open(f"runs/tune/tuned/{variant}-s0/config.yaml"))
        for key, value in best.params.items():
            section, leaf = key.split(".")
            assert cfg[section][leaf] == value
            assert f"{key}={value:.4g}" in report if isinstance(value, float) else f"{key}={value}" in report
        untuned_cfg = yaml.safe_load(open(f"runs/tune/untuned/{variant}-s0/config.yaml"))
        assert untuned_cfg["optim"]["lr"] == 1e-2
        tuning = report.split("\n## Tuning\n", 1)[1]
        row = next(line for line in tuning.splitlines() if line.startswith(f"| {variant} | "))
        config_cell = row.split(" | ")[1]  # the untuned arm's own settings of the tuned keys
        assert config_cell == shown_settings({k: untuned_cfg[k.split(".")[0]][k.split(".")[1]] for k in best.params})
        trial_cfg = yaml.safe_load(open(os.path.join(best.user_attrs["tune.run_dir"], "config.yaml")))
        assert trial_cfg["train"]["eval_split"] == "tune" and trial_cfg["data"]["tune_fraction"] == 0.1
        # the report's and tuning.json's counts are Optuna's own
        states = [t.state.name for t in study.get_trials()]
        row = re.search(rf"^\| {variant} \|.*\| (\d+) complete, (\d+) pruned(?:, (\d+) failed)?", report, re.M)
        assert row and [int(g or 0) for g in row.groups()] == [states.count(s) for s in ("COMPLETE", "PRUNED", "FAIL")]
        assert [t["state"] for t in summary[variant]["trials"]] == states
    assert "same budget: 3 complete trials\n(pruned and failed ones are extra" in report
    tune = build(configs.config_from_dict({"data": {"dataset": "features", "root": feats, "tune_fraction": 0.1}}).data,
                 "tune")
    assert f"tune split,\n  {len(tune)} images (data.tune_fraction=0.1 of train" in report
    assert json.load(open("rep/tuning.json"))["tune_split"] == {"images": len(tune), "fraction": 0.1}
    _check_side_by_side(report, "rep/untuned/runs.csv", "rep/runs.csv")
    assert "tuning each head" not in report  # the plain words do not suggest what was done
    assert os.path.isfile("rep/tuning_softmax_history.png") and os.path.isfile("rep/untuned/report.md")
    assert "Tuned against untuned verdicts" in report
    capsys.readouterr()
    counts = {name: len(study.get_trials()) for name, study in studies.items()}
    assert _compare(argv) == 0  # everything done: no trial and no run again
    assert {name: len(study.get_trials()) for name, study in _studies().items()} == counts
    assert ": training" not in capsys.readouterr().out


def _check_side_by_side(report, untuned_csv, tuned_csv):
    """The tuning section's table per metric holds each head's value of either arm's own runs
    (runs.csv: eval.py's numbers; one seed each) and their difference."""
    import csv

    from comparison.analysis.margins import METRIC_TABLE
    from test_tuning_report import side_by_side_rows

    arms = [{r["variant"]: r for r in csv.DictReader(open(path))} for path in (untuned_csv, tuned_csv)]
    for metric, rule in METRIC_TABLE.items():
        rows = side_by_side_rows(report, metric)
        assert sorted(rows) == sorted(arms[1])
        scale, digits = (100, 0.005) if rule.in_points else (1, 5e-5)
        for head, (before, after, difference) in rows.items():
            expected = [scale * float(arm[head][metric]) for arm in arms]
            assert [before, after] == pytest.approx(expected, abs=digits + 1e-6)
            assert difference == pytest.approx(expected[1] - expected[0], abs=10 * digits)


class StandIn:
    """A trainer for VariantStudy without train.py: it writes the epochs.csv rows train.py would,
    scores falling with the trial number; `diverge`: the trial numbers that exit 3 (a non-finite loss)."""

    def __init__(self, diverge=()):
        self.calls, self.diverge = [], diverge

    def start(self, run_dir, overrides):
        return os.path.isfile(os.path.join(run_dir, "epochs.csv"))

    def train(self, overrides, run_dir, fresh):
        import csv

        number = int(run_dir.rsplit("-", 1)[1])
        epoch = int(next(o for o in overrides if o.startswith("train.pause_after=")).split("=")[1])
        self.calls.append((number, epoch))
        if number in self.diverge:
            return 3  # train.py's exit for a non-finite loss
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, "epochs.csv"), "a", newline="") as f:
            csv.writer(f).writerows(([["epoch", "raw_top1"]] if epoch == 1 else []) + [[epoch, 0.9 - 0.1 * number]])
        return 0


def _study(tmp_path, trials, db="s.db"):
    from comparison.tuning import VariantStudy, search_space
    from comparison.tuning_storage import open_storage

    return VariantStudy(storage=open_storage(f"sqlite:///{tmp_path}/{db}"), name="c/softmax", head="softmax",
                        space=search_space("softmax", [], 10), overrides=["head.name=softmax"], trials=trials,
                        epochs=4, eval_every=1, pruner="median", seed=0, trials_dir=str(tmp_path / "trials" / db),
                        say=lambda m: None)


def test_the_budget_is_complete_trials_pruned_ones_extra_diverged_ones_scored_0(tmp_path):
    """Later trials score lower and are pruned past half the budget; they do not count, so the study
    runs on to 4 complete trials; a non-finite loss completes with top-1 0."""
    from comparison.tuning import DIVERGED, EPOCHS

    study, trainer = _study(tmp_path, trials=4), StandIn(diverge=(5,))
    assert study.optimize(trainer) == 6
    trials = study.study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3 + ["PRUNED"] * 2 + ["COMPLETE"]
    assert [t.user_attrs[EPOCHS] for t in trials] == [4, 4, 4, 3, 3, 1]  # pruned at the first epoch past half
    assert trials[5].value == 0.0 and trials[5].user_attrs[DIVERGED]
    assert study.optimize(trainer) == 0 and len(trainer.calls) == 12 + 6 + 1  # a finished study runs nothing more


def test_a_trial_stopped_by_a_signal_is_queued_again_and_resumes_in_its_folder(tmp_path):
    """train.py exits 143 (SIGTERM, checkpoint saved): optimize() fails the trial, which is queued again
    before the process exits; the rerun resumes it in its folder and ends at the budget."""
    from common.children import StoppedBySignal

    study, trainer = _study(tmp_path, trials=2), StandIn()
    train = trainer.train

    def sigterm_in_trial_1s_epoch_2(overrides, run_dir, fresh):  # train.py's exit after saving, on SIGTERM
        return 143 if len(trainer.calls) == 5 else train(overrides, run_dir, fresh)

    trainer.train = sigterm_in_trial_1s_epoch_2
    with pytest.raises(StoppedBySignal):
        study.optimize(trainer)
    trials = study.study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "WAITING"]
    assert trials[2].params == trials[1].params and trials[2].user_attrs["tune.run_dir"].endswith("trial-0001")
    trainer.train = train
    assert study.optimize(trainer) == 1
    trials = study.study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"] and study.complete() == 2
    assert trainer.calls[4:] == [(1, 1), (1, 2), (1, 3), (1, 4)]  # stopped in epoch 2; epoch 1 read back, not retrained


def test_a_trial_started_past_the_taken_budget_gives_itself_back(tmp_path):
    """Two workers asking at once: of two running trials, the later-numbered one yields when complete,
    waiting and earlier running trials take the budget; it never trains."""
    study = _study(tmp_path, trials=2)
    first = study.study.ask()
    study.study.tell(first, 0.5)
    early, late = study.study.ask(), study.study.ask()
    assert not study._surplus(early) and study._surplus(late)
    trainer = StandIn()
    study.trainer = trainer
    with pytest.raises(Exception, match="budget of 2 is taken"):
        study.objective(late)
    assert trainer.calls == [] and late.user_attrs["tune.surplus"]


def test_the_sampler_is_seeded_per_trial_number(tmp_path):
    """Two storages, the same study: the same settings per trial number (whoever runs it); the numbers
    draw different ones (two workers seeded alike would not)."""
    a, b = _study(tmp_path, 3, "a.db"), _study(tmp_path, 3, "b.db")
    drawn = [[tuple(o for o in s.trial_overrides(s.study.ask())[1] if o.startswith("optim.")) for _ in range(3)]
             for s in (a, b)]
    assert drawn[0] == drawn[1] and len(set(drawn[0])) == 3


def test_a_tuned_comparisons_plain_words_say_what_was_tuned(monkeypatch):
    from comparison.report import plain_words

    res = {"variant": "sparsemax", "baseline": "softmax", "learned": {},
           "across": {"top1": {"n_seeds": 3, "significant": False}}}
    assert "tuning each head" in plain_words.settle_line([res], rising=True)
    token = plain_words.TUNED.set({"settings": ["optim.lr", "head.k"], "complete": {"softmax": 5, "sparsemax": 5}})
    try:
        line = plain_words.settle_line([res], rising=True)
    finally:
        plain_words.TUNED.reset(token)
    assert "tuning each head" not in line and "tuned already: optim.lr, head.k; 5 complete trials per head" in line
