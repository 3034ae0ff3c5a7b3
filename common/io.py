"""File writes shared by every package.

Atomic text writes: a reader, or a run resumed after a kill, sees the old file or the new one,
never half of one (temp file in the same folder, fsync, os.replace).

JSON: strict JSON everywhere (checkpoints, summary.json, metrics.jsonl, eval results). JSON has
no NaN or infinity, so a non-finite float is written as null: a skipped update's loss, an empty
split's accuracy, an unreachable conformal threshold. Readers treat null as "no finite value".
"""
import json
import math
import os


def atomic_write_text(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def strict_json(obj):
    """`obj` with every non-finite float replaced by None (recursively through dicts, lists, tuples)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def json_text(obj, indent=None):
    """The one JSON encoding: strict (NaN/inf -> null), key order kept."""
    return json.dumps(strict_json(obj), indent=indent, allow_nan=False)


def write_json(obj, path):
    """Atomic strict-JSON file (indent 1, trailing newline); creates the parent folder."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(path, json_text(obj, indent=1) + "\n")
