"""The export sidecar carries the evaluation transform each recipe really uses: a consumer that
reads only the sidecar (scripts/onnx_predict.py: onnxruntime, numpy and Pillow; no torch, no timm,
nothing of this project but its sidecar reader common/sidecar_format.py, loaded by its path)
gives eval.py's top-1 on every image and the sparse head's supports exactly, for the pad recipe on
odd-sized folder images, the DeiT (rrc) recipe, the built-in data and CIFAR. The consumer runs in
its own process, which checks what it imported; copied with sidecar_format.py out of the project it
still runs. An edited sidecar (a key missing, of the wrong type or value, a class twice, one that
does not fit the model) is one line; an unreadable image is skipped and listed, as predict.py does."""
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from safetensors.torch import save_file

import data
import export  # scripts/export.py, the entry point (tests/conftest.py puts scripts/ on sys.path)
from common import sidecar_format
from configs.loader import config_from_dict, config_to_dict
from data.classes import save_class_names
from exporting.exporter import checked_sidecar
from models import create_classifier
from test_data_sources import write_cifar
from test_train_helpers import ROOT, reset_accelerate_state, subprocess_env

pytest.importorskip("onnxruntime")

CONSUMER = os.path.join(ROOT, "scripts", "onnx_predict.py")
CLASSES = [f"c{i}" for i in range(10)]
SIZES = [(37, 53), (50, 33), (32, 32), (41, 41), (90, 31), (33, 47), (64, 48), (35, 35)]
# recipe -> (data settings, head); the rrc recipe with settings that differ from every default
RECIPES = {
    "pad": ({"dataset": "imagefolder", "train_crop": "pad"}, "sparsemax"),
    "rrc": ({"dataset": "imagefolder", "train_crop": "rrc", "crop_pct": 0.8, "interpolation": "bilinear"}, "entmax15"),
    "builtin": ({"dataset": "builtin10", "builtin_val_size": 24}, "sparsemax"),
    "cifar": ({"dataset": "cifar10"}, "sparsemax"),
}


def write_folder(root, n_per_class=3, seed=0):
    """ROOT/{train,val}/<class>/ of noise images at odd sizes, some gray, some RGBA, some JPEG."""
    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for c, name in enumerate(CLASSES):
            os.makedirs(os.path.join(root, split, name))
            for j in range(n_per_class if split == "val" else 1):
                w, h = SIZES[(c + j) % len(SIZES)]
                pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
                image = Image.fromarray(pixels)
                image = image.convert(("RGB", "L", "RGBA")[(c + j) % 3])
                ext = ".jpg" if image.mode != "RGBA" and j == 1 else ".png"
                image.save(os.path.join(root, split, name, f"{j}{ext}"))


def image_files(cfg, folder):
    """The val images as files in eval.py's order (folder datasets: their own files)."""
    ds = data.build_dataset(cfg.data, "val")
    if hasattr(ds, "samples"):
        return [path for path, _ in ds.samples]
    os.makedirs(folder)
    paths = [os.path.join(folder, f"{i:03d}.png") for i in range(len(ds))]
    for i, path in enumerate(paths):
        Image.fromarray(ds.images[i].permute(1, 2, 0).numpy()).save(path)
    return paths


def make_run(root, recipe):
    settings, head = RECIPES[recipe]
    data_root = os.path.join(root, "data")
    if settings["dataset"] == "imagefolder":
        write_folder(data_root)
    elif settings["dataset"] == "cifar10":
        write_cifar(data_root, "cifar10", n_train=10, n_test=24)
    cfg = config_from_dict({"model": {"name": "resmlp_tiny"},
                            "data": {**settings, "root": data_root, "image_size": 32, "num_workers": 0,
                                     "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]},
                            "head": {"name": head}})
    model = create_classifier(cfg.model, cfg.head, len(CLASSES), img_size=cfg.data.image_size)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # spread the weights so the sparse heads have zeros and small shifts move the top-1
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.5 if name.startswith("head") else 0.05))
    run = os.path.join(root, "run")
    os.makedirs(run)
    with open(os.path.join(run, "config.yaml"), "w") as f:
        yaml.safe_dump(config_to_dict(cfg), f)
    names = list(data.class_names(cfg.data))
    save_class_names(run, names)
    save_file(model.state_dict(), os.path.join(run, "model.safetensors"))
    return run, cfg


def eval_py(run, output):
    """eval.py's own per-image records (pred, support_size) and, from its model and dataset, the supports."""
    import eval as eval_entry
    from evaluation.examples import load_examples
    from inference.trained_run import open_run

    reset_accelerate_state()
    assert eval_entry.main(["--checkpoint", run, "--output", output, "--calib", "none", "--quiet"]) in (0, None)
    records, _ = load_examples(output.replace(".json", ".examples.safetensors"))
    opened = open_run(run)
    cfg, model = opened.cfg, opened.build_model(10)
    ds = data.build_dataset(cfg.data, "val")
    with torch.no_grad():
        probs = model.output_head(model(torch.stack([ds[i][0] for i in range(len(ds))])))
    supports = [torch.nonzero(p > 0).flatten().tolist() for p in probs]
    return records["pred"].tolist(), records["support_size"].tolist(), supports


CONSUMER_RUN = """
import json, os, runpy, sys
root, jobs = sys.argv[1], json.loads(sys.argv[2])
sys.path.insert(0, os.path.dirname(sys.argv[3]))  # as `python scripts/onnx_predict.py` has its folder first
predict = runpy.run_path(sys.argv[3])["predict"]
out = {recipe: predict(model, files) for recipe, (model, files) in jobs.items()}
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "timm", "torchvision"))
ours = sorted(getattr(m, "__file__", None) or "" for m in list(sys.modules.values()))
ours = [f for f in ours if f.startswith(root) and not f.endswith(("onnx_predict.py", "sidecar_format.py"))
        and not f.startswith(sys.prefix + os.sep)]  # a project .venv lies under the root: its packages are not ours
print(json.dumps({"rows": out, "loaded": loaded, "ours": ours}))
"""


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """Per recipe: eval.py's results and the sidecar-only consumer's, from one consumer process."""
    jobs, reference = {}, {}
    for recipe in RECIPES:
        root = str(tmp_path_factory.mktemp(recipe))
        run, cfg = make_run(root, recipe)
        export.main([run, "--format", "onnx", "--head-probabilities"])
        reference[recipe] = eval_py(run, os.path.join(root, "eval.json"))
        jobs[recipe] = (os.path.join(run, "model.onnx"), image_files(cfg, os.path.join(root, "files")))
    env = {k: v for k, v in subprocess_env().items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", CONSUMER_RUN, ROOT, json.dumps(jobs), CONSUMER],
                          capture_output=True, text=True, env=env, cwd=str(tmp_path_factory.getbasetemp()))
    assert done.returncode == 0, done.stderr
    return reference, json.loads(done.stdout)


def test_the_consumer_imports_neither_torch_nor_timm_nor_the_project(deployed):
    _, got = deployed
    assert got["loaded"] == [] and got["ours"] == []


@pytest.mark.parametrize("recipe", RECIPES)
def test_sidecar_alone_reproduces_eval_predictions_and_supports(deployed, recipe):
    reference, got = deployed
    preds, support_sizes, supports = reference[recipe]
    rows = got["rows"][recipe]
    assert len(rows) == len(preds) >= 24
    assert [r["pred"] for r in rows] == preds  # every image
    assert [len(r["support"]) for r in rows] == support_sizes
    assert [r["support"] for r in rows] == supports
    assert 1 < np.mean(support_sizes) < 10  # the supports are real prediction sets, not all classes


def test_sidecar_and_pretrained_cfg_describe_each_recipes_transform(tmp_path):
    import timm

    from common.weights import read_state_dict
    from data.transforms import eval_transform
    from inference.trained_run import model_from_state_dict
    from models.resmlp import create_resmlp

    for recipe, want in (("pad", (32, 1.0, "bicubic")), ("rrc", (40, 0.8, "bilinear"))):
        settings, _ = RECIPES[recipe]
        cfg = config_from_dict({"data": {**settings, "image_size": 32}, "model": {"name": "resmlp_tiny"}})
        pre = eval_transform(cfg.data).describe()
        assert (pre["resize"]["shorter_side"], pre["crop_pct"], pre["resize"]["interpolation"]) == want
        weights = str(tmp_path / f"{recipe}.safetensors")
        save_file(create_resmlp("resmlp_tiny", num_classes=10).state_dict(), weights)
        # what timm's tools read
        data_cfg = timm.data.resolve_data_config(
            model=model_from_state_dict(cfg, read_state_dict(weights), weights, 10))
        assert (data_cfg["crop_pct"], data_cfg["interpolation"]) == want[1:]
        assert tuple(data_cfg["mean"]) == tuple(cfg.data.mean) and data_cfg["input_size"] == (3, 32, 32)


def test_dali_eval_geometry_is_the_sidecars():
    """The DALI eval pipeline's resize and crop (data/dali_params.py) are the ones the sidecar states."""
    import runpy

    from data.dali_params import eval_geometry

    consumer = runpy.run_path(CONSUMER)
    sizes = np.array([(37, 53), (53, 37), (224, 224), (500, 375), (375, 500), (257, 301), (1000, 229)])
    for image_size, crop_pct in ((224, 0.875), (224, 0.9), (32, 0.8), (32, 1.0)):
        rw, rh, cx, cy = eval_geometry(sizes[:, 0], sizes[:, 1], image_size, crop_pct)
        shorter = math.floor(image_size / crop_pct)
        for (w, h), got in zip(sizes, zip(rw, rh, cx, cy)):
            rw_, rh_ = consumer["resized_size"](int(w), int(h), shorter)
            assert tuple(int(v) for v in got) == (rw_, rh_, *consumer["crop_offsets"](rw_, rh_, image_size))


# ------------------------------------------------------------------------------------------ edited sidecars
def _set(*keys, value):
    def edit(sidecar):
        target = sidecar
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


# case -> (the edit of a good sidecar, what the one line says); each was a traceback or silently accepted
EDITS = {
    "no classes": (lambda s: s.pop("classes"), "has no 'classes'"),
    "one class too few": (lambda s: s["classes"].pop(), "lists 9 classes but"),
    "unknown interpolation": (_set("preprocessing", "resize", "interpolation", value="lanczos"),
                              "'preprocessing.resize.interpolation' must be one of bicubic, bilinear, nearest, "
                              "not \"lanczos\""),
    "preprocessing of the wrong type": (_set("preprocessing", value=[1, 2]), "'preprocessing' must be an object, not a "
                                                                              "list of 2"),
    "another crop size": (_set("preprocessing", "center_crop", "size", value=[24, 24]),
                          "'preprocessing.center_crop.size' is 24x24 but"),
    "a class listed twice": (lambda s: s["classes"].__setitem__(2, s["classes"][1]), "twice (entries 2 and 3)"),
    "no resize size": (lambda s: s["preprocessing"]["resize"].pop("shorter_side"),
                       "has no 'preprocessing.resize.shorter_side'"),
    "a zero std": (_set("preprocessing", "std", value=[0.2, 0, 0.3]),
                   "'preprocessing.std' must be a list of 3 positive"),
    "an empty object": (lambda s: s.clear(), "has no 'format'"),
}


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory):
    """(model.onnx of a builtin10 run, its sidecar as written, an image, the consumer's namespace)."""
    import runpy

    root = tmp_path_factory.mktemp("edited")
    run, _ = make_run(str(root), "builtin")
    model = os.path.join(str(root), "model.onnx")
    export.main([run, "--format", "onnx", "--output", model])
    image = os.path.join(str(root), "photo.png")
    Image.new("RGB", (45, 29), (10, 120, 240)).save(image)
    with open(model + ".json") as f:
        return model, json.load(f), image, runpy.run_path(CONSUMER)


@pytest.mark.parametrize("case", EDITS)
def test_an_edited_sidecar_is_one_line(case, onnx_export, tmp_path, capsys):
    model, sidecar, image, consumer = onnx_export
    copy = str(tmp_path / "model.onnx")
    shutil.copy(model, copy)
    edit, says = EDITS[case]
    sidecar = json.loads(json.dumps(sidecar))
    edit(sidecar)
    with open(copy + ".json", "w") as f:
        json.dump(sidecar, f)
    assert consumer["main"]([copy, image]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {copy}.json") and says in err, err
    assert "export the model again" in err


def test_the_written_sidecar_passes_and_fits_its_model(onnx_export, capsys):
    model, sidecar, image, consumer = onnx_export
    assert consumer["main"]([model, image]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["class"] in sidecar["classes"]


def test_the_export_writes_no_sidecar_its_consumer_would_refuse(tmp_path):
    """export.py checks the sidecar with the consumer's check before it writes anything."""
    from common.errors import UserError

    cfg = config_from_dict({"model": {"name": "resmlp_tiny"}, "data": {"image_size": 32}})
    model = create_classifier(cfg.model, cfg.head, 3, img_size=32)
    output = str(tmp_path / "m.onnx")
    with pytest.raises(UserError, match=r"would refuse: .*'classes' lists 'b' twice \(entries 2 and 3\)"):
        checked_sidecar(cfg, model, ["a", "b", "b"], "onnx", False, output)
    assert checked_sidecar(cfg, model, ["a", "b", "c"], "onnx", False, output)["classes"] == ["a", "b", "c"]
    assert not os.listdir(tmp_path)


def test_the_sidecars_class_rule_is_the_projects():
    """One rule for every label order: data/classes.py's is the sidecar module's (which imports only the
    standard library, so the consumer has it too), in the words the edited-sidecar case above shows."""
    from data.classes import class_list_problem

    assert class_list_problem is sidecar_format.class_list_problem
    assert class_list_problem(["a", "b", "a"]) == "lists 'a' twice (entries 1 and 3)"
    assert class_list_problem(["a", " "]) == "has an empty class name (entry 2)" and class_list_problem(["a"]) is None


def test_the_consumer_runs_copied_out_of_the_project_with_its_sidecar_module(onnx_export, tmp_path):
    """A user copies onnx_predict.py and sidecar_format.py next to the model: it runs there, without the project."""
    model, sidecar, image, _ = onnx_export
    deployed = tmp_path / "deployed"
    deployed.mkdir()
    for path in (CONSUMER, sidecar_format.__file__, model, model + ".json", image):
        shutil.copy(path, deployed)
    env = {k: v for k, v in subprocess_env().items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "onnx_predict.py", "model.onnx", "photo.png"], cwd=str(deployed), env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    row = json.loads(done.stdout)
    assert row["file"] == "photo.png" and row["status"] == "ok" and row["class"] in sidecar["classes"]
    os.remove(deployed / "sidecar_format.py")  # without it: one line naming the file to copy
    done = subprocess.run([sys.executable, "onnx_predict.py", "model.onnx", "photo.png"], cwd=str(deployed), env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "needs sidecar_format.py beside it" in done.stderr


def truncated_png(path, size=64):
    """A PNG cut in half, as an interrupted copy leaves it: its header opens, its pixels do not decode."""
    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    with open(path, "rb") as f:
        whole = f.read()
    with open(path, "wb") as f:
        f.write(whole[:len(whole) // 2])


def test_unreadable_images_are_skipped_and_listed_as_predict_does(onnx_export, tmp_path, capsys):
    model, sidecar, image, consumer = onnx_export
    folder = tmp_path / "photos"
    folder.mkdir()
    shutil.copy(image, folder / "a.png")
    truncated_png(str(folder / "b.png"))
    (folder / "c.jpg").write_text("not an image")
    shutil.copy(image, folder / "d.png")
    out = str(tmp_path / "preds.jsonl")
    assert consumer["main"]([model, str(folder), "--output", out, "--batch-size", "2"]) == 0
    with open(out) as f:
        rows = [json.loads(line) for line in f]
    assert [(os.path.basename(r["file"]), r["status"]) for r in rows] == [
        ("a.png", "ok"), ("b.png", "unreadable"), ("c.jpg", "unreadable"), ("d.png", "ok")]
    assert "truncated" in rows[1]["error"] and rows[2]["error"].startswith("UnidentifiedImageError: ")
    assert rows[0]["class"] == rows[3]["class"] in sidecar["classes"]  # the same picture, the same class
    err = capsys.readouterr().err
    assert err == (f"warning: 2 unreadable file(s) skipped (first: {folder / 'b.png'}: {rows[1]['error']}); "
                   f"listed in {out} with status unreadable\n")
    # nothing readable: listed all the same, then one line and exit 2
    assert consumer["main"]([model, str(folder / "b.png"), "--output", out]) == 2
    with open(out) as f:
        assert [json.loads(line)["status"] for line in f] == ["unreadable"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and err[1] == f"error: none of the 1 file(s) could be read as an image (see {out})"
