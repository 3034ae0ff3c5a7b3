"""Classification metrics: per-example records of a batch's logits, and accuracy, calibration and
sparsity computed from them.

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

import torch

from .ece_bins import ECE_BINS


def nll_of_true_class(p_true):
    """Mean −log p_y over samples with p_y > 0, the count of those, and the zero-probability fraction.

    Under a sparse head the true class may get probability exactly 0 (infinite NLL); averaging
    only the finite part and reporting how often it is infinite keeps both pieces of information.
    """
    p_true = p_true.double()
    finite = p_true > 0
    n = p_true.numel()
    n_finite = int(finite.sum())
    nll = (-p_true[finite].log()).mean().item() if n_finite else float("nan")
    zero_frac = (n - n_finite) / n if n else float("nan")
    return {"nll": nll, "nll_n": n_finite, "zero_prob_frac": zero_frac}


def calibration_from_confidence(conf, correct, n_bins=ECE_BINS):
    """ECE and reliability data from per-example confidence (N,) and correctness (N,) tensors.

    Bins are equal-width on [0, 1], bin b holding (b/n_bins, (b+1)/n_bins] (the first also holds 0).
    """
    conf = conf.double().cpu()
    # ceil(conf·B) − 1 puts conf in (b/B, (b+1)/B] into bin b; clamp keeps 0 in bin 0.
    bin_idx = (torch.ceil(conf * n_bins) - 1).clamp(0, n_bins - 1).long()
    count = torch.bincount(bin_idx, minlength=n_bins).double()
    conf_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bin_idx, conf)
    acc_sum = torch.zeros(n_bins, dtype=torch.float64).index_add_(0, bin_idx, correct.double().cpu())
    return calibration_from_bins(count.tolist(), conf_sum.tolist(), acc_sum.tolist())


def calibration_from_bins(count, conf_sum, acc_sum):
    """The one ECE formula (Guo et al. 2017), from per-bin sample counts and sums of confidence and
    correctness (lists of equal length; bins may pool several runs).

    ECE = Σ_b (n_b / n) · |accuracy_b − confidence_b|.
    Returns {"ece", "reliability": {"bin_lower", "bin_upper", "confidence", "accuracy", "count"}};
    empty bins have confidence/accuracy None (JSON null); ECE is NaN when every bin is empty.
    """
    n_bins, n = len(count), sum(count)
    conf = [conf_sum[b] / count[b] if count[b] else None for b in range(n_bins)]
    acc = [acc_sum[b] / count[b] if count[b] else None for b in range(n_bins)]
    ece = sum(count[b] / n * abs(acc[b] - conf[b]) for b in range(n_bins) if count[b]) if n else float("nan")
    rel = {
        "bin_lower": [b / n_bins for b in range(n_bins)],
        "bin_upper": [(b + 1) / n_bins for b in range(n_bins)],
        "confidence": conf,
        "accuracy": acc,
        "count": [int(c) for c in count],
    }
    return {"ece": ece, "reliability": rel}


def support_stats_of_sizes(size, covered, num_classes):
    """Support (non-zero set) size per sample: mean, median, histogram; and true-class coverage.

    size: int (N,) support sizes; covered: bool (N,) whether the support holds the true class.
    `support_hist[i]` counts samples whose support has i+1 classes (length = number of classes).
    `support_coverage` is the fraction of samples whose support contains the true class, i.e.
    the coverage of the head's own (uncalibrated) prediction set.
    """
    size = size.long().cpu()
    hist = torch.bincount(size, minlength=num_classes + 1)[1:]  # size 0 impossible (sums to 1)
    if size.numel() == 0:
        return {"support_mean": float("nan"), "support_median": float("nan"),
                "support_hist": hist.tolist(), "support_coverage": float("nan")}
    return {
        "support_mean": size.double().mean().item(),
        # The usual median (average of the two middle values), not torch's lower median.
        "support_median": float(size.double().quantile(0.5).item()),
        "support_hist": hist.tolist(),
        "support_coverage": covered.double().mean().item(),
    }


def class_accuracy(pred, labels, num_classes):
    """Top-1 accuracy of each class (None for a class with no samples), their mean (balanced
    accuracy) and their minimum (the worst class)."""
    pred, labels = pred.cpu(), labels.cpu()
    total = torch.bincount(labels, minlength=num_classes)
    right = torch.bincount(labels[pred == labels], minlength=num_classes)
    per_class = [(right[c] / total[c]).item() if total[c] > 0 else None for c in range(num_classes)]
    present = [a for a in per_class if a is not None]
    balanced = sum(present) / len(present) if present else float("nan")
    worst = min(present) if present else float("nan")
    return {"per_class_accuracy": per_class, "balanced_accuracy": balanced, "worst_class_accuracy": worst}


# ----------------------------------------------------------------------------- per-example records
# Every evaluation (train.py's periodic one, eval.py, the comparison through eval.py's files) turns
# each batch of logits into these records; the metrics above and below are functions of them.
RECORD_FIELDS = ("label", "pred", "p_y", "max_prob", "support_size", "loss", "top5_hit")


def example_records(logits, labels, head, ids=None):
    """Per-example outcome of float logits (N, K) and int64 labels (N,) under `head`, on their device:
    label, pred (the predicted class: the top logit, the lowest index among tied ones), p_y and
    max_prob (the head's probabilities of the label and of pred: the confidence, one definition for
    every head), support_size (classes with p > 0), loss (the head's Fenchel-Young loss of the hard
    label), top5_hit. `ids` (N,): the examples' indices in their split, which a random head's noise
    follows (so a record does not depend on the batch); None: positions in this call.

    pred is the top logit for every head: for the entmax family, normmax, top-k and am_softmax it is
    also the top probability; for perturbmax it is the mode of the exact p_sigma (i.i.d. noise: a
    larger logit wins more often), and max_prob = p_hat[pred], the draws' unbiased estimate of that
    mode's probability, rather than the largest of the draws' frequencies, which may name another
    class and is biased upward; Taylor softmax (not monotone below its vertex) may put more mass on
    a class with a very negative logit: its confidence is still p[pred], the class it is scored on."""
    logits, labels = logits.float(), labels.long()
    with torch.no_grad():
        probs = head(logits, ids=ids).float()
        loss = head.loss(logits, labels, reduction="none", ids=ids).float()
    pred = logits.argmax(dim=1)  # torch: the first maximal index on ties
    top = logits.topk(min(5, logits.shape[1]), dim=1).indices
    return {
        "label": labels,
        "pred": pred,
        "p_y": probs.gather(1, labels.view(-1, 1)).squeeze(1),
        "max_prob": probs.gather(1, pred.view(-1, 1)).squeeze(1),
        "support_size": (probs > 0).sum(dim=1),
        "loss": loss,
        "top5_hit": (top == labels.view(-1, 1)).any(dim=1),
    }


def record_sums(records):
    """float64 (5,) on the records' device, no host read: correct top-1, top-5 hits, loss, support size, n."""
    label = records["label"]
    return torch.stack([
        (records["pred"] == label).sum().double(),
        records["top5_hit"].sum().double(),
        records["loss"].double().sum(),
        records["support_size"].sum().double(),
        torch.tensor(float(label.numel()), dtype=torch.float64, device=label.device),
    ])


def means_from_sums(sums):
    """{"top1", "top5", "loss", "support_size", "n"} from record_sums (added over batches / ranks).
    An empty split (n = 0) has no means: NaN (written as null), never 0."""
    values = sums.tolist()
    n = int(values[4])
    mean = (lambda v: v / n) if n else (lambda v: float("nan"))
    return {"top1": mean(values[0]), "top5": mean(values[1]), "loss": mean(values[2]),
            "support_size": mean(values[3]), "n": n}


def metrics_from_records(records, num_classes, n_bins=ECE_BINS):
    """All metrics of one evaluation, as a JSON-ready dict, from the whole split's records."""
    label, pred, p_y = records["label"].long(), records["pred"].long(), records["p_y"]
    n = int(label.numel())
    means = means_from_sums(record_sums(records))
    nan = float("nan")
    out = {"n": n, "num_classes": num_classes, "top1": means["top1"] if n else nan,
           "top5": means["top5"] if n else nan, "loss": means["loss"] if n else nan}
    out.update(nll_of_true_class(p_y))
    out.update(calibration_from_confidence(records["max_prob"], pred == label, n_bins=n_bins))
    out.update(support_stats_of_sizes(records["support_size"], p_y > 0, num_classes))
    out.update(class_accuracy(pred, label, num_classes))
    return out

