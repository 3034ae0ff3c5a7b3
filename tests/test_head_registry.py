"""The head registry (models/registry.py) is the one source of what a head is.

Every registered head trains one step, evaluates, and shows up in evaluation and the comparison
with the sparse flag of its declaration; the config schema, the loader and OutputHead take its
settings from the declaration; an incomplete declaration is refused.
"""
import dataclasses
import os
import re

import pytest
import torch

from common.errors import UserError
from comparison.report import document
from configs import config_from_dict
from configs.schema import HeadConfig
from evaluation import conformal, metrics, selective_report
from models import create_classifier, registry
from models.heads import ENTMAX_HEAD_NAMES, HEAD_NAMES, SPARSE_HEAD_NAMES, OutputHead
from models.registry import HEADS, HPARAMS, HeadSpec, HParam, check_settings, register

TINY = {"model": {"name": "resmlp_tiny"}, "data": {"image_size": 16}}


def _tiny_head_cfg(name):
    data = {**TINY, "head": {"name": name, **({"k": 3} if name == "sparse_softmax" else {})}}
    return config_from_dict(data)


def _run_result(name, logits, labels, head):
    """What a finished run contributes to the comparison: its eval result and curve."""
    result = metrics.metrics_from_records(metrics.example_records(logits, labels, head), logits.shape[1])
    result["head"] = name
    return {"run_dir": f"runs/{name}", "curve": [(1, result["top1"])], "result": result}


@pytest.mark.parametrize("name", list(HEADS))
def test_every_head_trains_one_step_evaluates_and_reports_its_sparse_flag(name):
    torch.manual_seed(0)
    cfg = _tiny_head_cfg(name)
    model = create_classifier(cfg.model, cfg.head, num_classes=10, img_size=cfg.data.image_size).train()
    x = torch.randn(8, 3, 16, 16)
    y = torch.arange(8) % 10
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    loss = model.output_head.loss(model(x), y)
    assert torch.isfinite(loss) and loss > 0
    loss.backward()
    opt.step()
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))

    model.eval()
    with torch.no_grad():
        logits = model(x)
        logits = 4.0 * logits / logits.std()  # spread out: a sparse head has exact zeros, a dense one none
    head = model.output_head
    probs = head(logits)
    torch.testing.assert_close(probs.sum(-1), torch.ones(8))
    spec = HEADS[name]
    if spec.sparse:  # (a dense head may still have zeros: perturbmax's classes that won no draw)
        assert bool((probs == 0).any()), "a sparse head has exact zeros"
    assert (name in SPARSE_HEAD_NAMES) == spec.sparse and (name in ENTMAX_HEAD_NAMES) == spec.conformal_support
    assert type(model.head).__name__ == ("CosineLinear" if spec.cosine_classifier else "Linear")

    run = _run_result(name, logits, y, head)
    records = {k: v.numpy() for k, v in metrics.example_records(logits, y, head).items()}
    # the confidence (ECE, reliability, selective prediction, AURC) is the head's probability of the
    # class it predicts, the top logit (first index on ties), for every head
    pred = logits.argmax(1)
    assert (records["pred"] == pred.numpy()).all()
    assert (records["max_prob"] == probs.gather(1, pred.view(-1, 1)).squeeze(1).numpy()).all()
    assert ("support" in selective_report.confidences(records, name)) == spec.sparse
    assert ("support" in conformal.methods_for_head(name)) == spec.conformal_support
    points = document._plot_inputs({name: [run]})[-1]
    assert (name in points) == spec.sparse, "the comparison plots a support only for sparse heads"


def test_names_and_config_section_come_from_the_registry():
    assert HEAD_NAMES == tuple(HEADS)
    fields = {f.name: f for f in dataclasses.fields(HeadConfig)}
    assert set(fields) == {"name"} | set(HPARAMS)
    for key, hp in HPARAMS.items():
        assert fields[key].default == hp.default and fields[key].type is hp.type
        assert fields[key].metadata["range_doc"] == hp.range
    cfg = config_from_dict({})
    assert {k: getattr(cfg.head, k) for k in HPARAMS} == registry.defaults()
    for name, spec in HEADS.items():
        head = OutputHead(name)
        assert set(head.hparams()) == {hp.name for hp in spec.hparams}


def test_settings_are_checked_by_their_declaration():
    with pytest.raises(UserError, match="head.gamma"):
        check_settings("normmax", {"gamma": 0.5})
    check_settings("softmax", {"gamma": 0.5})  # not its own: ignored by the head...
    with pytest.raises(UserError, match="head.gamma"):
        check_settings("softmax", {"gamma": 0.5}, every_head=True)  # ...but the loader checks it
    with pytest.raises(UserError, match="needs head entmax_bisect"):
        check_settings("sparsemax", {"learn_alpha": True})
    with pytest.raises(UserError, match="unknown head setting 'gama'"):
        OutputHead("normmax", gama=2.0)
    with pytest.raises(UserError, match="unknown output head"):
        OutputHead("sparsmax")
    with pytest.raises(UserError, match="config key head.k"):
        config_from_dict({"head": {"name": "softmax", "k": 0}})


def _complete(**changes):
    hp = HParam("temperature_x", float, 1.0, "(0, inf)", lambda v: float(v), "a throwaway setting")
    fields = dict(name="throwaway_head", mapping=lambda z, dim, s: torch.softmax(z / s["temperature_x"], dim),
                  loss=lambda z, t, s, training, **kw: torch.nn.functional.cross_entropy(z, t),
                  hparams=(hp,), alpha=None, sparse=False, conformal_support=False, cosine_classifier=False,
                  doc="softmax at a temperature")
    fields.update(changes)
    return HeadSpec(**fields)


@pytest.mark.parametrize("changes,needle", [
    (dict(sparse=None), "flag 'sparse'"),
    (dict(cosine_classifier="no"), "flag 'cosine_classifier'"),
    (dict(loss=None), "mapping and loss"),
    (dict(doc=""), "doc"),
    (dict(conformal_support=True), "conformal_support"),
    (dict(cosine_classifier=True), "'scale'"),
    (dict(alpha="alpha"), "'alpha' hyperparameter"),
    (dict(hparams=(HParam("temperature_x", float, -1.0, "(0, inf)",
                          lambda v: abs(float(v)), "bad default"),)), "does not pass its own check"),
    (dict(hparams=(HParam("gamma", float, 3.0, "(1, inf)", float, "another default"),)), "another default"),
    (dict(name="softmax"), "declared twice"),
])
def test_incomplete_declarations_are_refused(changes, needle):
    with pytest.raises(ValueError, match=needle):
        register(_complete(**changes))
    assert "throwaway_head" not in HEADS


def test_a_declaration_missing_a_field_does_not_construct():
    with pytest.raises(TypeError):
        HeadSpec("throwaway_head", mapping=lambda z, dim, s: z, loss=lambda *a, **k: 0, hparams=(), alpha=None,
                 sparse=False, conformal_support=False, doc="no cosine_classifier flag")


def test_a_new_declaration_is_a_head_everywhere(monkeypatch):
    monkeypatch.setattr(registry, "HEADS", dict(HEADS))
    monkeypatch.setattr(registry, "HPARAMS", dict(HPARAMS))
    register(_complete())
    head = OutputHead("throwaway_head", temperature_x=2.0)
    z = torch.randn(4, 6)
    torch.testing.assert_close(head(z), torch.softmax(z / 2.0, -1))
    assert head.hparams() == {"temperature_x": 2.0} and torch.isnan(head.alpha)
    assert registry.is_sparse("throwaway_head") is False


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _listed_heads(path, start, stop):
    """Head names in the text of `path` from the line holding `start` to the first that matches `stop`."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        text = f.read()
    block = text[text.index(start):]
    block = block[:re.search(stop, block).start()]
    return set(re.findall(r"[a-z][a-z0-9_]*", block))


@pytest.mark.parametrize("path, start, stop", [
    ("configs/base.yaml", "# any head of models/registry.py", r"\n  name:"),
    ("configs/cifar10.yaml", "# any head of models/registry.py", r"\n  name:"),
    ("models/heads.py", "Each head is one declaration", r"\. "),
    ("docs/heads.md", "| `head.name` | mapping", r"\n\n"),
    ("README.md", "| `head.name` | sparse", r"\n\n")])
def test_every_place_that_lists_the_heads_lists_every_declared_head(path, start, stop):
    listed = _listed_heads(path, start, stop)
    assert listed >= set(HEADS), f"{path} does not list {sorted(set(HEADS) - listed)}"
