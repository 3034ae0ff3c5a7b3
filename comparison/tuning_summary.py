"""What --tune shows of its studies: a line per study on the terminal, the plain data of the report's
tuning section (comparison/report/tuning_section.py plots and words it; REPORT_DIR/tuning.json), and what the
tuned comparison's plain words say was tuned (comparison/report/plain_words.py's TUNED)."""
import json

import optuna

import configs
from comparison import tuning
from comparison.tuning_storage import retry_history


def say_studies(studies):
    for name, study in studies.items():
        counts = study.counts()
        space = ", ".join(f"{k} {r.text()}" for k, r in study.space.items()) or "nothing to tune"
        print(f"[tune {name}] {counts.get('COMPLETE', 0)}/{study.trials} complete trial(s) "
              f"({', '.join(f'{v} {k.lower()}' for k, v in sorted(counts.items())) or 'none yet'}); searching {space}")


def trial_note(trial, retried):
    """Why a trial failed, where it is known: given back (past the budget) or retried (its process was lost)."""
    if trial.user_attrs.get(tuning.SURPLUS):
        return "surplus"
    return "retried" if trial.number in retried else None


def tuning_summary(studies, best, timing, tune_split, config_path):
    """What the report shows of each study (plain data: comparison/report/tuning_section.py plots it);
    `tune_split`: {"images", "fraction"} of the split the trials scored on; `config_path`: the
    config the untuned arm trains (its settings of each tuned key are shown beside the chosen ones)."""
    out = {"timing": timing or None, "tune_split": tune_split, "variants": {}}
    for name, study in studies.items():
        frozen = study.study.get_trials(deepcopy=False)
        retried = {n for t in frozen for n in retry_history(t)}
        trials = [{"number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
                   "epochs": t.user_attrs.get(tuning.EPOCHS), "diverged": bool(t.user_attrs.get(tuning.DIVERGED)),
                   "run_dir": t.user_attrs.get(tuning.RUN_DIR), "retry_of": (retry_history(t) or [None])[0],
                   "note": trial_note(t, retried)} for t in frozen]
        out["variants"][name] = {
            "study": study.name, "space": {k: r.text() for k, r in study.space.items()}, "trials": trials,
            "budget": study.trials, "budget_epochs": study.epochs, "best": None if best[name] is None else {
                "number": best[name].number, "value": best[name].value, "params": best[name].params,
                "text": tuning.shown_settings(best[name].params)},
            "config_settings": config_settings(config_path, study), "importance": importance(study)}
    return json.loads(json.dumps(out))


def config_settings(config_path, study):
    """{"params", "text"}: the untuned arm's value of each key the study tunes, from the config the
    variant resolves to (the comparison's and the variant's overrides: the untuned runs' own)."""
    cfg = configs.load_config(config_path, study.overrides)
    params = {}
    for key in study.space:
        section, leaf = key.split(".", 1)
        params[key] = getattr(getattr(cfg, section), leaf)
    return {"params": params, "text": tuning.shown_settings(params)}


def tuned_words(studies):
    """comparison/report/plain_words.py's TUNED: the settings tuned (across the variants) and each one's complete
    trials."""
    keys = []
    for study in studies.values():
        keys += [k for k in study.space if k not in keys]
    return {"settings": keys or ["nothing tunable"], "complete": {n: s.complete() for n, s in studies.items()}}


def importance(study):
    """Optuna's parameter importances (fANOVA) of the study, or None where it cannot say (it needs
    two tuned settings and complete trials that differ)."""
    complete = [t for t in study.study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if len(study.space) < 2 or len(complete) < 2:
        return None
    try:
        return {k: float(v) for k, v in optuna.importance.get_param_importances(study.study, evaluator=(
            optuna.importance.FanovaImportanceEvaluator(seed=0))).items()}
    except (ValueError, RuntimeError):
        return None
