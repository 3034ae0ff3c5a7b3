"""Pooling support of hopfield-pooled models: eval.py's summary, per-example
records and support maps, computed in the evaluation's own forward pass; the comparison report's
section and support-map PNG (hopfield runs only); average pooling unchanged.

Two tiny runs (16 px, 16 patches, one epoch on 256 built-in images) are trained and evaluated
in-process once per module: hopfield pooling with sparsemax, and average pooling."""
import json
import os
import statistics

import pytest
import torch
import torch.nn as nn

import data
from common import rundir
from common.weights import read_safetensors
from comparison.report import document, plots, pool_section
from configs.schema import HeadConfig, ModelConfig
from evaluation import tables
from evaluation.evaluate import _gather_examples, evaluate
from evaluation.pool_support import POOL_SUPPORT_FIELD, display_images, patch_support, support_summary
from models import create_classifier

TINY = """\
model: {{name: resmlp_tiny, pool: {pool}{mapping}}}
head: {{name: softmax}}
data: {{dataset: builtin10, image_size: 16, batch_size: 64, eval_batch_size: 16, num_workers: 0,
       builtin_train_size: 256, builtin_val_size: 50, calib_fraction: 0.0}}
optim: {{name: adamw, lr: 8.0e-3, lr_base_batch: 64, weight_decay: 0.05, epochs: 1, warmup_epochs: 0}}
train: {{eval_every: 1, log_every: 2, save_every: 100, ema: false, progress: false, log_with: none}}
"""
N_VAL, N_PATCHES = 50, 16  # 16 px / patch 4 = a 4 x 4 grid


def _train_and_eval(root, name, pool, mapping=None):
    import eval as eval_entry
    import train

    cfg = os.path.join(root, f"{name}.yaml")
    with open(cfg, "w") as f:
        f.write(TINY.format(pool=pool, mapping=f", pool_mapping: {mapping}" if mapping else ""))
    run = os.path.join(root, name)
    assert train.main(["--config", cfg, f"train.output_dir={run}"]) == 0
    out = os.path.join(run, rundir.EVAL_RESULT)
    assert eval_entry.main(["--checkpoint", run, "--output", out, "--calib", "none", "--quiet"]) == 0
    torch.set_flush_denormal(False)  # setup's process-wide speed guard (training/run.py)
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("pool-support"))
    return {"hopfield": _train_and_eval(root, "hopfield", "hopfield", "sparsemax"),
            "avg": _train_and_eval(root, "avg", "avg")}


def _result(run):
    with open(os.path.join(run, rundir.EVAL_RESULT)) as f:
        return json.load(f)


def _model_and_val(run):
    """The run's model (as eval.py builds it) and its val images in dataset order."""
    import configs
    from common.weights import read_state_dict
    from inference.trained_run import model_from_state_dict

    cfg = configs.load_run_config(run, [])
    weights = os.path.join(run, rundir.WEIGHTS)
    model = model_from_state_dict(cfg, read_state_dict(weights), weights, data.num_classes(cfg.data))
    loader = data.build_eval_loader(data.build_dataset(cfg.data, "val"), cfg.data, rank=0, world_size=1)
    images = torch.cat([x for x, _ in loader])
    return cfg, model, images


# ------------------------------------------------------------------------------------------ eval.py
def test_eval_json_reports_the_pooling_support_of_every_image(runs):
    result = _result(runs["hopfield"])
    pooling = result["pooling"]
    assert pooling["mapping"] == "sparsemax" and pooling["num_patches"] == N_PATCHES and pooling["heads"] == 1
    assert 1 <= pooling["support_mean"] <= N_PATCHES and pooling["n"] == result["n"] == N_VAL
    assert len(pooling["support_hist"]) == N_PATCHES and sum(pooling["support_hist"]) == N_VAL
    # against a brute-force count from the model's own pooling weights, image by image
    cfg, model, images = _model_and_val(runs["hopfield"])
    with torch.no_grad():
        want = (model.pooling_weights(images) > 0).sum(-1)[:, 0]
    records = read_safetensors(rundir.examples_path(os.path.join(runs["hopfield"], rundir.EVAL_RESULT)))
    assert torch.equal(records[POOL_SUPPORT_FIELD], want)
    assert pooling["support_mean"] == pytest.approx(want.double().mean().item())
    assert pooling["support_median"] == statistics.median(want.tolist())
    assert pooling["support_hist"] == [int((want == k).sum()) for k in range(1, N_PATCHES + 1)]
    assert (pooling["support_min"], pooling["support_max"]) == (int(want.min()), int(want.max()))
    # the CSV row carries the scalars
    header = open(rundir.eval_csv_path(os.path.join(runs["hopfield"], rundir.EVAL_RESULT))).readline().split(",")
    assert "pool_support_mean" in header and "pool_support_fraction_mean" in header


def test_support_maps_file_holds_the_first_images_as_the_model_saw_them(runs):
    cfg, model, images = _model_and_val(runs["hopfield"])
    maps = read_safetensors(rundir.pool_maps_path(os.path.join(runs["hopfield"], rundir.EVAL_RESULT)))
    assert maps["index"].tolist() == [0, 1, 2, 3]
    assert maps["images"].dtype == torch.uint8 and maps["images"].shape == (4, 16, 16, 3)
    assert torch.equal(maps["images"], display_images(images[:4], cfg.data.mean, cfg.data.std))
    with torch.no_grad():
        torch.testing.assert_close(maps["weights"], model.pooling_weights(images[:4]).float())
    records = read_safetensors(rundir.examples_path(os.path.join(runs["hopfield"], rundir.EVAL_RESULT)))
    assert torch.equal(maps["label"], records["label"][:4]) and torch.equal(maps["pred"], records["pred"][:4])


def test_display_images_undo_the_normalisation():
    pixels = torch.randint(0, 256, (2, 3, 4, 4), generator=torch.Generator().manual_seed(0)).float()
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    normalised = (pixels / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    assert torch.equal(display_images(normalised, mean, std), pixels.to(torch.uint8).permute(0, 2, 3, 1))


def test_average_pooling_changes_nothing(runs):
    result = _result(runs["avg"])
    out = os.path.join(runs["avg"], rundir.EVAL_RESULT)
    assert "pooling" not in result
    assert POOL_SUPPORT_FIELD not in read_safetensors(rundir.examples_path(out))
    assert not os.path.exists(rundir.pool_maps_path(out))
    assert "pool_support_mean" not in tables.flatten_metrics(result)
    # the keys eval.json has for both, except the pooling
    assert set(_result(runs["hopfield"])) - set(result) == {"pooling"}


# ----------------------------------------------------------------------------- evaluate() directly
class _DominantPatch(nn.Module):
    """In place of the final norm: adds a large multiple of the pooling query to one patch's token, so
    that patch's pooling score dominates every other."""

    def __init__(self, query, patch, scale=1e3):
        super().__init__()
        self.query, self.patch, self.scale = query, patch, scale

    def forward(self, x):
        bump = torch.zeros_like(x)
        bump[:, self.patch] = self.scale * self.query.detach()[0] / self.query.detach()[0].norm()
        return x + bump


def _tiny_model(mapping, dominant=None):
    torch.manual_seed(0)
    k = 1 if mapping == "ksubset" else None  # a 1-subset: the dominant patch alone, as sparsemax
    model = create_classifier(ModelConfig(name="resmlp_tiny", pool="hopfield", pool_mapping=mapping, pool_k=k),
                              HeadConfig(name="softmax"), 10, img_size=16).eval()
    if dominant is not None:
        model.norm = _DominantPatch(model.pool.query, dominant)
    return model


def _loader(n=10, batch=4):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)
    return [(x[i:i + batch], y[i:i + batch]) for i in range(0, n, batch)], x


@pytest.mark.parametrize("mapping, support", [("sparsemax", 1), ("entmax15", 1), ("ksubset", 1),
                                              ("softmax", N_PATCHES)])
def test_a_dominant_patch_is_the_whole_support_under_a_sparse_mapping(mapping, support):
    model = _tiny_model(mapping, dominant=5)
    loader, x = _loader()
    ev = evaluate(model, loader, keep_examples=True)
    assert ev.records[POOL_SUPPORT_FIELD].tolist() == [support] * 10
    summary = support_summary(ev.records[POOL_SUPPORT_FIELD], N_PATCHES, 1, mapping)
    assert summary["support_hist"][support - 1] == 10 and summary["support_mean"] == support
    if mapping != "softmax":  # the one used patch is the dominant one
        assert (ev.pooling["maps"]["weights"][:, 0, 5] == 1).all()


def test_support_comes_from_the_same_forward_pass():
    model = _tiny_model("sparsemax")
    with torch.no_grad():
        model.pool.query.normal_(0, 5, generator=torch.Generator().manual_seed(4))  # a sparse pooling
    loader, x = _loader()
    backbone_calls = []
    handle = model.blocks.register_forward_hook(lambda *a: backbone_calls.append(1))
    ev = evaluate(model, loader, keep_examples=True)
    handle.remove()
    assert len(backbone_calls) == len(loader)  # one backbone pass per batch: no second pass for the weights
    with torch.no_grad():
        want = patch_support(model.pooling_weights(x))
    assert torch.equal(ev.records[POOL_SUPPORT_FIELD], want) and (want < N_PATCHES).any()
    assert ev.pooling["maps"]["positions"].tolist() == [0, 1, 2, 3]
    # training's periodic eval (no kept examples) is untouched: no hook, no field
    plain = evaluate(model, loader)
    assert plain.pooling is None and not model.pool._forward_hooks
    assert plain.totals == ev.totals


def test_an_empty_shard_gathers_the_same_fields():
    model = _tiny_model("sparsemax")
    records, _ = _gather_examples([], model.output_head, model, None, pool_support=True)
    assert POOL_SUPPORT_FIELD in records and records[POOL_SUPPORT_FIELD].numel() == 0


def test_support_is_the_union_over_heads_and_the_summary_matches_brute_force():
    w = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0]],
                      [[1.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]])
    assert patch_support(w).tolist() == [3, 1]
    counts = torch.randint(1, 9, (101,), generator=torch.Generator().manual_seed(2))
    s = support_summary(counts, 8, 2, "entmax15")
    assert s["support_hist"] == [sum(int(c) == k for c in counts) for k in range(1, 9)]
    assert s["support_mean"] == pytest.approx(sum(counts.tolist()) / 101)
    assert s["support_median"] == sorted(counts.tolist())[50] and s["n"] == 101
    assert s["support_fraction_mean"] == pytest.approx(s["support_mean"] / 8)


# ------------------------------------------------------------------------------- comparison report
def _png_ok(path):
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(path) > 5000


def test_report_draws_support_maps_for_hopfield_runs_only(runs, tmp_path):
    hop = document.load_run(runs["hopfield"], rundir.EVAL_RESULT, seed=0)
    avg = document.load_run(runs["avg"], rundir.EVAL_RESULT, seed=0)
    both = tmp_path / "both"
    table, md_path, _ = document.write_report({"hopfield": [hop], "avg": [avg]}, str(both), "t", "cmd")
    _png_ok(both / plots.POOL_MAPS_FILE)
    md = open(md_path).read()
    assert "## Hopfield pooling support" in md and f"]({plots.POOL_MAPS_FILE})" in md
    assert "| hopfield | sparsemax | 16 | 1 |" in md and "| avg |" not in md.split("## Hopfield pooling support")[1]
    assert "pooling support mean (patches)" in table
    rows = pool_section.map_rows({"hopfield": [hop], "avg": [avg]})
    assert len(rows) == 1 and len(rows[0]["images"]) == 4 and rows[0]["grid"] == 4
    assert all(c.endswith(f"/{N_PATCHES} patches") for c in rows[0]["captions"])

    only_avg = tmp_path / "avg"
    table, md_path, _ = document.write_report({"avg": [avg]}, str(only_avg), "t", "cmd")
    assert not (only_avg / plots.POOL_MAPS_FILE).exists()
    assert "Hopfield pooling" not in open(md_path).read() and "pooling support" not in table


# ------------------------------------------------------------------------------ scripts/bench_hopfield
def test_bench_measures_every_pooling_against_avg_in_one_run(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_hopfield", os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench_hopfield.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--speed-only", "--quick", "--batch-size", "8"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()
            if line.split() and line.split()[0].startswith(("avg", "hopfield-"))}
    assert set(rows) == {"avg", "hopfield-softmax", "hopfield-sparsemax", "hopfield-ksubset"}
    assert rows["avg"][-1] == "1.000x"
    assert all(float(r[-1].rstrip("x")) > 0 for r in rows.values())
    with pytest.raises(Exception, match="unknown --mappings 'sparsemx'"):
        bench.parse_args(["--mappings", "sparsemx"])
