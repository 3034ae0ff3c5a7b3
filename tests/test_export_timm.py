"""scripts/export.py --format timm (exporting/timm_folder.py): a folder timm's own code loads strictly
(create_model with checkpoint_path, and local-dir: where the installed timm has it) with this run's logits, its eval
transform in pretrained_cfg and its labels; the runs timm has no model for are refused in one line.
And class_map.txt: timm's folder reader, given it, labels numeric folders in this project's order."""
import json
import os

import numpy as np
import pytest
import timm
import torch
import yaml
from PIL import Image
from safetensors.torch import save_file

import export  # scripts/export.py, the entry point (tests/conftest.py puts scripts/ on sys.path)
from configs.loader import config_from_dict, config_to_dict
from data.classes import save_class_names
from data.imagefolder import find_classes
from exporting import timm_folder
from models import create_classifier
from test_train_helpers import ROOT

CLASSES = ["1", "10", "2"]  # this project's order (string sort); timm's own would be 1, 2, 10
DATA = {"image_size": 224, "train_crop": "rrc", "crop_pct": 0.9, "interpolation": "bilinear", "mean": [0.5, 0.4, 0.3],
        "std": [0.2, 0.25, 0.3]}


def make_run(root, name="resmlp_s12", head="sparsemax", weights=True, **model):
    run = root / f"run_{name}_{head}_{'_'.join(map(str, model.values()))}"
    run.mkdir()
    cfg = config_from_dict({"model": {"name": name, **model}, "head": {"name": head}, "data": DATA})
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg)))
    save_class_names(str(run), CLASSES)
    if not weights:  # a run the export must refuse before it reads any weights
        (run / "model.safetensors").write_bytes(b"")
        return run, None
    net = create_classifier(cfg.model, cfg.head, len(CLASSES), img_size=cfg.data.image_size)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for key, p in net.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.5 if key.startswith("head") else 0.02))
    save_file(net.state_dict(), str(run / "model.safetensors"))
    return run, net.eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("timm")
    run, net = make_run(root)
    export.main([str(run), "--format", "timm"])
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        return run / "timm", net, x, net(x)


def test_timm_loads_the_export_strictly_with_equal_logits(exported):
    folder, net, x, want = exported
    assert sorted(os.listdir(folder)) == ["README.md", "class_map.txt", "config.json", "model.safetensors"]
    by_file = timm.create_model("resmlp_12_224", checkpoint_path=str(folder / "model.safetensors"),
                                num_classes=3).eval()  # timm's load_checkpoint: strict
    with torch.no_grad():
        assert (by_file(x) - want).abs().max().item() <= 1e-5
    if "local-dir" not in getattr(timm.models._factory, "_MODEL_SOURCES", ()):
        pytest.skip(f"timm {timm.__version__} has no local-dir: model source")
    by_dir = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
    with torch.no_grad():
        assert (by_dir(x) - want).abs().max().item() <= 1e-5
    data_cfg = timm.data.resolve_data_config(model=by_dir)  # what timm's validate.py / inference.py use
    assert (data_cfg["crop_pct"], data_cfg["interpolation"]) == (0.9, "bilinear")
    assert tuple(data_cfg["input_size"]) == (3, 224, 224) and tuple(data_cfg["mean"]) == (0.5, 0.4, 0.3)
    assert by_dir.pretrained_cfg["label_names"] == CLASSES


def test_config_says_which_head_and_how_to_get_its_probabilities(exported):
    from entmax import sparsemax  # an independent implementation of the head's mapping

    folder, net, x, want = exported
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == "resmlp_12_224" and config["num_classes"] == 3
    assert config["label_names"] == CLASSES and config["pretrained_cfg"]["crop_pct"] == 0.9
    head = config["head"]
    assert head["name"] == "sparsemax" and head["probabilities"].startswith("entmax.sparsemax(logits, dim=-1)")
    with torch.no_grad():
        torch.testing.assert_close(sparsemax(want, dim=-1), net.output_head(want), atol=1e-6, rtol=0)
    card = (folder / "README.md").read_text()
    assert "library_name: timm" in card and "entmax.sparsemax" in card and "logits" in card


@pytest.mark.parametrize("name", ["resmlp_s12", "resmlp_s24", "resmlp_s36", "resmlp_b24"])
def test_every_paper_variant_has_timms_names_and_shapes(name):
    """The converted state dict of each full-size variant has exactly the names and shapes of its
    timm architecture (on the meta device: no memory, no time); S12's logits are checked above."""
    from models.convert import to_timm_state_dict
    from models.resmlp import TIMM_ARCHITECTURES, create_resmlp

    with torch.device("meta"):
        ours = create_resmlp(name, num_classes=5)
        theirs = timm.create_model(TIMM_ARCHITECTURES[name], num_classes=5)
    shapes = lambda state: {k: tuple(v.shape) for k, v in state.items()}  # noqa: E731
    assert shapes(to_timm_state_dict(ours.state_dict())) == shapes(theirs.state_dict())


@pytest.mark.parametrize("name,head,model,why", [
    ("resmlp_tiny", "softmax", {}, "timm has no architecture for resmlp_tiny"),
    ("resmlp_cifar_s12", "softmax", {}, "timm has no architecture for resmlp_cifar_s12"),
    ("resmlp_s12", "softmax", {"norm": "layernorm"}, "Affine norm only; this run uses model.norm=layernorm"),
    ("resmlp_s12", "am_softmax", {}, "cosine classifier"),
    ("resmlp_s12", "softmax", {"pool": "hopfield"}, "pools by averaging; this run uses model.pool=hopfield"),
])
def test_runs_timm_has_no_model_for_are_refused_in_one_line(tmp_path, capsys, name, head, model, why):
    from common.cli import run_cli

    run, _ = make_run(tmp_path, name, head, weights=False, **model)
    with pytest.raises(SystemExit) as e:
        run_cli(export.main, [str(run), "--format", "timm"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and why in err and err.count("\n") == 1, err
    assert not (run / "timm").exists()


def test_class_map_gives_timm_our_label_order_for_numeric_folders(tmp_path):
    root = tmp_path / "train"
    for name in ("1", "2", "10"):
        (root / name).mkdir(parents=True)
        Image.fromarray(np.full((8, 8, 3), int(name), np.uint8)).save(root / name / "a.png")
    names = find_classes(str(tmp_path))
    assert names == CLASSES  # this project's label order: string sort
    save_class_names(str(tmp_path), names)
    plain = timm.data.ImageDataset(str(root))
    mapped = timm.data.ImageDataset(str(root), class_map=str(tmp_path / "class_map.txt"))
    assert [plain.reader.class_to_idx[n] for n in names] == [0, 2, 1]  # timm alone: natural order
    label_of = {os.path.basename(os.path.dirname(path)): label for path, label in mapped.reader.samples}
    assert [label_of[n] for n in names] == [0, 1, 2]


@pytest.mark.parametrize("head", ["softmax", "sparsemax"])
def test_the_model_card_words_the_logits_per_head_and_names_the_licence(head):
    config = {"architecture": "resmlp_12_224", "num_classes": 3, "pretrained_cfg": {
        "input_size": [3, 224, 224], "crop_pct": 0.9, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.2] * 3},
        "head": {"name": head, "doc": "a head", "sparse": head != "softmax",
                 "probabilities": timm_folder._PROBABILITIES[head]}}
    card = timm_folder.model_card(config)
    front = yaml.safe_load(card.split("---\n")[1])
    assert front["license"] == "apache-2.0" and front["library_name"] == "timm"
    assert "Apache License" in open(os.path.join(ROOT, "LICENSE")).read(2000)  # the licence the card names
    if head == "softmax":
        assert "as timm's classifiers do: their softmax is the head's probabilities" in card
        assert "not timm's usual softmax inputs" not in card
    else:
        assert "not timm's usual softmax inputs" in card and "`entmax.sparsemax(logits, dim=-1)" in card
