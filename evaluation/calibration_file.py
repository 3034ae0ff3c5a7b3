"""The conformal thresholds eval.py calibrates, stored in the run directory for predict.py.

RUN_DIR/conformal.json (raw weights) or conformal_ema.json (EMA weights), written atomically by
eval.py each time it calibrates prediction sets on a run directory:

    {"format": 1, "date": "2026-12-01T09:30:00Z", "head": "sparsemax", "alpha": 2.0,
     "weights": "raw", "weights_sha256": "...", "calibration": {"source": "calib", "n_calib": 64,
     "aps_seed": ...}, "warning": null or the small-calibration warning,
     "thresholds": [{"method": "support", "epsilon": 0.1, "threshold": 0.83, "n_calib": 64}, ...]}

A threshold of null means +inf (too few calibration samples for 1 − ε: every class is in the set).
The sets themselves are built by evaluation.conformal.set_mask, the code eval.py measures them with.
The weights' sha256 ties the thresholds to the weights they were calibrated on: a run that trained on
afterwards has other weights, and its old thresholds no longer hold.
"""
import datetime
import json
import math
import os

from common.errors import UserError
from common.io import write_json

FORMAT = 1
CONFORMAL_FILES = {"raw": "conformal.json", "ema": "conformal_ema.json"}


def conformal_path(run_dir, weights_kind):
    """Where the thresholds of a run's raw or EMA weights live."""
    return os.path.join(run_dir, CONFORMAL_FILES[weights_kind])


def threshold_rows(methods, n_calib):
    """eval.py's prediction-set results ({method: {"eps": {"0.1": {"threshold", ...}}}}) -> rows."""
    return [{"method": method, "epsilon": float(eps), "threshold": res["threshold"], "n_calib": int(n_calib)}
            for method, per_method in methods.items() for eps, res in per_method["eps"].items()]


def save_thresholds(path, *, prediction_sets, head, alpha, weights_kind, weights_sha256, warning=None):
    """Write the thresholds of eval.py's `prediction_sets` result (calibration + methods) atomically."""
    calibration = prediction_sets["calibration"]
    record = {
        "format": FORMAT,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "head": head, "alpha": alpha, "weights": weights_kind, "weights_sha256": weights_sha256,
        "calibration": {k: calibration[k] for k in ("source", "n_calib", "aps_seed") if k in calibration},
        "warning": warning,
        "thresholds": threshold_rows(prediction_sets["methods"], calibration["n_calib"]),
    }
    write_json(record, path)  # strict JSON: an infinite threshold becomes null
    return record


def load_thresholds(path):
    """The record `save_thresholds` wrote, thresholds as floats (null -> +inf); None if there is no file."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
        if record.get("format") != FORMAT:
            raise ValueError(f"format {record.get('format')!r}, expected {FORMAT}")
        for row in record["thresholds"]:
            row["threshold"] = math.inf if row["threshold"] is None else float(row["threshold"])
            row["epsilon"] = float(row["epsilon"])
            if row["method"] not in ("support", "lac", "aps"):
                raise ValueError(f"unknown method {row['method']!r}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise UserError(f"{path} is unreadable ({err}); re-run python eval.py on the run to recalibrate") from None
    return record
