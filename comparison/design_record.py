"""RUNS_DIR/sequential_design.json, the record of an --until-settled comparison's design, guarded.

- One writer: a comparison that runs looks or emits one (--emit-slurm) holds the runs folder's lock,
  RUNS_DIR/run.lock (common/runlock.py: pid, host, start time; taken over once its process is gone,
  released at exit), from before it reads the record to its last line. A second one is refused in one
  line naming the holder, so a design is never replaced under a live comparison. --dry-run and
  --report-only write nothing and take no lock; they only refuse to read another design than the one
  a live comparison holds.
- Read whole or not at all: a record that is not one this code wrote (not UTF-8, not JSON, another
  shape, `Infinity`, nested past any limit, too large, edited: its fingerprint, its boundaries or its
  margin no longer match its fields) is one line naming the file and the fix, never a traceback.
- Checked against the runs there: comparison/settle.py's resolve_design refuses a runs folder that
  holds finished runs (a pair with MIN_SEEDS paired seeds) but no record. The record cannot be rebuilt
  from them: a run records its settings, not the margin or the looks it was trained for, and a design
  chosen now, after their results, would not bound the error rates.
"""
import contextlib
import math
import os

from common.io import DamagedJSON, read_json_record, write_json
from common.runlock import RunLock
from comparison.analysis.margins import METRIC_TABLE, margin_as_difference
from comparison.analysis.sequential import Design

DESIGN_FILE = "sequential_design.json"  # in RUNS_DIR: the design the comparison was started with
MAX_RECORD_BYTES = 1 << 20  # a record is ~2 KB: anything larger is not one, and is not read
MAX_RECORD_DEPTH = 8  # a record nests 5 deep (record, tuning, studies, a study, its search space)
LOCK_PURPOSE = "compare_heads --until-settled"


class DamagedRecord(ValueError):
    """The record is not one this code wrote; its message says how (resolve_design adds the fix)."""


def design_path(runs_dir):
    return os.path.join(runs_dir, DESIGN_FILE)


def design_record(metric, margin, design, tuning=None):
    """The JSON of RUNS_DIR/sequential_design.json. `tuning`: --tune --until-settled's tuning, part of its
    design (comparison/tune_settle.py: the budget and each study's settings), None without --tune."""
    return {"metric": metric, "margin": margin, "design": design.to_dict(),
            **({"tuning": tuning} if tuning is not None else {})}


def write_design(runs_dir, metric, margin, design, tuning=None):
    """Record the design (atomically; only under the runs folder's lock: `runs_folder(..., writes=True)`)."""
    write_json(design_record(metric, margin, design, tuning), design_path(runs_dir))


def read_design(runs_dir):
    """(metric, margin, Design, tuning) recorded in the runs folder (tuning: None without --tune), None when
    there is none; DamagedRecord when the file is not a record this code wrote (its message: what is wrong,
    without the path)."""
    path = design_path(runs_dir)
    if not os.path.lexists(path):
        return None
    data = _load(path)
    if not isinstance(data, dict):
        raise DamagedRecord(f"it holds a JSON {type(data).__name__}, not a design record's object")
    metric, margin, fields = data.get("metric"), data.get("margin"), data.get("design")
    if metric not in METRIC_TABLE or not isinstance(fields, dict) or not _is_number(margin):
        raise DamagedRecord("it lacks a known metric, a margin or a design")
    tuning = data.get("tuning")
    if tuning is not None and not isinstance(tuning, dict):
        raise DamagedRecord(f"its tuning is a JSON {type(tuning).__name__}, not an object")
    try:
        design = Design.from_dict(fields)
    except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as err:
        raise DamagedRecord(str(err).splitlines()[0][:300] if str(err) else type(err).__name__) from None
    if not math.isclose(margin_as_difference(metric, margin), design.margin, rel_tol=1e-12):
        raise DamagedRecord(f"its margin {margin:g} does not match its design's: the record was edited")
    return metric, float(margin), design, tuning


def _load(path):
    """The JSON value in `path`, read whole; DamagedRecord for anything that is not plain JSON."""
    if not os.path.isfile(path):
        raise DamagedRecord("it is not a file")
    try:
        return read_json_record(path, max_bytes=MAX_RECORD_BYTES, max_depth=MAX_RECORD_DEPTH)
    except DamagedJSON as err:
        raise DamagedRecord(str(err)) from None


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@contextlib.contextmanager
def runs_folder(runs_dir, writes):
    """The runs folder for one --until-settled invocation. `writes` (looks run here, --emit-slurm): its
    lock held until the block ends, or common.runlock.RunLockHeld (one line naming the holder) while a
    live comparison holds it; yields None. Otherwise (--dry-run, --report-only): no lock taken, nothing
    created; yields the RunLockHeld a writer would get now (a live comparison holds the folder), or None."""
    lock = RunLock(runs_dir, purpose=LOCK_PURPOSE, holder="comparison",
                   ways_out="or use another --runs-dir (the design recorded there is that comparison's)")
    if not writes:
        yield lock.held_elsewhere()
        return
    with lock:
        yield None
