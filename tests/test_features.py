"""Cached features (scripts/extract_features.py, data.dataset=features, models/linear_probe.py).

The central check: with augmentation off, a linear probe trained on cached features
equals the frozen-backbone probe trained on the images (model.pretrained + model.freeze=backbone),
same seed, to fp32 tolerance: the same classifier at step 0, the same final logits on val.
The source is a tiny builtin10 run trained here; the probes train on builtin100 (a new classifier)."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.errors import UserError
from test_train_helpers import NO_AUG, ROOT, reset_accelerate_state, run_inprocess, tiny_cfg

FAST = ["optim.epochs=2", "train.ema=false", "train.save_every=1000"]
PROBE_DATA = ["data.dataset=builtin100", "data.builtin_train_size=192", "data.builtin_val_size=64"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py



def extract(*args):
    """scripts/extract_features.py in this process (Accelerate's singletons reset first)."""
    import extract_features

    reset_accelerate_state()
    return extract_features.main([str(a) for a in args])


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    run_dir = str(tmp_path_factory.mktemp("src") / "run")
    assert run_inprocess(tiny_cfg(run_dir, *FAST)) == 0
    return run_dir


@pytest.fixture(scope="module")
def features(source, tmp_path_factory):
    """builtin100 features of the source (eval transform), with its OOD set, in shards of 50."""
    out = str(tmp_path_factory.mktemp("feat") / "f")
    assert extract("--checkpoint", source, "--output", out, "--shard-size", 50, "--ood", "auto", *PROBE_DATA) == 0
    return out


def _probe_cfgs(tmp_path, source, features, *extra):
    image = tiny_cfg(str(tmp_path / "image"), *PROBE_DATA, f"model.pretrained={source}", "model.freeze=backbone",
                     *NO_AUG, *FAST, *extra)
    cached = tiny_cfg(str(tmp_path / "cached"), "data.dataset=features", f"data.root={features}", *NO_AUG, *FAST,
                      *extra)
    return image, cached


def _setup(cfg):
    from training.run import setup

    reset_accelerate_state()
    run = setup(cfg, resume=None, overwrite=False)
    run.lock.release()
    run.logs.bar.close()
    return run


def _final_val_logits(run_dir, features_root=None):
    """Logits on val of the run's final weights, through eval.py's model and loader."""
    import configs
    import data
    from common.weights import read_state_dict
    from inference.trained_run import model_from_state_dict

    cfg = configs.load_run_config(run_dir, [])
    weights = os.path.join(run_dir, "model.safetensors")
    model = model_from_state_dict(cfg, read_state_dict(weights), weights, data.num_classes(cfg.data))
    loader = data.build_eval_loader(data.build_dataset(cfg.data, "val"), cfg.data, rank=0, world_size=1)
    with torch.no_grad():
        logits = [model(x) for x, _ in loader]
        labels = [y for _, y in loader]
    return torch.cat(logits), torch.cat(labels)


# ----------------------------------------------------------------------------- the equivalence
@pytest.mark.parametrize("head", ["softmax", "sparsemax", "am_softmax"])
def test_cached_probe_equals_frozen_backbone_probe_on_images(tmp_path, source, features, head):
    image_cfg, cached_cfg = _probe_cfgs(tmp_path, source, features, f"head.name={head}")
    # step 0: the same classifier (the image path's init stream; the source's 10-class one does not fit)
    start_image = _setup(image_cfg).learner.raw_model.state_dict()
    start_cached = _setup(cached_cfg).learner.raw_model.state_dict()
    head_keys = sorted(k for k in start_image if k.startswith(("head.", "output_head.")))
    assert head_keys == sorted(start_cached)
    for k in head_keys:
        assert torch.equal(start_image[k], start_cached[k]), k
    import shutil

    for cfg in (image_cfg, cached_cfg):
        shutil.rmtree(cfg.train.output_dir)
        assert run_inprocess(cfg) == 0
    logits_image, labels_image = _final_val_logits(image_cfg.train.output_dir)
    logits_cached, labels_cached = _final_val_logits(cached_cfg.train.output_dir)
    assert torch.equal(labels_image, labels_cached)
    assert logits_image.shape == (64, 100)
    trained = load_file(os.path.join(cached_cfg.train.output_dir, "model.safetensors"))["head.weight"]
    assert not torch.equal(trained, start_cached["head.weight"])  # it trained
    torch.testing.assert_close(logits_cached, logits_image, rtol=1e-4, atol=1e-5)
    # the same epochs.csv losses (same samplers, same batches)
    rows = [open(os.path.join(c.train.output_dir, "epochs.csv")).read().splitlines()[1:]
            for c in (image_cfg, cached_cfg)]
    assert len(rows[0]) == len(rows[1]) == 2


def test_the_source_classifier_is_fitted_as_the_image_path_fits_it(tmp_path, source):
    """Same classes as the source (builtin10): both paths load the source's classifier."""
    out = str(tmp_path / "f10")
    assert extract("--checkpoint", source, "--output", out, "--splits", "train", "val") == 0
    image = tiny_cfg(str(tmp_path / "image"), f"model.pretrained={source}", "model.freeze=backbone", *NO_AUG, *FAST)
    cached = tiny_cfg(str(tmp_path / "cached"), "data.dataset=features", f"data.root={out}", *NO_AUG, *FAST)
    src = load_file(os.path.join(source, "model.safetensors"))
    for cfg in (image, cached):
        got = _setup(cfg).learner.raw_model.state_dict()
        assert torch.equal(got["head.weight"], src["head.weight"]) and torch.equal(got["head.bias"], src["head.bias"])


# ----------------------------------------------------------------------------- the folder
def test_features_are_the_pre_logits_of_the_source_in_dataset_order(source, features):
    import configs
    import data
    from common.weights import read_state_dict
    from inference.trained_run import model_from_state_dict

    meta = json.load(open(os.path.join(features, "features.json")))
    assert meta["feature_dim"] == 128 and meta["counts"] == {"train": 192, "val": 64}
    assert meta["views"] == 1 and meta["augment"] is False and meta["ood"] == "builtin100_ood"
    from training.checkpoint.files import file_sha256

    assert meta["source"]["sha256"] == file_sha256(os.path.join(source, "model.safetensors"))
    assert json.load(open(os.path.join(features, "classes.json")))["classes"][:2] == data.class_names(
        configs.config_from_dict({"data": {"dataset": "builtin100"}}).data)[:2]
    assert sorted(os.listdir(os.path.join(features, "train"))) == [f"shard_{i:05d}.safetensors" for i in range(4)]
    shard = load_file(os.path.join(features, "train", "shard_00001.safetensors"))
    assert shard["features"].dtype == torch.float32 and shard["features"].shape == (50, 128)
    assert shard["labels"].dtype == torch.int64 and torch.equal(shard["index"], torch.arange(50, 100))
    # an independent forward of the val images through the source backbone
    cfg = configs.load_run_config(source, PROBE_DATA)
    weights = os.path.join(source, "model.safetensors")
    model = model_from_state_dict(configs.load_run_config(source, []), read_state_dict(weights), weights, 10)
    ds = data.build_dataset(cfg.data, "val")
    x = torch.stack([ds[i][0] for i in range(len(ds))])
    with torch.no_grad():
        want = model.forward_features(x).mean(dim=1)  # average pooling: the pre-logits
    got = data.build_dataset(configs.config_from_dict({"data": {"dataset": "features", "root": features}}).data, "val")
    torch.testing.assert_close(got.features, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got.labels, ds.labels)


def test_extraction_resumes_by_shard_and_refuses_other_settings(tmp_path, source):
    out = str(tmp_path / "f")
    args = ["--checkpoint", source, "--output", out, "--splits", "train", "--shard-size", 100]
    assert extract(*args) == 0
    first, second = (os.path.join(out, "train", f"shard_0000{i}.safetensors") for i in (0, 1))
    kept = open(first, "rb").read()
    removed = load_file(second)
    os.remove(second)
    os.utime(first, (1, 1))
    assert extract(*args) == 0
    assert os.stat(first).st_mtime == 1 and open(first, "rb").read() == kept  # skipped, untouched
    again = load_file(second)  # rewritten, the same tensors
    assert again.keys() == removed.keys() and all(torch.equal(again[k], removed[k]) for k in again)
    with pytest.raises(UserError, match="other settings") as err:
        extract(*args[:-1], 64)
    assert "\n" not in str(err.value)


def test_augmented_views_are_deterministic_and_differ(tmp_path, source):
    import configs
    import data

    runs = []
    for name in ("a", "b"):
        out = str(tmp_path / name)
        assert extract("--checkpoint", source, "--output", out, "--splits", "train", "--augment", "--views", 2,
                       "data.builtin_train_size=64") == 0
        runs.append(data.build_dataset(configs.config_from_dict(
            {"data": {"dataset": "features", "root": out, "hflip": 0.0, "crop_padding": 0}}).data, "train"))
    assert runs[0].views.shape == (2, 64, 128)
    assert torch.equal(runs[0].views, runs[1].views)
    assert not torch.allclose(runs[0].views[0], runs[0].views[1])
    assert torch.equal(runs[0].view(3), runs[0].views[1])  # epoch e trains on view e % K


def test_the_feature_train_loader_takes_the_image_loaders_samples(source, features):
    import configs
    import data

    img = configs.config_from_dict({"data": {"dataset": "builtin100", "image_size": 16, "builtin_train_size": 192,
                                             "builtin_val_size": 64, "batch_size": 32}}).data
    feat = configs.config_from_dict({"data": {"dataset": "features", "root": features, "batch_size": 32}}).data
    a = data.build_train_loader(data.build_dataset(img, "train"), img, seed=3, epoch=1, rank=1, world_size=2,
                                start_batch=1)
    b = data.build_train_loader(data.build_dataset(feat, "train"), feat, seed=3, epoch=1, rank=1, world_size=2,
                                start_batch=1)
    ya, yb = [y for _, y in a], [y for _, y in b]
    assert len(ya) == len(yb) == 2 and all(torch.equal(p, q) for p, q in zip(ya, yb))


# ----------------------------------------------------------------------------- bad inputs
def _one_line(err):
    text = str(err.value)
    assert text and "\n" not in text
    return text


def test_bad_feature_folders_are_one_line(tmp_path, features):
    import configs
    import data

    def load(root, split="train", **extra):
        cfg = configs.config_from_dict({"data": {"dataset": "features", "root": str(root), **extra}})
        return data.build_dataset(cfg.data, split)

    with pytest.raises(UserError, match="no such folder"):
        load(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no features.json") as err:
        load(tmp_path / "empty")
    _one_line(err)
    with pytest.raises(UserError, match="no calib features") as err:
        load(features, "calib")
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(features, bad)
    path = bad / "train" / "shard_00002.safetensors"
    t = load_file(path)
    t["features"] = t["features"][:, :64].contiguous()
    save_file(t, path)
    with pytest.raises(UserError, match="dimension 128") as err:
        load(bad)
    _one_line(err)
    for key, value in (("mixup", 0.8), ("cutmix", 1.0), ("reprob", 0.25), ("auto_augment", "rand-m9-mstd0.5")):
        with pytest.raises(UserError, match=f"data.{key}=.*cached features") as err:
            load(features, **{key: value})
        _one_line(err)


def test_bad_settings_of_a_features_run_are_one_line(tmp_path, source, features, one_line_error):
    from training.run import setup

    for extra, match in (([f"model.pretrained={source}"], "model.pretrained does not apply"),
                         (["data.mixup=0.8"], "data.mixup=0.8 is an image augmentation"),
                         (["train.distill=soft", f"train.teacher={source}"], "teacher needs the images"),
                         ([f"data.root={tmp_path / 'nowhere'}"], "no such folder")):
        cfg = tiny_cfg(str(tmp_path / "r"), "data.dataset=features", f"data.root={features}", *FAST, *extra)
        reset_accelerate_state()
        with pytest.raises(UserError, match=match) as err:
            setup(cfg, resume=None, overwrite=False)
        _one_line(err)
    line = one_line_error("eval", ["--checkpoint", source, "--dataset", "features", "--data-root", str(tmp_path)])
    assert "no features.json" in line


def test_bad_extraction_arguments_are_one_line(tmp_path, source, one_line_error):
    out = str(tmp_path / "f")
    for args, match in ((["--shard-size", "0"], "at least 1"), (["--ood", "nonsense"], "unknown --ood"),
                        (["--splits", "calib"], "data.calib_fraction > 0")):
        with pytest.raises(UserError, match=match) as err:
            extract("--checkpoint", source, "--output", out, *args)
        _one_line(err)
    # the command line: one line, exit 2
    assert "without --augment" in one_line_error("extract_features", ["--checkpoint", source, "--output", out,
                                                                      "--views", "2"])


def test_eval_reads_the_ood_features(tmp_path, source, features):
    import eval as eval_py

    cfg = tiny_cfg(str(tmp_path / "p"), "data.dataset=features", f"data.root={features}", *NO_AUG, *FAST,
                   "head.name=sparsemax")
    assert run_inprocess(cfg) == 0
    out = str(tmp_path / "p" / "eval.json")
    reset_accelerate_state()
    assert eval_py.main(["--checkpoint", cfg.train.output_dir, "--ood-dataset", "auto", "--output", out,
                         "--quiet"]) == 0
    result = json.load(open(out))
    assert result["dataset"] == "features" and result["ood"]["dataset"] == "features"
    assert result["ood"]["source"] == "builtin100_ood"  # what the plots and the report call it
    assert result["ood"]["n_in"] == result["ood"]["n_out"] == 64
    assert result["ood"]["memory"]["n"] > 0 and "knn" in result["ood"]["scores"]  # the cached train features
    assert result["selective"] and result["prediction_sets"]["methods"]


# ----------------------------------------------------------------------------- compare_heads --features
def test_compare_heads_runs_the_plan_on_cached_features(tmp_path, features):
    import compare_heads
    import configs

    cfg = tmp_path / "cmp.yaml"
    configs.save_config(tiny_cfg(str(tmp_path / "unused"), *NO_AUG, *FAST), str(cfg))
    runs, report = tmp_path / "runs", tmp_path / "report"
    argv = ["--config", str(cfg), "--features", features, "--heads", "softmax", "entmax15", "--seeds", "0", "1",
            "--runs-dir", str(runs), "--report-dir", str(report),
            "--no-mlflow"]  # the comparison's MLflow log has its own test (test_trackers.py): seconds here
    assert compare_heads.main(argv) == 0
    text = open(report / "report.md").read()
    assert "entmax15" in text and "softmax" in text and "OOD: builtin100_ood (cached features)" in text
    for name in ("runs.csv", "paired_statistics.json", "ood_histograms.png", "risk_coverage.png"):
        assert (report / name).is_file(), name
    result = json.load(open(runs / "entmax15-s1" / "eval.json"))
    assert result["dataset"] == "features" and result["ood"]["dataset"] == "features"
    assert result["prediction_sets"]["methods"] and result["selective"]
    saved = configs.load_run_config(str(runs / "entmax15-s1"), [])
    assert (saved.data.dataset, saved.data.root, saved.train.seed) == ("features", features, 1)
    # a rerun finds everything done
    assert compare_heads.main(argv) == 0


def test_compare_heads_refuses_bad_feature_arguments(tmp_path, features):
    import compare_heads

    base = ["--config", os.path.join(ROOT, "configs", "quickstart.yaml"), "--heads", "softmax"]
    for extra, match in ((["--features", str(tmp_path / "none")], "no such folder"),
                         (["--features", features, "data.dataset=builtin10"], "drop the override"),
                         (["--features", features, "--ood-dataset", "builtin10_ood"], "OOD features")):
        with pytest.raises(UserError, match=match) as err:
            compare_heads.main(base + extra + ["--dry-run", "--runs-dir", str(tmp_path / "r")])
        _one_line(err)


def test_ranks_share_the_shards_and_together_write_the_one_process_folder(tmp_path, source, features):
    """accelerate launch: rank r writes shards i % world == r; the union is the 1-process extraction."""
    import configs
    import data
    import extract_features

    class Rank:
        def __init__(self, rank, world):
            self.process_index, self.num_processes, self.is_main_process = rank, world, rank == 0
            self.device = torch.device("cpu")

    cfg = configs.load_run_config(source, PROBE_DATA)
    weights = os.path.join(source, "model.safetensors")
    model, _ = extract_features.build_source_model(cfg, weights, load_file(weights), 100, print)
    ds = data.build_dataset(cfg.data, "train")
    out = str(tmp_path / "f")
    written = []
    for rank in (1, 0):
        written.append(extract_features.extract_split(model, ds, cfg.data, out, "train", views=1, augment=False,
                                                      seed=0, shard_size=50, sha256="x" * 64,
                                                      accelerator=Rank(rank, 2)))
        names = sorted(os.listdir(os.path.join(out, "train")))
        if rank == 1:
            assert names == ["shard_00001.safetensors", "shard_00003.safetensors"]
    assert written == [2, 2]
    for i in range(4):
        ours = load_file(os.path.join(out, "train", f"shard_{i:05d}.safetensors"))
        ref = load_file(os.path.join(features, "train", f"shard_{i:05d}.safetensors"))
        assert torch.equal(ours["index"], ref["index"]) and torch.equal(ours["labels"], ref["labels"])
        torch.testing.assert_close(ours["features"], ref["features"], rtol=1e-5, atol=1e-6)
