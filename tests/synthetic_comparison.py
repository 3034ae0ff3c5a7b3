"""A head comparison without training: synthetic logits with a chosen accuracy per (head, seed),
turned into what document.load_run returns by the same library functions eval.py uses
(per-example records, metrics, prediction sets, selective prediction, OOD results).

Used by tests/test_seed_report.py, and to render the report's PNGs for a look:
    python tests/synthetic_comparison.py OUT_DIR
"""
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from comparison.report import document  # noqa: E402
from evaluation import conformal, metrics, ood_report, selective_report, tables  # noqa: E402
from models.heads import OutputHead  # noqa: E402

NUM_CLASSES = 10


def synthetic_logits(gen, labels, accuracy, sharpness):
    """Logits whose argmax is the label with probability `accuracy` (else a random other class);
    the winning margin is exponential with mean `sharpness`, so confidences spread over (0, 1)."""
    n = labels.numel()
    logits = torch.randn(n, NUM_CLASSES, generator=gen, dtype=torch.float64)
    correct = torch.rand(n, generator=gen, dtype=torch.float64) < accuracy
    wrong = (labels + torch.randint(1, NUM_CLASSES, (n,), generator=gen)) % NUM_CLASSES
    top = torch.where(correct, labels, wrong)
    margin = torch.empty(n, dtype=torch.float64).exponential_(1.0 / sharpness, generator=gen)
    logits[torch.arange(n), top] = logits.max(dim=1).values + margin
    return logits.float()


def synthetic_run(head_name, seed, accuracy, curve, n_val=600, n_cal=400, n_ood=300, sharpness=2.5,
                  coverage_shift=0.0):
    """One run as document.load_run returns it. `curve`: [(epoch, top1)] of the validation curve
    (its last point is set to the run's top-1). `coverage_shift` > 0 makes the calibration set easier
    than the validation set (its accuracy that much higher): not exchangeable, so conformal coverage
    falls below 1 − ε by more than sampling spread."""
    gen = torch.Generator().manual_seed(1000 * seed + sum(map(ord, head_name)))
    head = OutputHead(head_name)
    val_labels = torch.arange(n_val) % NUM_CLASSES
    cal_labels = torch.arange(n_cal) % NUM_CLASSES
    val_logits = synthetic_logits(gen, val_labels, accuracy, sharpness)
    cal_logits = synthetic_logits(gen, cal_labels, min(accuracy + coverage_shift, 1.0), sharpness)
    ood_logits = torch.randn(n_ood, NUM_CLASSES, generator=gen) * 1.5
    records = metrics.example_records(val_logits, val_labels, head)
    result = {"model": "resmlp_tiny", "head": head_name, "dataset": "synthetic", "split": "val",
              **metrics.metrics_from_records(records, NUM_CLASSES)}
    with torch.no_grad():
        cal = {"logits": cal_logits, "labels": cal_labels, "probs": head(cal_logits).float()}
        ev = {"logits": val_logits, "labels": val_labels, "probs": head(val_logits).float()}
        ood_probs = head(ood_logits).float()
    alpha = None if head_name == "softmax" else float(head.alpha.detach())
    result["prediction_sets"] = {"calibration": {"source": "calib", "n_calib": n_cal, "n_eval": n_val},
                                 "methods": conformal.prediction_sets(head_name, alpha, cal, ev, aps_seed=seed)}
    numpy_records = {k: v.numpy() for k, v in records.items()}
    result["selective"] = selective_report.run_summary(numpy_records, head_name)
    result["ood"] = ood_report.run_summary(ev["probs"], ood_probs, head_name, "synthetic_ood")
    flat = tables.flatten_metrics(result)
    flat.update(train_time_s=10.0, train_img_per_s=100.0)
    run_curve = [(e, t) for e, t in curve[:-1]] + [(curve[-1][0], result["top1"])]
    return {"run_dir": f"synthetic/{head_name}-s{seed}", "seed": seed, "result": result, "flat": flat,
            "curve": run_curve, "records": numpy_records}


def synthetic_variants(plan, seeds=(0, 1, 2), **kwargs):
    """plan: {head: (list of accuracies, one per seed, validation curve [(epoch, top1)])}."""
    return {head: [synthetic_run(head, s, acc[i], curve, **kwargs) for i, s in enumerate(seeds)]
            for head, (acc, curve) in plan.items()}


QUICKSTART_LIKE = {  # the 2-epoch quick start: sparse heads ahead, every curve still rising
    "softmax": ([0.902, 0.924, 0.895], [(1, 0.80), (2, 0.90)]),
    "sparsemax": ([0.942, 0.936, 0.937], [(1, 0.88), (2, 0.94)]),
    "entmax15": ([0.921, 0.926, 0.915], [(1, 0.85), (2, 0.92)]),
}


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "synthetic_report"
    variants = synthetic_variants(QUICKSTART_LIKE)
    table, path, results = document.write_report(
        variants, out, "Synthetic comparison", "python tests/synthetic_comparison.py",
        pairs=[("sparsemax", "softmax"), ("entmax15", "softmax")])
    verdicts, checks = document.verdict_lines(variants, results)
    print("\n".join(verdicts + checks))
    print(path)
