"""Classification metrics on gathered logits/probabilities: accuracy, calibration, sparsity.

Everything here is a pure function of tensors (no model, no data loader, no processes), so it is
tested on hand-built probabilities. Reductions are done in float64 so that numbers do not depend
on the order in which processes' shards were concatenated.

References:
  - Guo et al., "On Calibration of Modern Neural Networks", ICML 2017 (ECE with equal-width bins
    on the max-probability confidence; reliability diagrams).
  - Blondel, Martins & Niculae, "Learning with Fenchel-Young Losses", JMLR 2020 (the head's loss).
  - Martins & Astudillo 2016 (sparsemax), Peters et al. 2019 (entmax): probabilities can be exactly
    zero, so the NLL is infinite on some samples; we report it where finite plus how often the
    true class got zero probability.
"""
import math

import torch

ECE_BINS = 15


def topk_accuracy(logits, labels, ks=(1, 5)):
    """Fraction of samples whose label is among the k highest logits, for each k in `ks`.

    Logits rather than probabilities: every head's mapping is order-preserving, and logits break
    the ties that sparse heads create among zero-probability classes. k is capped at the number of
    classes (top-5 on 3 classes is top-3).
    """
    n, num_classes = logits.shape
    if n == 0:
        return {k: float("nan") for k in ks}
    kmax = min(max(ks), num_classes)
    top = logits.topk(kmax, dim=1).indices
    hits = top == labels.view(-1, 1)
    return {k: hits[:, : min(k, num_classes)].any(dim=1).double().mean().item() for k in ks}


def nll_where_finite(probs, labels):
    """Mean −log p_y over samples with p_y > 0, the count of those, and the zero-probability fraction.

    Under a sparse head the true class may get probability exactly 0 (infinite NLL); averaging
    only the finite part and reporting how often it is infinite keeps both pieces of information.
    """
    p_true = probs.gather(1, labels.view(-1, 1)).squeeze(1).double()
    finite = p_true > 0
    n = p_true.numel()
    n_finite = int(finite.sum())
    nll = (-p_true[finite].log()).mean().item() if n_finite else float("nan")
    zero_frac = (n - n_finite) / n if n else float("nan")
    return {"nll": nll, "nll_n": n_finite, "zero_prob_frac": zero_frac}


def calibration(probs, labels, n_bins=ECE_BINS):
    """Expected calibration error (Guo et al. 2017) and the reliability-diagram data.

    Confidence = the max probability, correct = (argmax == label); bins are equal-width on [0, 1],
    bin b holding (b/n_bins, (b+1)/n_bins] (the first also holds 0).
    ECE = Σ_b (n_b / n) · |accuracy_b − confidence_b|.
    Returns {"ece", "reliability": {"bin_lower", "bin_upper", "confidence", "accuracy", "count"}};
    empty bins have confidence/accuracy None (JSON null).
    """
    conf, pred = probs.double().max(dim=1)
    correct = (pred == labels).double()
    # ceil(conf·B) − 1 puts conf in (b/B, (b+1)/B] into bin b; clamp keeps 0 in bin 0.
    bin_idx = (torch.ceil(conf * n_bins) - 1).clamp(0, n_bins - 1).long()
    count = torch.bincount(bin_idx, minlength=n_bins).double()
    conf_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bin_idx, conf)
    acc_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bin_idx, correct)
    n = conf.numel()
    nonempty = count > 0
    mean_conf = torch.where(nonempty, conf_sum / count.clamp(min=1), torch.zeros_like(conf_sum))
    mean_acc = torch.where(nonempty, acc_sum / count.clamp(min=1), torch.zeros_like(acc_sum))
    ece = ((count / max(n, 1)) * (mean_acc - mean_conf).abs()).sum().item() if n else float("nan")
    rel = {
        "bin_lower": [b / n_bins for b in range(n_bins)],
        "bin_upper": [(b + 1) / n_bins for b in range(n_bins)],
        "confidence": [mean_conf[b].item() if nonempty[b] else None for b in range(n_bins)],
        "accuracy": [mean_acc[b].item() if nonempty[b] else None for b in range(n_bins)],
        "count": [int(c) for c in count.tolist()],
    }
    return {"ece": ece, "reliability": rel}


def support_stats(probs, labels):
    """Support (non-zero set) size per sample: mean, median, histogram; and true-class coverage.

    `support_hist[i]` counts samples whose support has i+1 classes (length = number of classes).
    `support_coverage` is the fraction of samples whose support contains the true class, i.e.
    the coverage of the head's own (uncalibrated) prediction set.
    """
    n, num_classes = probs.shape
    support = probs > 0
    size = support.sum(dim=1)
    hist = torch.bincount(size, minlength=num_classes + 1)[1:]  # size 0 impossible (sums to 1)
    covered = support.gather(1, labels.view(-1, 1)).squeeze(1)
    if n == 0:
        return {"support_mean": float("nan"), "support_median": float("nan"),
                "support_hist": hist.tolist(), "support_coverage": float("nan")}
    return {
        "support_mean": size.double().mean().item(),
        # The usual median (average of the two middle values), not torch's lower median.
        "support_median": float(size.double().quantile(0.5).item()),
        "support_hist": hist.tolist(),
        "support_coverage": covered.double().mean().item(),
    }


def per_class_accuracy(logits, labels, num_classes):
    """Top-1 accuracy of each class (None for a class with no samples), their mean (balanced
    accuracy) and their minimum (the worst class)."""
    pred = logits.argmax(dim=1)
    total = torch.bincount(labels, minlength=num_classes)
    right = torch.bincount(labels[pred == labels], minlength=num_classes)
    per_class = [(right[c] / total[c]).item() if total[c] > 0 else None for c in range(num_classes)]
    present = [a for a in per_class if a is not None]
    balanced = sum(present) / len(present) if present else float("nan")
    worst = min(present) if present else float("nan")
    return {"per_class_accuracy": per_class, "balanced_accuracy": balanced, "worst_class_accuracy": worst}


def fy_loss(head, logits, labels, chunk=8192):
    """Mean Fenchel-Young loss of the head (label smoothing off: the loss of the hard label)."""
    if logits.shape[0] == 0:
        return float("nan")
    total = 0.0
    with torch.no_grad():
        for start in range(0, logits.shape[0], chunk):
            part = head.loss(logits[start:start + chunk], labels[start:start + chunk], reduction="sum")
            total += float(part.double())
    return total / logits.shape[0]


def classification_metrics(logits, labels, head, probs=None, n_bins=ECE_BINS):
    """All per-sample-derived metrics of one evaluation, as a JSON-ready dict.

    logits: float (N, K) gathered over processes; labels: int64 (N,); head: the model's
    OutputHead (gives probabilities and the Fenchel-Young loss).
    """
    logits = logits.float()
    labels = labels.long()
    num_classes = logits.shape[1]
    if probs is None:
        with torch.no_grad():
            probs = head(logits)
    probs = probs.float()
    acc = topk_accuracy(logits, labels, ks=(1, 5))
    out = {"n": int(labels.numel()), "num_classes": num_classes, "top1": acc[1], "top5": acc[5],
           "loss": fy_loss(head, logits, labels)}
    out.update(nll_where_finite(probs, labels))
    out.update(calibration(probs, labels, n_bins=n_bins))
    out.update(support_stats(probs, labels))
    out.update(per_class_accuracy(logits, labels, num_classes))
    return out


def is_scalar_metric(value):
    """True for numbers (the values that go into CSV rows and summary tables)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)
