"""Out-of-distribution detection of one run (eval.py --ood-dataset): the OOD set it is measured against
and the results eval.py stores (the comparison report pools them over seeds: comparison/report/ood_section.py).

Detection numbers are `evaluation.ood.ood_detection` (AUROC, FPR at 95% TPR; definitions and
references there) on the scores `evaluation.ood.ood_scores`: max probability, entropy and, for the
sparse heads, support size. Score histograms (in-distribution vs OOD) are stored with fixed bins so
that the seeds of a head add up: max probability on [0, 1], entropy on [0, ln K], support size 1..K.
"""
import copy
import math

import numpy as np

from common.errors import UserError
from common.suggest import suggest_value
from data.registry import dataset_names, dataset_spec
from models.registry import is_sparse

from .ood import ood_detection, ood_scores

HIST_BINS = 20


def ood_dataset_names():
    """The datasets an image model can be tested on as OOD sets: every declared image dataset."""
    return dataset_names(features=False)


def default_ood_dataset(dataset):
    """The OOD set `--ood-dataset auto` means for an in-distribution dataset: its declared partner
    (data/registry.py), None if it has none."""
    return dataset_spec(dataset).ood


def resolve_ood_dataset(name, dataset, flag="--ood-dataset"):
    """'auto' -> the dataset's declared OOD partner (UserError when it has none); another name must be
    a declared image dataset (UserError naming the valid ones)."""
    if name == "auto":
        ood = default_ood_dataset(dataset)
        if ood is None:
            having = [n for n in dataset_names() if dataset_spec(n).ood is not None]
            raise UserError(f"{flag} auto: {dataset} has no built-in OOD set (only {', '.join(having)} do); name one, "
                            f"e.g. {flag} imagefolder --ood-root DIR")
        return ood
    if name not in ood_dataset_names():
        raise UserError(f"unknown {flag} '{name}'{suggest_value(name, ood_dataset_names())}; valid: auto, "
                        f"{', '.join(ood_dataset_names())}")
    return name


def ood_data(data_cfg, name, root=None):
    """The data config the OOD set `name` is read with: the run's, with that dataset, its root (--ood-root;
    default the run's data.root) and no calib hold-out (the whole val split is evaluated)."""
    ood = copy.deepcopy(data_cfg)
    ood.dataset = name
    if root:
        ood.root = root
    ood.calib_fraction = 0.0
    return ood


def _histograms(scores_in, scores_out, num_classes):
    hists = {}
    ranges = {"max_prob": (0.0, 1.0), "neg_entropy": (0.0, math.log(num_classes))}
    for name, (lo, hi) in ranges.items():
        edges = np.linspace(lo, hi, HIST_BINS + 1)
        sign = -1.0 if name.startswith("neg_") else 1.0  # histogram the entropy itself, not its negative
        key = name[4:] if name.startswith("neg_") else name
        hists[key] = {"edges": edges.tolist(),
                      "in": np.histogram(np.clip(sign * scores_in[name], lo, hi), edges)[0].tolist(),
                      "out": np.histogram(np.clip(sign * scores_out[name], lo, hi), edges)[0].tolist()}
    if "neg_support" in scores_in:
        edges = np.arange(0.5, num_classes + 1.5)
        hists["support"] = {"edges": edges.tolist(),
                            "in": np.histogram(-scores_in["neg_support"], edges)[0].tolist(),
                            "out": np.histogram(-scores_out["neg_support"], edges)[0].tolist()}
    return hists


def run_summary(probs_in, probs_out, head_name, dataset, extra_in=None, extra_out=None, tpr=0.95):
    """JSON-ready OOD results of one evaluation from the head's probabilities (N, K) on the
    in-distribution split and on the OOD set, plus any other scores ({name: (N,)}, e.g. from the
    logits and the feature memory, evaluation/ood_scores.py) in extra_in / extra_out."""
    sparse = is_sparse(head_name)
    scores_in, scores_out = ood_scores(probs_in, sparse=sparse), ood_scores(probs_out, sparse=sparse)
    scores_in.update(extra_in or {})
    scores_out.update(extra_out or {})
    detection = ood_detection(scores_in, scores_out, tpr=tpr)
    return {"dataset": dataset, "n_in": int(probs_in.shape[0]), "n_out": int(probs_out.shape[0]), "tpr": tpr,
            "scores": {name: {"auroc": d["auroc"], "fpr_at_tpr": d["fpr_at_tpr"]} for name, d in detection.items()},
            "histograms": _histograms(scores_in, scores_out, int(probs_in.shape[1]))}
