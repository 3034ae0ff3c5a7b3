"""train.py in-process on a tiny config: outputs, optimizer/schedule, grad accumulation, bf16,
non-finite loss handling, resume refusals."""
import csv
import json
import os

import pytest
import torch

from common.errors import UserError
from configs import load_run_config
from hooked_train import FaultHooks
from models import create_classifier
from test_train_helpers import NO_AUG, read_metrics, run_inprocess, tiny_cfg, weights
from training.checkpoint import files as ck
from training.optim import build_optimizer, build_scheduler, scaled_lr

TRAIN_KEYS = {"kind", "step", "epoch", "loss", "lr", "img_per_s"}
EVAL_KEYS = {"kind", "step", "epoch", "weights", "top1", "top5", "loss", "support_size", "n"}


def test_short_run_learns_and_writes_wellformed_run_dir(tmp_path):
    run = str(tmp_path / "run")
    cfg = tiny_cfg(run, "optim.epochs=8", "train.eval_every=4", "train.log_with=tensorboard", *NO_AUG,
                   "optim.lr=2e-2", "optim.weight_decay=0.0", "head.name=entmax15")
    assert run_inprocess(cfg) == 0
    for name in ("config.yaml", "metrics.jsonl", "epochs.csv", "model.safetensors", "model_ema.safetensors",
                 "summary.json", "checkpoints"):
        assert os.path.exists(os.path.join(run, name)), name
    assert load_run_config(run) == cfg
    rows = read_metrics(run)
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert [r["step"] for r in train_rows] == list(range(1, 65))  # 8 updates/epoch x 8, log_every=1
    assert all(TRAIN_KEYS <= set(r) and r["loss"] == r["loss"] for r in train_rows)
    losses = [r["loss"] for r in train_rows]
    assert sum(losses[-8:]) / 8 < 0.85 * sum(losses[:8]) / 8  # it learns
    evals = [r for r in rows if r["kind"] == "eval"]
    assert [(r["epoch"], r["weights"]) for r in evals] == [(4, "raw"), (4, "ema"), (8, "raw"), (8, "ema")]
    assert all(EVAL_KEYS <= set(r) and r["n"] == 100 and 1 <= r["support_size"] <= 10 for r in evals)
    assert all(0 <= r["top5"] <= 1 and r["top1"] <= r["top5"] for r in evals)
    with open(os.path.join(run, "epochs.csv")) as f:
        epochs = list(csv.DictReader(f))
    assert [int(e["epoch"]) for e in epochs] == list(range(1, 9)) and \
        [int(e["step"]) for e in epochs] == list(range(8, 65, 8))
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["steps"] == 64 and summary["epochs"] == 8 and summary["final"]["raw"]["n"] == 100
    assert summary["final"]["raw"]["top1"] == evals[-2]["top1"]
    # the exported weights load strictly into the configured classifier (output head included)
    model = create_classifier(cfg.model, cfg.head, 10, img_size=cfg.data.image_size)
    model.load_state_dict(weights(run), strict=True)
    assert any(f.startswith("events") for _, _, fs in os.walk(os.path.join(run, "tensorboard")) for f in fs)
    # keep_last=2 plus the best one
    kept = [s for s, _ in ck.list_checkpoints(os.path.join(run, "checkpoints"))]
    assert kept[-2:] == [60, 64] and len(kept) <= 3 and summary["best"]["step"] in kept


def test_no_weight_decay_on_1d_params_and_learned_alpha():
    cfg = tiny_cfg("unused", "head.name=entmax_bisect", "head.learn_alpha=true")
    model = create_classifier(cfg.model, cfg.head, 10, img_size=cfg.data.image_size)
    opt = build_optimizer(model, cfg.optim, global_batch=64)
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    plain = {names[id(p)] for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    assert decayed and plain and decayed | plain == set(names.values())
    params = dict(model.named_parameters())
    assert all(params[n].ndim >= 2 for n in decayed)
    assert all(params[n].ndim <= 1 for n in plain)
    assert "output_head.alpha_logit" in plain and not any(n.endswith(".bias") for n in decayed)
    assert opt.param_groups[0]["lr"] == pytest.approx(scaled_lr(cfg.optim, 64)) == pytest.approx(5e-3 * 64 / 32)


def test_schedule_warmup_then_cosine_per_update():
    cfg = tiny_cfg("unused", "optim.epochs=3", "optim.warmup_epochs=1", "optim.warmup_lr=0.0", "optim.min_lr=0.0")
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = build_scheduler(opt, cfg.optim, updates_per_epoch=10)  # 30 updates, 10 warmup
    lrs = []
    for t in range(31):
        sched.step_update(t)
        lrs.append(opt.param_groups[0]["lr"])
    assert lrs[0] == 0.0 and lrs[5] == pytest.approx(0.5) and lrs[10] == pytest.approx(1.0)
    assert lrs[20] == pytest.approx(0.5) and lrs[30] == pytest.approx(0.0, abs=1e-12)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))


def test_grad_accumulation_equals_larger_batch(tmp_path):
    common = [*NO_AUG, "optim.epochs=1", "train.ema=false", "optim.name=adamw", "optim.lr=2e-3"]
    a = tiny_cfg(str(tmp_path / "a"), *common, "data.batch_size=16", "train.grad_accum=2")
    b = tiny_cfg(str(tmp_path / "b"), *common, "data.batch_size=32", "train.grad_accum=1")
    assert run_inprocess(a) == 0 and run_inprocess(b) == 0
    wa, wb = weights(str(tmp_path / "a")), weights(str(tmp_path / "b"))
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5
    assert [r["step"] for r in read_metrics(str(tmp_path / "a")) if r["kind"] == "train"] == list(range(1, 9))


def test_bf16_autocast_runs_on_cpu(tmp_path):
    run = str(tmp_path / "bf16")
    cfg = tiny_cfg(run, "train.mixed_precision=bf16", "optim.epochs=1", "head.name=sparsemax")
    assert run_inprocess(cfg) == 0
    rows = read_metrics(run)
    assert all(r["loss"] == r["loss"] for r in rows if r["kind"] == "train")
    assert all(v.dtype == torch.float32 for v in weights(run).values())  # master weights stay fp32


def test_nonfinite_loss_stops_naming_step_and_keeps_checkpoint(tmp_path, capsys):
    run = str(tmp_path / "nan")
    assert run_inprocess(tiny_cfg(run), hooks=FaultHooks(nan_at_step=7)) == 3
    err = capsys.readouterr().err
    assert "non-finite loss" in err and "step 7" in err and "step_000000005" in err
    latest = ck.find_latest(run)
    assert latest and latest.endswith("step_000000005") and ck.validation_error(latest) is None


def test_nonfinite_loss_skip_counts_skips(tmp_path):
    run = str(tmp_path / "skip")
    assert run_inprocess(tiny_cfg(run, "train.nonfinite=skip", "optim.epochs=1"), hooks=FaultHooks(nan_at_step=3)) == 0
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["skipped_steps"] == 1 and summary["steps"] == 8
    rows = [r for r in read_metrics(run) if r["kind"] == "train"]
    assert [r["skipped"] for r in rows] == [0, 0, 0, 1, 1, 1, 1, 1]
    assert rows[3]["loss"] is None and all(r["loss"] is not None for i, r in enumerate(rows) if i != 3)  # NaN -> null
    with open(os.path.join(run, "metrics.jsonl")) as f:  # strict JSON: no NaN/Infinity literals
        [json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")) for line in f]
    assert all(torch.isfinite(v).all() for v in weights(run).values())


def test_resume_refuses_other_config_and_truncated_files(tmp_path):
    run = str(tmp_path / "r")
    assert run_inprocess(tiny_cfg(run, "optim.epochs=1", "train.save_every=3")) == 0
    with pytest.raises(UserError, match="head.name='softmax'.*'sparsemax'"):
        run_inprocess(tiny_cfg(run, "optim.epochs=2", "head.name=sparsemax"), resume="auto")
    assert load_run_config(run).head.name == "softmax"  # a refused resume leaves the run dir alone
    with pytest.raises(UserError, match="model.norm"):
        run_inprocess(tiny_cfg(run, "optim.epochs=2", "model.norm=layernorm"), resume="auto")
    with pytest.raises(UserError, match="already holds a run"):
        run_inprocess(tiny_cfg(run, "optim.epochs=2"))
    latest = ck.find_latest(run)
    path = os.path.join(latest, "model.safetensors")
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(UserError, match="truncated") as err:
        run_inprocess(tiny_cfg(run, "optim.epochs=2"), resume=latest)
    assert "\n" not in str(err.value)
    # the truncated one is skipped by --resume auto, which takes the previous valid checkpoint
    assert ck.find_latest(run, warn=lambda m: None) != latest


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_bf16_run_with_learned_alpha(tmp_path):
    run = str(tmp_path / "cuda")
    cfg = tiny_cfg(run, "train.mixed_precision=bf16", "optim.epochs=2", "head.name=entmax_bisect",
                   "head.learn_alpha=true")
    assert run_inprocess(cfg) == 0
    w = weights(run)
    assert "output_head.alpha_logit" in w and all(torch.isfinite(v).all() for v in w.values())
    summary = json.load(open(os.path.join(run, "summary.json")))
    assert summary["final"]["raw"]["n"] == 100 and summary["steps"] == 16


def test_one_seed_hash_vectorised_equals_scalar():
    import numpy as np

    from common.seeding import mix_seed, mix_seed_array

    positions = np.array([0, 1, 7, 2**40, -3], dtype=np.int64)
    assert [int(v) for v in mix_seed_array(5, "aug", 3, last=positions)] == \
        [mix_seed(5, "aug", 3, int(p)) for p in positions]
    seeds = {mix_seed(0, "step", s, m, r) for s in range(50) for m in range(2) for r in range(2)}
    assert len(seeds) == 200 and all(0 <= s < 2**63 for s in seeds)
    assert mix_seed("init") != mix_seed("loader") and mix_seed(1, 2) != mix_seed(2, 1)
    with pytest.raises(TypeError):
        mix_seed(1.5)
