"""The request ledger: each run directory records what the comparison asked train.py for
(RUN_DIR/compare_request.json: the overrides and the resolved config), so that a run trained with
other settings is refused, never mixed into a report of these."""
import json
import os

import configs
from common import rundir
from common.errors import UserError
from common.io import DamagedJSON, json_text, read_json_record, write_json
from common.runlock import RunLock


def request_of(config, overrides):
    """What a run asks for: the config file, its overrides and the config they resolve to."""
    return {"config": config, "overrides": overrides,
            "resolved": configs.config_to_dict(configs.load_config(config, overrides))}


def check_request(run_dir, request, create=True):
    """Refuse to mix a run trained with other settings (overrides or config contents) into this
    comparison; record the request when the run is first started. Where the config file lies is not a
    setting: a runs folder moved together with its config is the same comparison."""
    path = os.path.join(run_dir, rundir.COMPARE_REQUEST)
    request = json.loads(json_text(request))  # tuples -> lists, as stored
    if os.path.isfile(path):
        previous = _in_todays_schema(_recorded(path, run_dir))
        if _settings(previous) != _settings(request):
            diff = _first_difference(previous.get("resolved", {}), request.get("resolved", {})) \
                or " ".join(previous.get("overrides", []))
            raise UserError(f"{run_dir} was trained with other settings ({diff}); "
                            f"use another --runs-dir or delete that run")
    elif create:
        with RunLock(run_dir, purpose="compare_heads"):  # not while another process trains or evaluates there
            write_json(request, path)


def _recorded(path, run_dir):
    """The request a run folder recorded; a damaged record (not JSON, not an object, absurdly deep) is one line."""
    try:
        recorded = read_json_record(path)
    except DamagedJSON as err:
        recorded = err
    if not isinstance(recorded, dict):
        why = recorded if isinstance(recorded, DamagedJSON) else f"it holds a JSON {type(recorded).__name__}"
        raise UserError(f"{path} is damaged: {why}; the settings {run_dir} was trained with are unknown: move that "
                        f"run away to train it again, or use another --runs-dir")
    return recorded


def _settings(request):
    """What a request asks for: its overrides and resolved config, not the config file's path."""
    return {key: value for key, value in request.items() if key != "config"}


def _in_todays_schema(request):
    """A stored request with its resolved config read by today's loader: keys added since at their
    defaults, so an older comparison continues. A resolved config today's loader refuses is compared
    as stored."""
    if not isinstance(request.get("resolved"), dict):
        return request
    try:
        resolved = configs.config_to_dict(configs.config_from_dict(request["resolved"]))
    except UserError:
        return request
    return {**request, "resolved": json.loads(json_text(resolved))}


def _first_difference(old, new, prefix=""):
    """'optim.lr: 0.004 -> 0.002' for the first differing leaf of two nested dicts."""
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diff = _first_difference(a, b, f"{prefix}{key}.")
            if diff:
                return diff
        elif a != b:
            return f"{prefix}{key}: {a!r} -> {b!r}"
    return None
