"""The one reader of a run's evaluation in a comparison: RUN_DIR/eval.json (eval_ema.json) and its
per-example records STEM.examples.safetensors, as eval.py writes them. Whether a run counts as
evaluated (commands.py, and so the plan, the looks and the SLURM task's check), the report
(report/document.py), the looks' values (settle.py), the cost line (cost.py) and the MLflow log
(tracking.py) read an evaluation only through here.

What is checked before anything is read:
- shape: the JSON file is UTF-8 text holding one strict-JSON object (no repeated key; no NaN or
  Infinity, which eval.py writes as null) with the keys the report reads, of their types; the records
  file is a whole safetensors file holding every record field, each one row per example: eval.json's n.
- identity: the evaluation is this run's. The checkpoint it names is the run folder (in a runs folder
  moved or copied whole: a path ending in the folder the comparison planned, its request's
  train.output_dir); its weights are the file's (raw: eval.json, EMA: eval_ema.json); its head, model,
  norm and dataset are the ones the run was trained with (RUN_DIR/compare_request.json); the records
  name the same checkpoint, head and weights.
A file that fails is one line naming it and what is wrong. The comparison then counts the run as not
evaluated: a rerun evaluates it again, and --report-only (which evaluates nothing) refuses.
"""
import json
import os
from dataclasses import dataclass

from safetensors import SafetensorError, safe_open

from common import rundir
from common.errors import UserError

WEIGHTS_OF = {rundir.EVAL_RESULT: "raw", rundir.EVAL_EMA_RESULT: "ema"}  # the weights each eval file holds
READ_AGAIN = "evaluate the run again with eval.py (compare_heads without --report-only does it)"


@dataclass(frozen=True)
class NotEvaluated:
    """Why a run does not count as evaluated. `reason`: one line naming the file; `damaged`: a file is
    there but is not this run's evaluation as eval.py writes it (False: there is none yet, or it holds
    the results of another OOD set)."""
    reason: str
    damaged: bool


class DamagedEvaluation(UserError):
    """An evaluation file that is damaged, or another run's. `reason`: what is wrong, naming the file."""

    def __init__(self, reason):
        self.reason = reason
        super().__init__(f"{reason}; {READ_AGAIN}")


# ---- the shape of eval.json: what the report reads of it --------------------------------------------
# Each spec's problem(value, where) is None, or the first thing wrong: "'WHERE' is …" / "'WHERE' lacks …"
# (at the top, where = "": "is …" / "lacks …").
class _Number:
    """A JSON number; null where eval.py writes a metric that is not finite (`null_ok`)."""

    def __init__(self, null_ok=True, count=False):
        self.null_ok, self.count = null_ok, count

    def problem(self, value, where):
        if value is None and self.null_ok:
            return None
        if isinstance(value, bool) or not isinstance(value, int if self.count else (int, float)):
            return f"{_name(where)}is {_kind(value)}, not {'a count' if self.count else 'a number'}"
        return f"{_name(where)}is {value}, below 0" if self.count and value < 0 else None


class _Is:
    """A JSON value of Python type `kind` (str, bool), or null with `null_ok`."""

    def __init__(self, kind, null_ok=False):
        self.kind, self.null_ok = kind, null_ok

    def problem(self, value, where):
        if isinstance(value, self.kind) or (value is None and self.null_ok):
            return None
        return f"{_name(where)}is {_kind(value)}, not {_KINDS[self.kind]}"


class _List:
    def __init__(self, item):
        self.item = item

    def problem(self, value, where):
        if not isinstance(value, list):
            return f"{_name(where)}is {_kind(value)}, not a list"
        return next(filter(None, (self.item.problem(v, f"{where}[{i}]") for i, v in enumerate(value))), None)


class _Object:
    """A JSON object with `keys` ({key: spec}; those in `optional` may be missing) and, with `each`, any
    other keys, each value checked by `each` (a mapping such as {score name: its result})."""

    def __init__(self, keys=None, optional=(), each=None, null_ok=False):
        self.keys, self.optional, self.each, self.null_ok = keys or {}, set(optional), each, null_ok

    def problem(self, value, where):
        if value is None and self.null_ok:
            return None
        if not isinstance(value, dict):
            return f"{_name(where)}is {_kind(value)}, not an object"
        for key, spec in self.keys.items():
            if key not in value:
                if key not in self.optional:
                    return f"{_name(where)}lacks the key '{key}'"
                continue
            found = spec.problem(value[key], _inside(where, key))
            if found:
                return found
        if self.each is not None:
            return next(filter(None, (self.each.problem(v, _inside(where, k)) for k, v in value.items()
                                      if k not in self.keys)), None)
        return None


def _inside(where, key):
    return f"{where}.{key}" if where else key


def _name(where):
    return f"'{where}' " if where else ""


_KINDS = {str: "text", bool: "true or false", dict: "an object", list: "a list", int: "an integer",
          float: "a number", type(None): "null"}


def _kind(value):
    return _KINDS.get(type(value), type(value).__name__)


NUMBER, COUNT = _Number(), _Number(null_ok=False, count=True)
RESULT = _Object({
    "checkpoint": _Is(str), "weights": _Is(str), "head": _Is(str), "model": _Is(str), "norm": _Is(str, null_ok=True),
    "dataset": _Is(str), "split": _Is(str), "n": COUNT, "num_classes": COUNT,
    "top1": NUMBER, "top5": NUMBER, "loss": NUMBER, "ece": NUMBER,
    "reliability": _Object({"count": _List(COUNT), "confidence": _List(NUMBER), "accuracy": _List(NUMBER)}),
    "support_mean": NUMBER, "support_coverage": NUMBER, "support_hist": _List(COUNT),
    "learn_alpha": _Is(bool, null_ok=True), "wall_seconds": NUMBER,
    "prediction_sets": _Object({"methods": _Object(each=_Object({
        "eps": _Object(each=_Object({"coverage": NUMBER, "mean_set_size": NUMBER, "threshold": NUMBER})),
        "curve": _List(_Object({"eps": NUMBER, "mean_set_size": NUMBER, "coverage": NUMBER}))}))},
        optional=("methods",), null_ok=True),
    "selective": _Object(each=_Object({"aurc": NUMBER, "e_aurc": NUMBER}), null_ok=True),
    "ood": _Object({"dataset": _Is(str), "scores": _Object(each=_Object({"auroc": NUMBER, "fpr_at_tpr": NUMBER}))},
                   null_ok=True),
    "pooling": _Object(null_ok=True),
}, optional=("norm", "learn_alpha", "wall_seconds", "prediction_sets", "selective", "ood", "pooling"))


# ---- the readers ------------------------------------------------------------------------------------
def not_evaluated(run_dir, eval_file, ood=None):
    """None when `run_dir` holds its evaluation `eval_file` and its records, whole and its own (with the
    results of the OOD set `ood` when one is asked for); else a NotEvaluated saying why not. Reads the
    records file's header only (its shapes and names): the report reads the rows."""
    path = os.path.join(run_dir, eval_file)
    records = rundir.examples_path(path)
    if not os.path.isfile(path) or not os.path.isfile(records):
        return NotEvaluated(f"{run_dir} has no {os.path.basename(path if not os.path.isfile(path) else records)}",
                            damaged=False)
    try:
        result = read_result(run_dir, eval_file)
        with _opened(records) as f:
            _check_records(records, f, result, eval_file)
    except DamagedEvaluation as err:
        return NotEvaluated(err.reason, damaged=True)
    if ood and (result.get("ood") or {}).get("dataset") != ood:
        return NotEvaluated(f"{path} holds no results of the OOD set {ood}", damaged=False)
    return None


def read_result(run_dir, eval_file):
    """The checked eval result of `run_dir` (a dict); DamagedEvaluation when it is missing, damaged or
    another run's."""
    path = os.path.join(run_dir, eval_file)
    result = _strict_json(path)
    shape = RESULT.problem(result, "")
    if shape:
        raise DamagedEvaluation(f"{path} {shape}" if shape.startswith(("is ", "lacks ")) else f"{path}: {shape}")
    _check_identity(path, result, run_dir, eval_file)
    return result


def read_records(run_dir, eval_file, result=None):
    """The checked per-example records of `run_dir`'s evaluation ({field: numpy array}, one row per
    example); `result`: its eval result when read already. DamagedEvaluation when damaged or another run's."""
    result = result if result is not None else read_result(run_dir, eval_file)
    path = rundir.examples_path(os.path.join(run_dir, eval_file))
    try:
        with _opened(path) as f:
            _check_records(path, f, result, eval_file)
            return {key: f.get_tensor(key) for key in f.keys()}
    except (SafetensorError, OSError) as err:  # (a file changed while it was read)
        raise DamagedEvaluation(f"{path} is cut or damaged ({_first_line(err)})") from None


def _strict_json(path):
    """The JSON value of the file at `path`, read strictly; DamagedEvaluation naming what is wrong."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise DamagedEvaluation(f"cannot read {path} ({err.strerror or err})") from None
    if not data.strip():
        raise DamagedEvaluation(f"{path} is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DamagedEvaluation(f"{path} is not text (byte {err.start} is not UTF-8): not eval.py's JSON") from None
    try:
        return json.loads(text, object_pairs_hook=_no_repeated_key, parse_constant=_no_constant)
    except json.JSONDecodeError as err:
        raise DamagedEvaluation(f"{path} is not valid JSON, cut short or damaged ({err.msg}: line {err.lineno} "
                                f"column {err.colno})") from None
    except RecursionError:
        raise DamagedEvaluation(f"{path} is nested too deep to be eval.py's JSON") from None
    except ValueError as err:  # _no_repeated_key, _no_constant
        raise DamagedEvaluation(f"{path} {err}") from None


def _no_repeated_key(pairs):
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise ValueError(f"repeats the key '{key}'")
        seen.add(key)
    return dict(pairs)


def _no_constant(name):
    raise ValueError(f"holds {name}, which eval.py never writes (it writes null)")


def _planned(run_dir):
    """The resolved config the comparison asked for `run_dir` (its compare_request.json), None when the
    run has no readable request (the ledger, comparison/ledger.py, answers for a damaged one)."""
    try:
        with open(os.path.join(run_dir, rundir.COMPARE_REQUEST), encoding="utf-8") as f:
            resolved = json.load(f).get("resolved")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    return resolved if isinstance(resolved, dict) else None


def _check_identity(path, result, run_dir, eval_file):
    """DamagedEvaluation when `result` is not an evaluation of `run_dir`'s weights of `eval_file`."""
    planned = _planned(run_dir) or {}
    if not _names_run(result["checkpoint"], run_dir, (planned.get("train") or {}).get("output_dir")):
        raise DamagedEvaluation(f"{path} is the evaluation of {result['checkpoint']} (head {result['head']}), "
                                f"not of {run_dir}")
    weights = WEIGHTS_OF.get(os.path.basename(eval_file))
    if weights and result["weights"] != weights:
        raise DamagedEvaluation(f"{path} evaluates the {result['weights']} weights; {os.path.basename(eval_file)} "
                                f"is the {weights} weights' evaluation")
    sections = {"head": ("head", "name"), "model": ("model", "name"), "norm": ("model", "norm"),
                "dataset": ("data", "dataset")}  # eval.py's key: where the run's config has it
    for key, (section, name) in sections.items():
        trained = planned.get(section) if isinstance(planned.get(section), dict) else {}
        if name in trained and key in result and result[key] != trained[name]:
            raise DamagedEvaluation(f"{path} is the evaluation of {key} {result[key]}, but {run_dir} was "
                                    f"trained with {key} {trained[name]}")


def _names_run(checkpoint, run_dir, planned_dir):
    """Whether the checkpoint path an evaluation names is `run_dir`: the same folder, or (a runs folder
    moved or copied whole) a path ending in the folder the comparison planned for it (its name alone
    when no plan is recorded)."""
    if os.path.realpath(checkpoint) == os.path.realpath(run_dir):
        return True
    tail = [p for p in os.path.normpath(planned_dir or os.path.basename(os.path.normpath(run_dir))).split(os.sep)
            if p not in ("", ".", "..")]
    parts = os.path.normpath(checkpoint).split(os.sep)
    return bool(tail) and parts[-len(tail):] == tail and tail[-1] == os.path.basename(os.path.normpath(run_dir))


def _opened(path):
    """safe_open of a records file; DamagedEvaluation when it is not a whole safetensors file."""
    try:
        return safe_open(path, framework="numpy")
    except (SafetensorError, OSError) as err:
        raise DamagedEvaluation(f"{path} is cut or damaged: not a whole safetensors file "
                                f"({_first_line(err)})") from None


def _check_records(path, f, result, eval_file):
    """DamagedEvaluation unless the open records file `f` holds every record field, one row per example
    of `result` (its n), and names the same checkpoint, head and weights."""
    from evaluation.examples import OPTIONAL_FIELDS, RECORD_FIELDS  # heavy: torch (seconds); this module loads on
    # compare_heads' torch-free path, through commands.py

    meta = f.metadata() or {}
    for key in ("checkpoint", "head", "weights"):
        if meta.get(key) != result[key]:
            raise DamagedEvaluation(f"{path} holds the records of {key} {meta.get(key)}, not of "
                                    f"{os.path.basename(eval_file)}'s {key} {result[key]}")
    names = set(f.keys())
    lacking = [k for k in RECORD_FIELDS if k not in names]
    if lacking:
        raise DamagedEvaluation(f"{path} lacks the record{'s' if len(lacking) > 1 else ''} {', '.join(lacking)}")
    for key in sorted(names & set(RECORD_FIELDS + OPTIONAL_FIELDS)):
        shape = list(f.get_slice(key).get_shape())
        if shape != [result["n"]]:
            raise DamagedEvaluation(f"{path} holds {' × '.join(map(str, shape)) or 'a scalar'} '{key}' record(s), "
                                    f"not one per example: {os.path.basename(eval_file)} counts n = {result['n']}")


def _first_line(err):
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
