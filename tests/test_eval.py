"""eval.py on tiny trained runs: reproduces train.py's accuracy, exact two-process gather, errors.

The runs come from the tiny comparison of tests/test_compare.py (trained once per session).
"""
import json
import os
import socket
import subprocess
import sys

import pytest
import torch

from test_compare import ROOT, tiny_run_dir
from test_train_helpers import reset_accelerate_state

EVAL = os.path.join(ROOT, "eval.py")


def _load(path):
    with open(path) as f:
        return json.load(f)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_eval_reproduces_train_accuracy():
    for head in ("softmax", "sparsemax"):
        run = tiny_run_dir(head)
        result = _load(os.path.join(run, "eval.json"))
        final = _load(os.path.join(run, "summary.json"))["final"]["raw"]
        assert result["n"] == final["n"] == 101
        assert result["top1"] == pytest.approx(final["top1"], abs=1e-9)
        assert result["top5"] == pytest.approx(final["top5"], abs=1e-9)
        assert result["loss"] == pytest.approx(final["loss"], rel=1e-4)
        assert result["support_mean"] == pytest.approx(final["support_size"], rel=1e-5)
        assert sum(result["support_hist"]) == 101 and sum(result["reliability"]["count"]) == 101
        calib = result["prediction_sets"]["calibration"]
        assert isinstance(calib.pop("aps_seed"), int)
        assert calib == {"source": "calib", "n_calib": 64, "n_eval": 101}  # 25% of 256 held out
        methods = result["prediction_sets"]["methods"]
        assert set(methods) == ({"support", "lac", "aps"} if head == "sparsemax" else {"lac", "aps"})
        for res in methods.values():
            assert set(res["eps"]) == {"0.1", "0.05"}
        if head == "softmax":
            assert result["support_coverage"] == 1.0 and result["zero_prob_frac"] == 0.0
    # The CSV row beside the JSON
    header = open(os.path.join(tiny_run_dir(), "eval.csv")).read().splitlines()[0].split(",")
    for col in ("top1", "ece", "support_mean", "img_per_s", "ps_support_eps0.05_size", "ps_aps_eps0.1_coverage"):
        assert col in header


def test_two_processes_give_the_same_numbers_as_one(tmp_path):
    """101 samples, batch 16, 2 gloo processes: shards of 51 and 50, last batches partial."""
    run = tiny_run_dir("sparsemax")
    out = tmp_path / "two.json"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()),
           EVAL, "--checkpoint", run, "--batch-size", "16", "--output", str(out), "--quiet"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one, two = _load(os.path.join(run, "eval.json")), _load(out)
    assert two["num_processes"] == 2 and one["num_processes"] == 1
    assert two["n"] == one["n"] == 101
    assert two["support_hist"] == one["support_hist"]
    assert two["reliability"]["count"] == one["reliability"]["count"]
    assert two["per_class_accuracy"] == pytest.approx(one["per_class_accuracy"], rel=1e-9)
    for key, value in one.items():
        if isinstance(value, float) and key not in ("img_per_s", "eval_seconds", "wall_seconds"):
            assert two[key] == pytest.approx(value, rel=1e-6, abs=1e-9), key
    for method, res in one["prediction_sets"]["methods"].items():
        for eps, r in res["eps"].items():
            r2 = two["prediction_sets"]["methods"][method]["eps"][eps]
            assert r2["coverage"] == r["coverage"] and r2["mean_set_size"] == r["mean_set_size"], (method, eps)
    assert two["prediction_sets"]["calibration"] == one["prediction_sets"]["calibration"]
    for conf, sel in one["selective"].items():
        assert two["selective"][conf]["aurc"] == pytest.approx(sel["aurc"], rel=1e-12)


def test_weights_file_with_model_flags_and_calibration_fallback(tmp_path, capsys, monkeypatch):
    """The EMA weights as a bare file + --model/--dataset flags: train.py's EMA accuracy again;
    with no calib split (defaults) prediction sets calibrate on half of val, and say so. The process
    group is destroyed once, before the main process writes (inference/processes.py)."""
    run = tiny_run_dir("softmax")
    out = tmp_path / "file.json"
    from accelerate import Accelerator

    import eval as eval_entry

    ended = []
    monkeypatch.setattr(Accelerator, "end_training", lambda self: ended.append(os.path.exists(out)))
    reset_accelerate_state()
    assert eval_entry.main(["--checkpoint", os.path.join(run, "model_ema.safetensors"), "--model", "resmlp_tiny",
                            "--dataset", "builtin10", "--data.builtin_val_size", "101", "--batch-size", "50",
                            "--output", str(out)]) == 0
    stdout = capsys.readouterr().out
    assert ended == [False]
    result = _load(out)
    final = _load(os.path.join(run, "summary.json"))["final"]["ema"]
    assert result["weights"] == "file" and result["head"] == "softmax" and result["n"] == final["n"] == 101
    assert result["top1"] == pytest.approx(final["top1"], abs=1e-9)
    assert result["loss"] == pytest.approx(final["loss"], rel=1e-4)
    calib = result["prediction_sets"]["calibration"]
    assert calib["source"] == "val-half" and calib["n_calib"] + calib["n_eval"] == 101
    assert "calib_fraction is 0" in stdout  # told on the terminal, not silently
    assert "top-1 acc" in stdout and "ECE (15 bins)" in stdout
    assert os.path.isfile(tmp_path / "file.csv")


def _cli_error(capsys, argv):
    import eval as eval_entry
    from common.cli import run_cli

    with pytest.raises(SystemExit) as exc:
        run_cli(eval_entry.main, argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def test_user_errors_are_one_line(tmp_path, capsys):
    run = tiny_run_dir("sparsemax")
    weights = os.path.join(run, "model.safetensors")
    assert "checkpoint not found" in _cli_error(capsys, ["--checkpoint", str(tmp_path / "nope")])
    empty = tmp_path / "empty_run"
    empty.mkdir()
    assert "model.safetensors" in _cli_error(capsys, ["--checkpoint", str(empty)])
    assert "--config" in _cli_error(capsys, ["--checkpoint", weights])
    assert "--ema" in _cli_error(capsys, ["--checkpoint", weights, "--ema", "--model", "resmlp_tiny"])
    # Weights for 10 classes evaluated on 100-class data: both counts are named, and the data as the cause.
    err = _cli_error(capsys, ["--checkpoint", run, "data.dataset=builtin100"])
    assert "data.dataset=builtin100 lists 100 classes but the weights" in err and "classify 10" in err
    # Another architecture: on the run, a change of what it trained (inference/run_config.py); the weights
    # file given as that architecture, weights that do not fit it
    err = _cli_error(capsys, ["--checkpoint", run, "model.name=resmlp_cifar_s12"])
    assert "was trained with model.name=resmlp_tiny" in err and "--accept-changed-model" in err
    err = _cli_error(capsys, ["--checkpoint", weights, "--model", "resmlp_cifar_s12"])
    assert "checkpoint" in err and "but the model expects" in err
    # --ema picks the run's EMA export
    from inference.trained_run import open_run
    opened = open_run(run, ema=True)
    cfg, path, kind = opened.cfg, opened.weights, opened.weights_kind
    assert path == os.path.join(run, "model_ema.safetensors") and kind == "ema"
    assert cfg.head.name == "sparsemax" and cfg.data.calib_fraction == 0.25
    # A config key typo is caught by the config loader
    assert "unknown config key" in _cli_error(capsys, ["--checkpoint", run, "data.datset=builtin10"])
    error = _cli_error(capsys, ["--checkpoint", run, "--frobnicate"])
    assert "unexpected argument '--frobnicate': options are listed by python eval.py --help" in error
    # No calibration split held out, but asked for explicitly
    assert "calib_fraction" in _cli_error(capsys, ["--checkpoint", weights, "--model", "resmlp_tiny",
                                                   "--calib", "calib", "--quiet"])


def test_gather_in_order_interleaves_uneven_shards():
    from evaluation.gather import _interleave

    full = torch.arange(11)
    shards = [full[r::3] for r in range(3)]  # 4, 4, 3 samples
    assert _interleave(shards).tolist() == full.tolist()


def test_training_eval_and_eval_py_agree_on_the_same_weights(tmp_path):
    """bf16 training: its periodic eval and eval.py both evaluate in float32 through the one loop,
    so their metrics agree (counts exactly, means to float64 rounding), for raw and EMA weights;
    the per-example records file holds the same numbers, row for row."""
    from safetensors.torch import load_file

    import eval as eval_entry
    from common.rundir import examples_path
    from data import build_dataset, build_eval_loader
    from evaluation.examples import load_examples
    from models import create_classifier
    from test_train_helpers import run_inprocess, tiny_cfg

    run = str(tmp_path / "bf16")
    cfg = tiny_cfg(run, "train.mixed_precision=bf16", "optim.epochs=1", "head.name=sparsemax",
                   "data.builtin_val_size=101", "data.eval_batch_size=16")
    assert run_inprocess(cfg) == 0
    final = _load(os.path.join(run, "summary.json"))["final"]
    for weights, flags in (("raw", []), ("ema", ["--ema"])):
        out = str(tmp_path / f"{weights}.json")
        reset_accelerate_state()
        assert eval_entry.main(["--checkpoint", run, "--output", out, "--quiet", "--calib", "none", *flags]) == 0
        result, train_eval = _load(out), final[weights]
        assert result["n"] == train_eval["n"] == 101
        assert result["top1"] == train_eval["top1"] and result["top5"] == train_eval["top5"]
        assert result["loss"] == pytest.approx(train_eval["loss"], rel=1e-12)
        assert result["support_mean"] == pytest.approx(train_eval["support_size"], rel=1e-12)
        records, meta = load_examples(examples_path(out))
        assert meta["head"] == "sparsemax" and meta["weights"] == weights and int(meta["n"]) == 101
        assert (records["pred"] == records["label"]).double().mean().item() == result["top1"]
        assert records["top5_hit"].double().mean().item() == result["top5"]
        assert records["support_size"].double().mean().item() == pytest.approx(result["support_mean"], rel=1e-12)
        # Independent reference: a plain fp32 forward over the val split in dataset order.
        model = create_classifier(cfg.model, cfg.head, 10, img_size=cfg.data.image_size).eval()
        model.load_state_dict(load_file(os.path.join(run, "model.safetensors" if weights == "raw"
                                                     else "model_ema.safetensors")))
        val = build_dataset(cfg.data, "val")
        with torch.no_grad():
            logits = torch.cat([model(x) for x, _ in build_eval_loader(val, cfg.data, rank=0, world_size=1)])
            probs = model.output_head(logits)
        labels = val.labels.long()
        assert torch.equal(records["label"], labels) and torch.equal(records["pred"], logits.argmax(1))
        assert torch.allclose(records["p_y"], probs.gather(1, labels[:, None]).squeeze(1), atol=1e-6)
        assert torch.equal(records["support_size"], (probs > 0).sum(1))


def _forward_probs(run, dataset_name=None):
    """Independent reference: the run's model, a plain fp32 forward over a val split in order."""
    import copy

    from safetensors.torch import load_file

    import configs
    from data import build_dataset, build_eval_loader
    from models import create_classifier

    cfg = configs.load_run_config(run, [])
    model = create_classifier(cfg.model, cfg.head, 10, img_size=cfg.data.image_size).eval()
    model.load_state_dict(load_file(os.path.join(run, "model.safetensors")))
    data_cfg = copy.deepcopy(cfg.data)
    if dataset_name:
        data_cfg.dataset = dataset_name
    ds = build_dataset(data_cfg, "val")
    with torch.no_grad():
        logits = torch.cat([model(x) for x, _ in build_eval_loader(ds, data_cfg, rank=0, world_size=1)])
        return model.output_head(logits).double()


def _brute_auroc(score_in, score_out):
    greater = (score_in[:, None] > score_out[None, :]).double().mean().item()
    ties = (score_in[:, None] == score_out[None, :]).double().mean().item()
    return greater + 0.5 * ties


def test_ood_detection_and_selective_prediction_in_eval_json():
    """The tiny runs were evaluated with the built-in OOD set (compare_heads passes it): AUROC of each
    score against a brute-force pair count over a plain forward of both splits; AURC against the
    mean selective risk of the records sorted by confidence; the records hold the FY loss."""
    from common.rundir import examples_path
    from evaluation.examples import load_examples

    for head in ("softmax", "sparsemax"):
        run = tiny_run_dir(head)
        result = _load(os.path.join(run, "eval.json"))
        ood = result["ood"]
        assert ood["dataset"] == "builtin10_ood" and ood["n_in"] == 101 and ood["n_out"] == 101 and ood["tpr"] == 0.95
        from evaluation.ood_scores import LOGIT_SCORES, MEMORY_SCORES

        expected = {"max_prob", "neg_entropy"} | ({"neg_support"} if head == "sparsemax" else set())
        assert set(ood["scores"]) == expected | set(LOGIT_SCORES) | set(MEMORY_SCORES)
        assert ood["memory"]["n"] == 192 and ood["memory"]["size"] == "all"  # the train split (256, 64 held out)
        assert os.path.isfile(os.path.join(run, "ood_memory.safetensors")) and ood["temperature"] == 1.0
        for score in ood["scores"].values():
            assert 0.0 <= score["auroc"] <= 1.0 and 0.0 <= score["fpr_at_tpr"] <= 1.0
        for hist in ood["histograms"].values():
            assert sum(hist["in"]) == 101 and sum(hist["out"]) == 101
            assert len(hist["edges"]) == len(hist["in"]) + 1
        p_in, p_out = _forward_probs(run), _forward_probs(run, "builtin10_ood")
        references = {"max_prob": (p_in.max(1).values, p_out.max(1).values),
                      "neg_entropy": (torch.special.xlogy(p_in, p_in).sum(1), torch.special.xlogy(p_out, p_out).sum(1))}
        if head == "sparsemax":
            references["neg_support"] = (-(p_in > 0).sum(1).double(), -(p_out > 0).sum(1).double())
        for name, (s_in, s_out) in references.items():
            assert ood["scores"][name]["auroc"] == pytest.approx(_brute_auroc(s_in, s_out), abs=2e-3), name

        records, _ = load_examples(examples_path(os.path.join(run, "eval.json")))
        assert records["loss"].double().mean().item() == pytest.approx(result["loss"], rel=1e-6)
        conf, errors = records["max_prob"].double(), (records["pred"] != records["label"]).double()
        order = torch.argsort(-conf, stable=True)
        if conf.unique().numel() == conf.numel():  # no ties: the plain sorted risk is exact
            risk = errors[order].cumsum(0) / torch.arange(1, 102)
            assert result["selective"]["max_prob"]["aurc"] == pytest.approx(risk.mean().item(), rel=1e-9)
        assert set(result["selective"]) == ({"max_prob", "support"} if head == "sparsemax" else {"max_prob"})
        sel = result["selective"]["max_prob"]
        assert sel["risk_at_coverage"]["1.0"] == pytest.approx(1 - result["top1"], abs=1e-12)
        assert sel["e_aurc"] == pytest.approx(sel["aurc"] - sel["optimal_aurc"])


def test_aps_seed_differs_per_run():
    """APS's uniforms are seeded per run: each head and each training seed draws its own."""
    import configs
    from evaluation.conformal import aps_seed

    seeds = {h: _load(os.path.join(tiny_run_dir(h), "eval.json"))["prediction_sets"]["calibration"]["aps_seed"]
             for h in ("softmax", "sparsemax")}
    assert seeds["softmax"] != seeds["sparsemax"]
    cfg = configs.load_run_config(tiny_run_dir("softmax"), [])
    assert aps_seed(cfg) == seeds["softmax"]
    assert aps_seed(configs.load_run_config(tiny_run_dir("softmax"), ["train.seed=1"])) != seeds["softmax"]


def test_ood_memory_is_built_once_and_never_used_for_other_weights(tmp_path, capsys):
    """A seeded subsample memory is stored in the run, reused by the next evaluation, and rebuilt
    (not used) once the weights change; --ood-memory none turns the feature scores off."""
    import shutil

    from safetensors.torch import load_file, save_file

    import eval as eval_entry
    from evaluation import feature_memory

    run = str(tmp_path / "run")
    # without its checkpoints: the weights below change as a run's do when it trains on, not against its record
    shutil.copytree(tiny_run_dir("softmax"), run, ignore=shutil.ignore_patterns("checkpoints"))
    os.remove(os.path.join(run, "ood_memory.safetensors"))
    argv = ["--checkpoint", run, "--ood-dataset", "auto", "--calib", "none", "--quiet", "--ood-memory", "20"]

    def ood(*extra):
        assert eval_entry.main(argv + ["--output", str(tmp_path / "e.json"), *extra]) == 0
        return _load(tmp_path / "e.json")["ood"]

    first = ood("--ood-temperature", "0.5")
    assert first["memory"]["n"] == 20 and first["memory"]["source"] == "built" and first["temperature"] == 0.5
    path = os.path.join(run, "ood_memory.safetensors")
    stored = load_file(path)
    second = ood("--ood-temperature", "0.5")
    assert second["memory"]["source"] == "stored" and second["scores"] == first["scores"]
    weights = load_file(os.path.join(run, "model.safetensors"))
    weights["head.bias"] = weights["head.bias"] + 1.0  # other weights, same shapes
    save_file(weights, os.path.join(run, "model.safetensors"))
    capsys.readouterr()
    third = ood()
    assert third["memory"]["source"] == "built" and "other weights" in capsys.readouterr().err
    assert feature_memory.load(path, "0" * 64, {})[0] is None
    assert torch.equal(load_file(path)["features"], stored["features"])  # the backbone did not change
    none = ood("--ood-memory", "none")
    assert none["memory"] is None and "knn" not in none["scores"] and "energy" in none["scores"]
    # --ood-dataset none (compare_heads' spelling) is eval.py's default: no OOD detection at all
    assert eval_entry.main(["--checkpoint", run, "--ood-dataset", "none", "--calib", "none", "--quiet",
                            "--output", str(tmp_path / "n.json")]) == 0
    assert _load(tmp_path / "n.json").get("ood") is None


def test_ood_user_errors_are_one_line(capsys):
    run = tiny_run_dir("sparsemax")
    for flag, value in (("--ood-temperature", "2"), ("--ood-memory", "10")):
        assert f"{flag} needs --ood-dataset" in _cli_error(capsys, ["--checkpoint", run, flag, value])
    assert "--ood-memory must be" in _cli_error(capsys, ["--checkpoint", run, "--ood-dataset", "auto",
                                                         "--ood-memory", "lots"])
    assert "unknown --ood-dataset 'builtin1O_ood'" in _cli_error(capsys, ["--checkpoint", run, "--ood-dataset",
                                                                           "builtin1O_ood"])
    assert "--ood-root needs --ood-dataset" in _cli_error(capsys, ["--checkpoint", run, "--ood-root", "x"])
    # none, as compare_heads spells it: no OOD detection, so an OOD-only flag beside it is refused as without it
    assert "--ood-memory needs --ood-dataset" in _cli_error(capsys, ["--checkpoint", run, "--ood-dataset", "none",
                                                                     "--ood-memory", "10"])
    err = _cli_error(capsys, ["--checkpoint", run, "--ood-dataset", "auto", "data.dataset=cifar10"])
    assert "no built-in OOD set" in err


def test_a_runs_classes_json_must_fit_its_weights(tmp_path, one_line_error):
    """RUN_DIR/classes.json with a class twice, or fewer classes than the weights classify: the file is named,
    not the dataset."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run_dir("softmax"), run, ignore=shutil.ignore_patterns("checkpoints"))
    names = _load(run / "classes.json")["classes"]
    for listed, says in (([names[0]] + names[:-1], f"lists {names[0]!r} twice (entries 1 and 2)"),
                         (names[:-1], "lists 9 classes but the weights")):
        (run / "classes.json").write_text(json.dumps({"classes": listed}))
        reset_accelerate_state()
        line = one_line_error("eval", ["--checkpoint", str(run), "--calib", "none", "--quiet"])
        assert f"{run / 'classes.json'} {says}" in line, line
