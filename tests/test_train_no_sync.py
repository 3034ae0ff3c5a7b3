"""One full training step of train.py's loop (training/train_step.py) under the host-sync guard
(tests/sync_guard.py).

On CUDA, a host read inside the step (`.item()`, `bool(t)`, `nonzero`, boolean-mask indexing...)
drains the launch queue every update. There is no GPU here, so the step runs on CPU tensors under
a dispatch mode that fails on every op that would force such a read on CUDA, with the heads forced
onto their device path (the path every non-CPU device takes). The step is a plain update: not a
log step and not a save step (those read the device by design). It covers data already on the
device, Mixup/CutMix, drop path, forward, the head's loss, backward, gradient clipping, the
optimizer, the schedule and the EMA.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from models.mappings import threshold_path
from sync_guard import HostSyncError, no_host_sync
from test_train_helpers import tiny_cfg
from training.run import setup
from training.train_step import NO_BAD_STEP, train_step

HEADS = [["head.name=softmax"], ["head.name=sparsemax"], ["head.name=entmax15"],
         ["head.name=entmax_bisect", "head.learn_alpha=true"], ["head.name=normmax"], ["head.name=sparse_softmax"],
         ["head.name=taylor_softmax"], ["head.name=am_softmax"]]


def _setup(tmp_path, *overrides):
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    cfg = tiny_cfg(str(tmp_path / "run"), "data.mixup=0.8", "data.cutmix=1.0", "model.drop_path=0.1",
                   "optim.clip_grad=1.0", "train.log_every=1000", "train.save_every=1000", *overrides)
    run = setup(cfg, resume=None, overwrite=False)
    run.learner.model.train()
    batches = [tuple(t.clone() for t in b) for _, b in zip(range(3), run.train_loader(0, 0))]  # on the device
    return run, batches


def _host_side_by_design(run):
    """The named exclusions: values that live on the host by design, so reading them is no GPU sync."""
    allow = []
    counters = [g.get("step") for g in run.learner.optimizer.param_groups]  # timm's LAMB: one per param group
    counters += [state.get("step") for state in run.learner.optimizer.state.values()]  # torch's Adam(W): one per param
    for step in counters:
        if torch.is_tensor(step) and step.device.type == "cpu":
            allow.append((step, "the optimizer's step counter, a host tensor by design (timm LAMB; torch optimizers "
                                "with capturable=False): reading it is no GPU sync"))
    assert allow, "the optimizer keeps no host step counter any more: drop this exclusion"
    return allow


@pytest.mark.parametrize("head", HEADS, ids=lambda h: h[0].split("=")[1])
def test_training_step_reads_nothing_from_the_device(tmp_path, head):
    run, batches = _setup(tmp_path, *head)
    with threshold_path("device"):
        train_step(run, iter(batches[:1]))  # the first update creates the optimizer state
        with no_host_sync(allow=_host_side_by_design(run)):
            train_step(run, iter(batches[1:2]))
            train_step(run, iter(batches[2:3]))
    assert run.state.step == 3
    assert torch.isfinite(run.losses.last) and int(run.losses.first_bad_step) == NO_BAD_STEP
    assert all(torch.isfinite(p).all() for p in run.learner.raw_model.parameters())


def test_guard_catches_a_host_read_added_to_the_step(tmp_path):
    run, batches = _setup(tmp_path, "head.name=entmax15")
    forward_loss = run.learner.forward_loss

    def with_a_log_read(images, targets):
        loss = forward_loss(images, targets)
        print(f"loss {loss.item():.3f}")  # the kind of line that slips into a training step
        return loss

    run.learner.forward_loss = with_a_log_read
    with threshold_path("device"):
        train_step(run, iter(batches[:1]))
        with pytest.raises(HostSyncError, match="item|host"):
            with no_host_sync(allow=_host_side_by_design(run)):
                train_step(run, iter(batches[1:2]))


def test_nonfinite_skip_reads_one_flag_per_update_and_stop_reads_none(tmp_path):
    """train.nonfinite=skip must decide before the optimizer step (its one documented read)."""
    run, batches = _setup(tmp_path, "head.name=sparsemax", "train.nonfinite=skip")
    with threshold_path("device"):
        train_step(run, iter(batches[:1]))
        with pytest.raises(HostSyncError):
            with no_host_sync(allow=_host_side_by_design(run)):
                train_step(run, iter(batches[1:2]))


@pytest.mark.parametrize("extra", [
    ["head.name=sparsemax", "train.distill=soft", "train.distill_tau=2"],
    ["head.name=entmax_bisect", "head.learn_alpha=true", "train.distill=hard"],
    ["head.name=entmax_bisect", "head.learn_alpha=true", "model.freeze=backbone"],
    ["head.name=sparsemax", "optim.layer_decay=0.7"],
], ids=["distill_soft", "distill_hard", "probe", "layer_decay"])
def test_distillation_probe_and_layer_decay_steps_read_nothing_from_the_device(tmp_path, extra):
    """The teacher (eval mode, no grad, inside the step), the frozen backbone and the layer-decay groups."""
    from safetensors.torch import save_file

    from configs.schema import HeadConfig, ModelConfig
    from models import create_classifier

    net = create_classifier(ModelConfig(name="resmlp_tiny"), HeadConfig(), 10, img_size=16)
    weights = str(tmp_path / "w.safetensors")
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, weights)
    distill = any(e.startswith("train.distill=") for e in extra)
    source = [f"train.teacher={weights}"] if distill else []
    source += [f"model.pretrained={weights}"] if "model.freeze=backbone" in extra else []
    run, batches = _setup(tmp_path, *extra, *source)
    assert (run.learner.distiller is not None) == distill
    with threshold_path("device"):
        train_step(run, iter(batches[:1]))
        with no_host_sync(allow=_host_side_by_design(run)):
            train_step(run, iter(batches[1:2]))
            train_step(run, iter(batches[2:3]))
    assert run.state.step == 3 and torch.isfinite(run.losses.last)



class _HostData(TorchDispatchMode):
    """Counts the tensors made from host data (aten.lift_fresh: torch.tensor, torch.from_numpy)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten.lift_fresh.default, torch.ops.aten.lift_fresh_copy.default)
        return func(*args, **(kwargs or {}))


def _host_data_per_batch(batches, n=2):
    counts = []
    for _ in range(n):
        with _HostData() as seen:
            next(batches)
        counts.append(seen.count)
    return counts


def test_an_epochs_first_batch_moves_no_more_host_data_than_any_other(tmp_path):
    """The loop calls iter(loader) before its step and next() inside it: the in-memory loader's device
    setup (the images, the normalisation constants) belongs to iter(). On CUDA, torch.tensor(list)
    on the device is a synchronous copy, which sync_debug refused at every epoch's first step; the
    batch's own indices and augmentation seeds are the only host data a step may move."""
    run, _ = _setup(tmp_path, "head.name=softmax")
    loader = run.train_loader(1, 0)
    assert loader.uses_memory_path
    first, second = _host_data_per_batch(iter(loader))
    assert first == second, f"the first batch of an epoch made {first} tensors from host data, the next {second}"


def test_the_count_sees_a_loader_that_sets_up_inside_the_step(tmp_path, monkeypatch):
    """The test above fails on the old loader, which built its augmentation on the first next()."""
    from data import loaders

    run, _ = _setup(tmp_path, "head.name=softmax")
    setup_now = loaders._Loader._iter_memory

    def lazy(self, tasks):  # the old shape: a generator whose setup runs at the first next()
        yield from setup_now(self, tasks)

    monkeypatch.setattr(loaders._Loader, "_iter_memory", lazy)
    first, second = _host_data_per_batch(iter(run.train_loader(1, 0)))
    assert first > second
