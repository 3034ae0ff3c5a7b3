"""The comparison report's Hopfield-pooling section: how many patches each variant's pooling uses
(mean ± std over seeds of eval.py's per-run mean, and the histogram pooled over seeds) and the
support maps of the first validation images of every hopfield-pooled run (plots.POOL_MAPS_FILE).

Only runs whose eval.json has "pooling" (model.pool=hopfield) take part; a comparison of
average-pooled runs has no such section and no support-map PNG.
"""
import os

from common import rundir
from data.classes import load_class_names
from evaluation import tables
from evaluation.pool_support import load_pool_maps

from . import plots


def run_pool_maps(run_dir, eval_file, result):
    """A run's support maps (pool_support.load_pool_maps) when its result has pooling, else None."""
    if not result.get("pooling"):
        return None
    return load_pool_maps(rundir.pool_maps_path(os.path.join(run_dir, eval_file)))


def _class_name(names, index):
    return names[index] if names and 0 <= index < len(names) else str(index)


def map_rows(variants):
    """plots.plot_pool_support_maps rows: one per hopfield run with maps, in variant and seed order."""
    rows = []
    for variant, runs in variants.items():
        for run in runs:
            maps = run.get("pool_maps")
            if maps is None:
                continue
            arrays, _ = maps
            names = load_class_names(run["run_dir"])
            pooling = run["result"]["pooling"]
            captions = []
            for k in range(len(arrays["index"])):
                used = int((arrays["weights"][k] > 0).any(axis=0).sum())
                truth, pred = (_class_name(names, int(arrays[key][k])) for key in ("label", "pred"))
                captions.append(f"#{int(arrays['index'][k])} {truth}"
                                + ("" if pred == truth else f" → {pred}")
                                + f"\n{used}/{pooling['num_patches']} patches")
            rows.append({"title": f"head {variant}, seed {run['seed']}\npooling: {pooling['mapping']}, "
                                  f"{pooling['support_mean']:.1f}/{pooling['num_patches']} patches",
                         "images": arrays["images"], "weights": arrays["weights"],
                         "grid": int(round(len(arrays["weights"][0][0]) ** 0.5)), "captions": captions})
    return rows


def pool_section(variants, report_dir):
    """Markdown lines of the section (empty without hopfield runs); writes the support-map PNG."""
    pooled = {v: [r for r in runs if r["result"].get("pooling")] for v, runs in variants.items()}
    pooled = {v: runs for v, runs in pooled.items() if runs}
    if not pooled:
        return []
    header = ["variant", "mapping", "patches", "seeds", "support mean", "support median", "support / patches",
              "images by support (pooled over seeds)"]
    rows = []
    for variant, runs in pooled.items():
        first = runs[0]["result"]["pooling"]
        hist = [sum(h) for h in zip(*(r["result"]["pooling"]["support_hist"] for r in runs))]
        spread = ", ".join(f"{i + 1}: {c}" for i, c in enumerate(hist) if c)
        rows.append([variant, first["mapping"], str(first["num_patches"]), str(len(runs)),
                     tables.format_mean_std([r["result"]["pooling"]["support_mean"] for r in runs], "f2"),
                     tables.format_mean_std([r["result"]["pooling"]["support_median"] for r in runs], "f1"),
                     tables.format_mean_std([r["result"]["pooling"]["support_fraction_mean"] for r in runs], "pct"),
                     spread if len(spread) <= 120 else spread[:117] + "..."])
    lines = ["## Hopfield pooling support", "",
             "model.pool=hopfield pools the final patch tokens with weights entmax(β X q) over the patches; a "
             "patch is used by an image when its weight is > 0 (any pooling head). Support: patches used per "
             "validation image (eval.py, the same forward pass as the metrics), mean ± std over seeds; the "
             "histogram pools the seeds (support: images).", "",
             tables.markdown_table(header, rows), ""]
    maps = map_rows(variants)
    if maps:
        plots.plot_pool_support_maps(maps, os.path.join(report_dir, plots.POOL_MAPS_FILE))
        lines += ["Support maps of the first validation images of each run (as the model saw them): outlined "
                  "and tinted patches are used, from yellow (small weight) to red (the image's largest), dark ones "
                  "unused. Caption: dataset index, true class (→ prediction when wrong), patches used.", "",
                  f"![Hopfield pooling support maps]({plots.POOL_MAPS_FILE})", ""]
    return lines
