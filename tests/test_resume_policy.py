"""Resume policy: the whole config is the fingerprint; allowlisted keys change freely, others need
--resume-with-changes and are then applied for real (lr schedule rebuilt at the current step) and
recorded; frozen keys never change."""
import dataclasses
import json
import math

import pytest
import torch
import yaml

from common import rundir
from common.errors import UserError
from configs.schema import Config, OptimConfig
from training import resume_policy as rp
from training.optim import build_optimizer, build_scheduler


def _cfg_dict(**sections):
    data = dataclasses.asdict(Config())
    for section, values in sections.items():
        data[section].update(values)
    return data


def _fp(cfg_dict, num_classes=10, global_batch=256):
    return rp.resume_fingerprint(cfg_dict, num_classes=num_classes, global_batch=global_batch)


def test_flatten_config_and_json_round_trip_compare_equal():
    cfg = _cfg_dict()
    flat = _fp(cfg)
    assert flat["optim.lr"] == cfg["optim"]["lr"] and flat["data.mean"] == list(cfg["data"]["mean"])
    assert flat["run.num_classes"] == 10 and flat["run.global_batch"] == 256
    assert len(flat) == sum(len(v) if isinstance(v, dict) else 1 for v in cfg.values()) + 2
    saved = json.loads(json.dumps(flat))  # what trainer_state.json gives back (tuples became lists)
    assert rp.check_resume_changes(saved, _fp(cfg), checkpoint="ck") == []


def test_allowlisted_keys_change_freely():
    saved = _fp(_cfg_dict())
    current = _fp(_cfg_dict(train={"log_every": 1, "eval_every": 3, "save_every": 7, "keep_last": 9,
                                   "output_dir": "elsewhere", "progress": False, "log_with": "none",
                                   "compile": True, "nonfinite": "skip"},
                            data={"num_workers": 16, "eval_batch_size": 1, "root": "copy/on/local/disk"}))
    assert rp.check_resume_changes(saved, current, checkpoint="ck") == []
    assert {"train.log_every", "train.save_every", "train.keep_last", "data.num_workers", "train.output_dir"} \
        <= rp.RESUME_ALLOWLIST


def test_changed_optim_is_refused_in_one_line_then_accepted_with_the_flag():
    saved = _fp(_cfg_dict(optim={"lr": 5e-3, "epochs": 2}))
    current = _fp(_cfg_dict(optim={"lr": 3e-2, "epochs": 4}, train={"log_every": 1}))
    with pytest.raises(UserError) as err:
        rp.check_resume_changes(saved, current, checkpoint="runs/x/checkpoints/step_000000016")
    msg = str(err.value)
    assert "\n" not in msg and "step_000000016" in msg and "--resume-with-changes" in msg
    assert "optim.epochs=2 -> 4" in msg and "optim.lr=0.005 -> 0.03" in msg and "log_every" not in msg
    changes = rp.check_resume_changes(saved, current, checkpoint="ck", accept_changes=True)
    assert changes == [rp.Change("optim.epochs", 2, 4), rp.Change("optim.lr", 5e-3, 3e-2)]
    assert rp.schedule_affected(changes)
    assert not rp.schedule_affected([rp.Change("data.mixup", 0.0, 0.8)])


@pytest.mark.parametrize("section,key,new", [("head", "name", "sparsemax"), ("model", "norm", "layernorm"),
                                             ("train", "seed", 1), ("optim", "name", "sgd")])
def test_frozen_keys_are_refused_even_with_the_flag(section, key, new):
    saved = _fp(_cfg_dict())
    current = _fp(_cfg_dict(**{section: {key: new}}))
    with pytest.raises(UserError) as err:
        rp.check_resume_changes(saved, current, checkpoint="ck", accept_changes=True)
    old = dataclasses.asdict(Config())[section][key]
    assert f"{section}.{key}={old!r} -> {new!r}" in str(err.value) and "another train.output_dir" in str(err.value)


def test_derived_values_are_checked_and_legacy_fingerprints_are_compared_on_what_they_hold():
    # a changed global batch: refused without the flag, applied with it (the lr and schedule follow)
    with pytest.raises(UserError, match="run.global_batch=256 -> 512"):
        rp.check_resume_changes(_fp(_cfg_dict()), _fp(_cfg_dict(), global_batch=512), checkpoint="ck")
    accepted = rp.check_resume_changes(_fp(_cfg_dict()), _fp(_cfg_dict(), global_batch=512), checkpoint="ck",
                                       accept_changes=True)
    assert accepted == [rp.Change("run.global_batch", 256, 512)] and rp.schedule_affected(accepted)
    with pytest.raises(UserError, match="run.num_classes=10 -> 100"):
        rp.check_resume_changes(_fp(_cfg_dict()), _fp(_cfg_dict(), num_classes=100), checkpoint="ck",
                                accept_changes=True)
    saved = {"model.name": "resmlp_tiny", "head.name": "softmax", "run.num_classes": 10, "run.global_batch": 256}
    current = _fp(_cfg_dict(optim={"lr": 1.0}))  # keys the checkpoint never recorded (newer schema keys): not compared
    assert rp.check_resume_changes(saved, current, checkpoint="ck") == []
    with pytest.raises(UserError, match="run.num_classes=10 -> 100"):
        rp.check_resume_changes(saved, _fp(_cfg_dict(), num_classes=100), checkpoint="ck")


# ----------------------------------------------------------------------------- applying a new schedule
UPDATES_PER_EPOCH, GLOBAL_BATCH = 8, 32


def _reference_lr(optim, step):
    """warmup (linear from warmup_lr) + cosine to min_lr over the rest, written out by hand."""
    peak = optim.lr * GLOBAL_BATCH / optim.lr_base_batch
    total = optim.epochs * UPDATES_PER_EPOCH
    warmup = math.ceil(optim.warmup_epochs * UPDATES_PER_EPOCH)
    if step < warmup:
        return optim.warmup_lr + step * (peak - optim.warmup_lr) / warmup
    return optim.min_lr + 0.5 * (peak - optim.min_lr) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.LayerNorm(6))


def _train(model, optimizer, scheduler, steps):
    for step in range(steps):
        scheduler.step_update(step)
        optimizer.zero_grad()
        model(torch.randn(4, 6)).square().mean().backward()
        optimizer.step()


def test_rebuild_schedule_applies_new_lr_epochs_and_decay_at_the_current_step():
    old = OptimConfig(lr=5e-3, lr_base_batch=32, epochs=2, warmup_epochs=0.5, weight_decay=0.05)
    new = OptimConfig(lr=3e-2, lr_base_batch=32, epochs=4, warmup_epochs=0.5, weight_decay=0.1)
    model = _model()
    opt = build_optimizer(model, old, GLOBAL_BATCH)
    sched = build_scheduler(opt, old, UPDATES_PER_EPOCH)
    _train(model, opt, sched, 6)
    saved_opt, saved_sched = opt.state_dict(), sched.state_dict()
    step = 6

    # the resumed process: optimizer and scheduler built from the NEW config, then the state loaded
    opt2 = build_optimizer(model, new, GLOBAL_BATCH)
    fresh = rp.optimizer_hparams(opt2)
    naive = build_scheduler(opt2, new, UPDATES_PER_EPOCH)
    opt2.load_state_dict(saved_opt)
    naive.load_state_dict(saved_sched)
    naive.step_update(step)
    assert opt2.param_groups[0]["lr"] == pytest.approx(_reference_lr(old, step))  # silently the old schedule

    sched2 = rp.rebuild_schedule(opt2, fresh, new, UPDATES_PER_EPOCH, step)
    for s in (step, 20, 31):
        sched2.step_update(s)
        assert [g["lr"] for g in opt2.param_groups] == pytest.approx([_reference_lr(new, s)] * 2, rel=1e-12)
    assert _reference_lr(new, step) > 3 * _reference_lr(old, step)
    assert sorted(g["weight_decay"] for g in opt2.param_groups) == [0.0, 0.1]  # the no-decay group stays 0
    for p in model.parameters():  # the moment estimates survive
        assert torch.equal(opt2.state[p]["exp_avg"], opt.state[p]["exp_avg"])


def test_rebuild_schedule_refuses_a_different_group_layout():
    model = _model()
    decayed = build_optimizer(model, OptimConfig(lr_base_batch=32, weight_decay=0.05), GLOBAL_BATCH)
    undecayed = build_optimizer(model, OptimConfig(lr_base_batch=32, weight_decay=0.0), GLOBAL_BATCH)
    with pytest.raises(UserError, match="weight_decay"):
        rp.rebuild_schedule(decayed, rp.optimizer_hparams(undecayed), OptimConfig(weight_decay=0.0),
                            UPDATES_PER_EPOCH, 3)


# ----------------------------------------------------------------------------- recording
def test_change_record_and_config_history(tmp_path):
    path = str(tmp_path / "config.yaml")
    cfg = _cfg_dict()
    rp.save_config_with_history(path, cfg)  # fresh run: exactly the plain config
    assert yaml.safe_load(open(path)) == json.loads(json.dumps(cfg))
    first = [rp.Change("optim.lr", 5e-3, 3e-2)]
    rp.save_config_with_history(path, _cfg_dict(optim={"lr": 3e-2}),
                                rp.history_entry(first, step=16, checkpoint="checkpoints/step_000000016"))
    rp.save_config_with_history(path, _cfg_dict(optim={"lr": 3e-2}))  # a plain resume keeps the history
    second = [rp.Change("optim.epochs", 400, 450), rp.Change("data.mean", (0.5, 0.5, 0.5), (0.4, 0.4, 0.4))]
    rp.save_config_with_history(path, _cfg_dict(optim={"lr": 3e-2, "epochs": 450}),
                                rp.history_entry(second, step=40, checkpoint="checkpoints/step_000000040"))
    data = yaml.safe_load(open(path))
    assert data["optim"]["lr"] == 3e-2 and data["optim"]["epochs"] == 450
    # the history lives beside config.yaml, which stays a plain config
    assert "history" not in data and data == json.loads(json.dumps(_cfg_dict(optim={"lr": 3e-2, "epochs": 450})))
    history = yaml.safe_load(open(tmp_path / rundir.CONFIG_HISTORY))
    assert [h["step"] for h in history] == [16, 40]
    assert history[0]["changes"] == {"optim.lr": {"old": 5e-3, "new": 3e-2}}
    assert history[1]["changes"]["data.mean"] == {"old": [0.5] * 3, "new": [0.4] * 3}
    assert rp.read_config_history(path) == history
    rp.save_config_with_history(path, cfg, keep_history=False)  # a fresh start (--overwrite) drops it
    assert "history" not in yaml.safe_load(open(path)) and not (tmp_path / rundir.CONFIG_HISTORY).exists()
    assert rp.read_config_history(path) == []

    row = rp.change_record(first, step=16, checkpoint="c")
    assert json.loads(json.dumps(row)) == {"kind": "config_change", "step": 16, "checkpoint": "c",
                                           "changes": {"optim.lr": {"old": 5e-3, "new": 3e-2}}}


def test_a_broken_history_is_one_line(tmp_path):
    path = str(tmp_path / "config.yaml")
    rp.save_config_with_history(path, _cfg_dict())
    (tmp_path / rundir.CONFIG_HISTORY).write_bytes(b"- step: 1\n  step: 2\n")
    with pytest.raises(UserError) as err:
        rp.read_config_history(path)
    assert "step" in str(err.value) and "lines 1 and 2" in str(err.value) and "\n" not in str(err.value)
    (tmp_path / rundir.CONFIG_HISTORY).write_bytes(b"step: 1\n")
    with pytest.raises(UserError, match="list of changes"):
        rp.read_config_history(path)


def test_resume_tables_are_the_schema_metadata():
    """RESUME_ALLOWLIST / FROZEN_KEYS / OPTIM_KEYS come from the schema's field metadata."""
    from configs.schema import FREE, FROZEN, OPTIMIZER, schema_fields

    for key, (f, _) in schema_fields().items():
        resume = f.metadata.get("resume")
        assert (key in rp.RESUME_ALLOWLIST) == (resume == FREE), key
        assert (key in rp.FROZEN_KEYS) == (resume == FROZEN), key
        assert (key in rp.OPTIM_KEYS) == (resume == OPTIMIZER), key
    assert rp.FROZEN_KEYS - set(schema_fields()) == {"run.num_classes"}
    assert rp.OPTIM_KEYS - set(schema_fields()) == {"run.global_batch"}  # the lr follows it
    # the facts the tables held before they were derived
    assert {"name", "train.output_dir", "train.compile", "data.root", "data.num_workers"} <= rp.RESUME_ALLOWLIST
    assert {"model.name", "model.norm", "head.name", "data.image_size", "train.seed", "optim.name"} <= rp.FROZEN_KEYS
    assert {"optim.lr", "optim.epochs", "optim.betas"} <= rp.OPTIM_KEYS and "data.mixup" not in rp.OPTIM_KEYS


def test_a_checkpoint_fingerprint_gives_back_its_config():
    from configs import config_from_dict, config_to_dict

    cfg = config_from_dict(_cfg_dict(optim={"lr": 3e-2}, head={"name": "sparsemax"}))
    fp = json.loads(json.dumps(_fp(config_to_dict(cfg))))  # as trainer_state.json holds it
    assert config_from_dict(rp.fingerprint_config(fp)) == cfg
    assert rp.resume_fingerprint(cfg, num_classes=10, global_batch=256) == _fp(config_to_dict(cfg))


# ----------------------------------------------------------------------------- world-independent epoch state
def test_updates_in_epoch_counts_updates_whatever_the_processes_and_accumulation():
    from training.checkpoint.state import TrainerState

    state = TrainerState(batch=6, updates_in_epoch=3, config={"run.global_batch": 32, "train.grad_accum": 2})
    assert rp.updates_in_epoch(state, 32) == 3
    assert rp.updates_in_epoch(state, 16) == 6  # 96 samples = 6 updates of 16
    with pytest.raises(UserError, match="96 samples into its epoch.*global batch 64"):
        rp.updates_in_epoch(state, 64)
