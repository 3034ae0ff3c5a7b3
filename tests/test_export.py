"""scripts/export.py (exporting/exporter.py): ONNX and TorchScript exports of every head, checked
against eager PyTorch (onnxruntime on CPU for ONNX).

Tolerance: max |exported - eager| <= 1e-5 on logits and probabilities (float32; the measured
differences are ~1e-7). Eager probabilities take the CPU threshold path, the exports the device
path, so these tests also compare the two paths. The batch exported (2) differs from the batch
run (5): the batch dimension is dynamic.
"""
import json
import os

import pytest
import torch
import yaml
from safetensors.torch import save_file

import export  # scripts/export.py, the entry point (tests/conftest.py puts scripts/ on sys.path)
from common.errors import UserError
from configs.loader import config_from_dict, config_to_dict
from data.classes import save_class_names
from exporting.arguments import FILE_FORMATS
from exporting.destinations import SUFFIX
from exporting.exporter import EXPORT_OPSET
from models import create_classifier
from models.heads import HEAD_NAMES, SPARSE_HEAD_NAMES

ort = pytest.importorskip("onnxruntime")
TOLERANCE = 1e-5
CLASSES = [f"class_{i}" for i in range(10)]


def make_run(root, head="softmax", model=None, **head_settings):
    """A run directory as train.py leaves it (config.yaml, classes.json, model.safetensors), with
    weights spread out so that the sparse heads have zeros."""
    run = root / f"run_{head}"
    run.mkdir()
    cfg = config_from_dict({"model": {"name": "resmlp_tiny", **(model or {})}, "head": {"name": head, **head_settings},
                            "data": {"mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]}})
    model = create_classifier(cfg.model, cfg.head, len(CLASSES), img_size=cfg.data.image_size)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.5 if name.startswith(("head", "pool")) else 0.02))
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg)))
    save_class_names(str(run), CLASSES)
    save_file(model.state_dict(), str(run / "model.safetensors"))
    return run, model.eval()


def batch(seed=3):
    return torch.randn(5, 3, 32, 32, generator=torch.Generator().manual_seed(seed)) * 2


def run_export(run, fmt, *extra):
    return export.main([str(run), "--format", fmt, *extra])


def run_exported(path, fmt, x):
    if fmt == "onnx":
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (name,) = [i.name for i in session.get_inputs()]
        return torch.from_numpy(session.run(None, {name: x.numpy()})[0])
    with torch.no_grad():
        return torch.jit.load(str(path))(x)


@pytest.mark.parametrize("fmt", FILE_FORMATS)
@pytest.mark.parametrize("head", HEAD_NAMES)
def test_every_head_exports_probabilities_matching_eager(tmp_path, head, fmt):
    run, model = make_run(tmp_path, head)
    if fmt == "onnx" and model.output_head.spec.draws:  # perturbmax: a torch.Generator has no ONNX operator
        with pytest.raises(UserError, match="cannot be exported as onnx with --head-probabilities") as err:
            run_export(run, fmt, "--head-probabilities")
        assert "\n" not in str(err.value) and not (run / ("model" + SUFFIX[fmt])).exists()
        return
    run_export(run, fmt, "--head-probabilities")
    path = run / ("model" + SUFFIX[fmt])
    x = batch()
    with torch.no_grad():
        want = model.output_head(model(x))
    got = run_exported(path, fmt, x)
    assert got.shape == want.shape == (5, 10)
    diff = (got - want).abs().max().item()
    print(f"export parity {head} {fmt} probabilities: max abs diff {diff:.2e}")
    assert diff <= TOLERANCE
    torch.testing.assert_close(got.sum(-1), torch.ones(5), atol=1e-5, rtol=0)
    if head in SPARSE_HEAD_NAMES:  # the same zeros: the support is the prediction set
        assert (want == 0).any(), "test weights too flat: no zeros to compare"
        assert torch.equal(got == 0, want == 0)
    meta = json.loads((run / ("model" + SUFFIX[fmt] + ".json")).read_text())
    assert meta["output"] == "probabilities" and meta["head"]["name"] == head
    assert meta["classes"] == CLASSES and meta["mean"] == [0.5, 0.4, 0.3] and meta["std"] == [0.2, 0.25, 0.3]
    assert meta["image_size"] == 32 and meta["input"]["shape"] == ["batch", 3, 32, 32]
    assert meta["opset"] == (EXPORT_OPSET if fmt == "onnx" else None)


@pytest.mark.parametrize("fmt", FILE_FORMATS)
def test_logits_export_and_learned_alpha(tmp_path, fmt, recwarn, capsys):
    run, model = make_run(tmp_path, "entmax_bisect", learn_alpha=True, alpha=1.3)
    with torch.no_grad():
        model.output_head.alpha_logit.fill_(0.7)  # a trained alpha, not the initial one
    save_file(model.state_dict(), str(run / "model.safetensors"))
    out = tmp_path / "exported" / ("m" + SUFFIX[fmt])
    run_export(run, fmt, "--output", str(out))
    x = batch(4)
    with torch.no_grad():
        logits = model(x)
        probs = model.output_head(logits)
    assert (run_exported(out, fmt, x) - logits).abs().max().item() <= TOLERANCE
    assert json.loads(out.with_name(out.name + ".json").read_text())["output"] == "logits"
    recwarn.clear()  # the test's own torch.jit.load above warns too
    capsys.readouterr()
    run_export(run, fmt, "--output", str(out), "--head-probabilities", "--overwrite")
    # torch's expected tracer / deprecation warnings: one note instead, nothing alarming left
    assert not [w for w in recwarn if issubclass(w.category, (torch.jit.TracerWarning, FutureWarning))
                or "legacy TorchScript-based ONNX" in str(w.message)]
    assert "note: torch's tracer and deprecation warnings for this export were expected" in capsys.readouterr().out
    got = run_exported(out, fmt, x)
    assert (got - probs).abs().max().item() <= TOLERANCE and (probs == 0).any()
    meta = json.loads(out.with_name(out.name + ".json").read_text())
    assert meta["head"]["learn_alpha"] and abs(meta["head"]["alpha"] - float(model.output_head.alpha)) < 1e-6
    assert sorted(os.listdir(out.parent)) == sorted([out.name, out.name + ".json", "class_map.txt"])  # no temp files
    assert (out.parent / "class_map.txt").read_text().splitlines() == CLASSES  # timm's class_map format


def test_torchscript_export_keeps_the_input_size_error(tmp_path):
    run, _ = make_run(tmp_path, "sparsemax")
    run_export(run, "torchscript", "--head-probabilities")
    loaded = torch.jit.load(str(run / "model.torchscript.pt"))
    with pytest.raises(torch.jit.Error, match=r"does not match the model: expected \(B, 3, 32, 32\)"):
        loaded(torch.randn(1, 3, 64, 64))


def cli_error(capsys, argv):
    """(exit status, stderr) of the export entry point run on argv."""
    from common.cli import run_cli

    with pytest.raises(SystemExit) as e:
        run_cli(export.main, argv)
    return e.value.code, capsys.readouterr().err


def test_bad_inputs_are_one_line_and_non_zero(tmp_path, capsys):
    run, _ = make_run(tmp_path, "softmax")
    cases = {
        "checkpoint not found": [str(tmp_path / "missing"), "--format", "onnx"],
        "unknown --format 'tflite'; valid: onnx, torchscript, timm": [str(run), "--format", "tflite"],
        "unknown --format 'onnxx'; did you mean 'onnx'?": [str(run), "--format", "onnxx"],
        "is a weights file: say what to build": [str(run / "model.safetensors"), "--format", "onnx"],
    }
    for expected, argv in cases.items():
        status, err = cli_error(capsys, argv)
        assert status == 2 and expected in err and err.count("\n") == 1, (expected, err)
    run_export(run, "onnx")
    before = (run / "model.onnx").read_bytes()
    status, err = cli_error(capsys, [str(run), "--format", "onnx"])
    assert status == 2 and "exists; pass --overwrite" in err and err.count("\n") == 1
    assert (run / "model.onnx").read_bytes() == before  # nothing replaced without --overwrite


def test_a_failed_export_leaves_no_file(tmp_path, capsys, monkeypatch):
    run, _ = make_run(tmp_path, "normmax")

    def refuse(*args, **kwargs):
        with open(args[2], "wb") as f:  # a partial file, as an exporter dying half-way would leave
            f.write(b"partial")
        raise RuntimeError("Unsupported: ONNX export of operator foo\nmore detail")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    status, err = cli_error(capsys, [str(run), "--format", "onnx", "--head-probabilities"])
    assert status == 2 and err == ("error: head 'normmax' cannot be exported as onnx: "
                                   "Unsupported: ONNX export of operator foo\n")
    assert not [n for n in os.listdir(run) if n.startswith("model.onnx")]


def test_weights_file_with_model_and_head_flags(tmp_path):
    run, model = make_run(tmp_path, "entmax15")
    weights = tmp_path / "w.safetensors"
    weights.write_bytes((run / "model.safetensors").read_bytes())
    export.main([str(weights), "--format", "onnx", "--model", "resmlp_tiny", "--head", "entmax15",
                 "--head-probabilities", "data.dataset=builtin10"])
    x = batch(5)
    with torch.no_grad():
        want = model.output_head(model(x))
    assert (run_exported(tmp_path / "w.onnx", "onnx", x) - want).abs().max().item() <= TOLERANCE
    meta = json.loads((tmp_path / "w.onnx.json").read_text())
    assert len(meta["classes"]) == 10 and meta["head"] == {"name": "entmax15"}


@pytest.mark.parametrize("fmt", FILE_FORMATS)
@pytest.mark.parametrize("mapping", ["softmax", "sparsemax", "ksubset"])
def test_hopfield_pooling_exports(tmp_path, fmt, mapping):
    pool_k = {"pool_k": 5} if mapping == "ksubset" else {}
    run, model = make_run(tmp_path, "entmax15", model={"pool": "hopfield", "pool_mapping": mapping, **pool_k})
    run_export(run, fmt, "--head-probabilities")
    x = batch(6)
    with torch.no_grad():
        want = model.output_head(model(x))
        if mapping != "softmax":  # the pooling really is sparse for these weights
            assert (model.pooling_weights(x) == 0).any()
    diff = (run_exported(run / ("model" + SUFFIX[fmt]), fmt, x) - want).abs().max().item()
    print(f"export parity hopfield-{mapping} {fmt}: max abs diff {diff:.2e}")
    assert diff <= TOLERANCE


def test_a_runs_classes_json_must_fit_its_weights(tmp_path):
    """A class listed twice, or a count other than the weights' classifier: one line naming classes.json."""
    run, _ = make_run(tmp_path)
    for listed, says in (([CLASSES[0]] + CLASSES[:-1], f"lists {CLASSES[0]!r} twice (entries 1 and 2)"),
                         (CLASSES[:-1], "lists 9 classes but the weights")):
        save_class_names(str(run), listed)
        with pytest.raises(UserError) as err:
            run_export(run, "onnx")
        assert f"{run / 'classes.json'} {says}" in str(err.value) and "\n" not in str(err.value)
    assert not (run / "model.onnx").exists()
