"""compare_heads --tune: one Optuna study per compared variant, run by `study.optimize()`, the same
number of complete trials for each, on data the verdict never sees.

Each trial is a training run of the variant with settings drawn from its search space: optim.lr,
optim.weight_decay and the head's own hyperparameters, the ranges declared beside each key
(`search=`: configs/schema.py, models/registry.py; common/search_space.py). A key the comparison
sets on its command line (optim.lr=...) or a variant fixes (--alphas) is not tuned.
Trials train on train minus the tune split (data.tune_fraction, held out deterministically after
the calib split: data/datasets.py) and evaluate every train.eval_every epochs on the tune split
(train.eval_split=tune); the val split (CIFAR's official test set) is never read. A trial's score
is its tune top-1 after the fixed budget of optim.epochs; the pruner (median or Hyperband, on
that per-epoch curve) stops the trials that fall behind.

A trial trains one evaluation interval at a time through the caller's trainer (comparison/tune.py:
train.py with train.pause_after=E, so run locks, signal forwarding and exact resume are every run's)
in RUNS_DIR/tune/trials/<variant>/trial-<number>; a retried trial keeps its original's directory
(the user attribute tune.run_dir, which Optuna's retry copies), resumed from its checkpoint, or
restarted from scratch when it has none; the trainer refuses a directory of other settings.

Workers: every process running `VariantStudy.optimize` on one storage works on the same study
(comparison/tuning_storage.py: heartbeat, retry of lost trials). The budget, --trials N, is N
COMPLETE trials; pruned and failed ones are extra. Optuna's MaxTrialsCallback, counting complete,
running and waiting trials, stops a worker's optimize() once the budget is complete or taken; the
worker then waits while others run the last trials, and starts again if one of them is pruned.
What Optuna lacks, added here (one line each):
- MaxTrialsCallback stops after a trial, so racing workers overshoot: a trial past a taken budget yields (tune.surplus).
- One TPE seed in every worker draws the same settings in each: the sampler is seeded per trial number instead.
"""
import csv
import json
import math
import os
import time

import optuna
from optuna.study import MaxTrialsCallback

from common.children import StoppedBySignal
from common.errors import EXIT_NONFINITE, UserError
from common.rundir import EPOCHS as EPOCHS_FILE
from common.search_space import parse_search
from common.seeding import mix_seed
from comparison import tuning_storage
from configs.schema import SEARCH
from models.registry import head_spec

TRIAL_SEED = 1000  # every trial's train.seed: the settings differ between trials, not the seed
WAIT_S = 2.0  # while other processes run the last trials
PRUNERS = ("median", "hyperband", "none")
RUN_DIR, EPOCHS, SURPLUS, DIVERGED = "tune.run_dir", "tune.epochs", "tune.surplus", "tune.diverged"
MAX_SHOWN = 4  # differences a changed-settings refusal names


def tune_overrides(tune_fraction):
    """What every trial and both verdict arms add: the tune hold-out, so they all train on the same data."""
    return [f"data.tune_fraction={tune_fraction}"]


def search_space(head, overrides, num_classes):
    """{config key: SearchRange} of a variant: optim.lr, optim.weight_decay and the head's own
    declared ranges, without the keys `overrides` set (the comparison's or the variant's)."""
    pinned = {o.split("=", 1)[0] for o in overrides}
    declared = dict(SEARCH)
    settings = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in overrides}
    for hp in head_spec(head).hparams:
        if hp.search is None or (hp.name == "alpha" and settings.get("head.learn_alpha") == "true"):
            continue
        declared[f"head.{hp.name}"] = hp.search
    space = {}
    for key, text in declared.items():
        if key in pinned:
            continue
        rng = parse_search(text)
        if key == "head.k":  # sparse_softmax keeps at most every class
            rng = rng.capped(num_classes)
        if rng.low < rng.high:
            space[key] = rng
    return space


def yaml_value(value):
    """A sampled value as an override's YAML text that reads back as the same number (PyYAML reads
    1e-05 as a string: its floats need a dot and a signed exponent)."""
    if isinstance(value, bool) or not isinstance(value, float):
        return str(value)
    text = repr(value)
    if "e" in text:
        mantissa, exponent = text.split("e")
        exponent = exponent if exponent[0] in "+-" else "+" + exponent
        text = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{exponent}"
    return text


def as_overrides(params):
    return [f"{key}={yaml_value(value)}" for key, value in sorted(params.items())]


def shown_settings(params):
    """A trial's settings as a person reads them: floats to 4 significant digits (the overrides a trial
    trains with keep every digit, as_overrides)."""
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(params.items()))


def make_pruner(name, epochs):
    if name == "median":  # no pruning in the first half of the budget: under a cosine schedule a high lr
        # scores low early and ends best, and pruned at epoch 1 it was never seen to
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=epochs // 2 + 1)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(epochs, 1))
    return optuna.pruners.NopPruner()


def settings_difference(stored, settings):
    """'key: old -> new' for each setting that differs (overrides and search ranges key by key), at
    most MAX_SHOWN of them and how many more."""
    diffs = []
    for part in sorted(set(stored) | set(settings)):
        old, new = stored.get(part), settings.get(part)
        if part == "overrides":
            old, new = (dict(o.split("=", 1) for o in v or []) for v in (old, new))
        if isinstance(old, dict) and isinstance(new, dict):
            label = "search " if part == "space" else ""
            diffs += [f"{label}{k}: {old.get(k, '(unset)')} -> {new.get(k, '(unset)')}"
                      for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
        elif old != new:
            diffs.append(f"{part}: {old} -> {new}")
    more = f"; and {len(diffs) - MAX_SHOWN} more" if len(diffs) > MAX_SHOWN else ""
    return "; ".join(d if len(d) <= 120 else d[:117] + "..." for d in diffs[:MAX_SHOWN]) + more


def study_settings(space, overrides, epochs, eval_every, pruner, weights):
    """What a study is tuned with, as its storage records it (a rerun with other settings is refused), as
    JSON reads it back; --tune --until-settled records them in its design (comparison/tune_settle.py)."""
    return json.loads(json.dumps({
        "space": {k: r.text() for k, r in space.items()}, "overrides": list(overrides), "epochs": epochs,
        "eval_every": eval_every, "pruner": pruner, "weights": weights}))


class Surplus(Exception):
    """A trial started while the budget was already taken (see the module docstring)."""


# --------------------------------------------------------------------------------------------- studies
class VariantStudy:
    """One variant's study: its search space, its trials' overrides, the objective and the budget loop."""

    def __init__(self, *, storage, name, head, space, overrides, trials, epochs, eval_every, pruner, seed,
                 trials_dir, weights="raw", say=print):
        optuna.logging.set_verbosity(optuna.logging.ERROR)  # a failed trial's traceback: the error says it in one line
        self.optuna, self.storage, self.name, self.head = optuna, storage, name, head
        self.space, self.overrides, self.trials, self.epochs = space, list(overrides), trials, epochs
        self.eval_epochs = [e for e in range(1, epochs + 1) if e % eval_every == 0 or e == epochs]
        self.seed, self.trials_dir, self.weights, self.say = seed, trials_dir, weights, say
        self.settings = study_settings(space, overrides, epochs, eval_every, pruner, weights)
        self.study = optuna.create_study(study_name=name, storage=storage, direction="maximize",
                                         load_if_exists=True, pruner=make_pruner(pruner, epochs))
        self.trainer, self.stopped, self.ran, self._current = None, lambda: False, 0, None
        self._check_settings()

    def _check_settings(self):
        stored = self.study.user_attrs.get("settings")
        if stored is None:
            self.study.set_user_attr("settings", self.settings)
        elif stored != self.settings:
            raise UserError(f"the study '{self.name}' in this storage was tuned with other settings "
                            f"({settings_difference(stored, self.settings)}); use another --runs-dir or --storage, "
                            f"or rerun with the settings it has")

    # ---------------------------------------------------------------------------- the budget
    def counts(self):
        """{state name: number of trials}."""
        out = {}
        for t in self.study.get_trials(deepcopy=False):
            out[t.state.name] = out.get(t.state.name, 0) + 1
        return out

    def complete(self):
        return self.counts().get("COMPLETE", 0)

    def optimize(self, trainer, stopped=lambda: False):
        """Work on the study, with every other process on its storage, until it has --trials complete
        trials; -> the trials run here. `trainer`: start(run_dir, overrides) -> resume?, and
        train(overrides, run_dir, fresh) -> train.py's exit status (comparison/tune.py)."""
        S = self.optuna.trial.TrialState
        self.trainer, self.stopped, self.ran = trainer, stopped, 0
        self._check_trial_dirs()
        taken = MaxTrialsCallback(self.trials, states=(S.COMPLETE, S.RUNNING, S.WAITING))
        while not stopped():
            for number in tuning_storage.reclaim_dead(self.study):
                self.say(f"[tune {self.name}] trial {number}: its process is gone; queued again")
            tuning_storage.fail_stale(self.study)
            counts = self.counts()
            if counts.get("COMPLETE", 0) >= self.trials:
                break
            if not counts.get("WAITING") and counts.get("COMPLETE", 0) + counts.get("RUNNING", 0) >= self.trials:
                time.sleep(WAIT_S)  # the last trials run elsewhere; one pruned or lost needs a replacement
                continue
            try:
                self.study.optimize(self.objective, callbacks=[taken, self._said], catch=(Surplus,))
            except StoppedBySignal:
                self._retry_stopped()
                raise
        return self.ran

    def _check_trial_dirs(self):
        """Refuse trial folders that no trial of this study made (a deleted study's, another storage's):
        a trial of that number would take their scores, trained with other settings. Listed before the
        trials are read: a folder is made after its trial records it (RUN_DIR)."""
        names = sorted(n for n in os.listdir(self.trials_dir) if n.startswith("trial-")) \
            if os.path.isdir(self.trials_dir) else []
        known = {os.path.basename(t.user_attrs.get(RUN_DIR) or "") for t in self.study.get_trials(deepcopy=False)}
        foreign = [n for n in names if n not in known]
        if foreign:
            shown = ", ".join(foreign[:3]) + (" ..." if len(foreign) > 3 else "")
            raise UserError(f"{self.trials_dir} holds {len(foreign)} trial folder(s) that no trial of the study "
                            f"'{self.name}' in this storage made ({shown}): another study's; delete them, or give "
                            f"the --storage they belong to")

    def _retry_stopped(self):
        """optimize() failed the trial a signal stopped; queue it again (it resumes from its checkpoint)."""
        mine = [t for t in self.study.get_trials(deepcopy=False) if t.number == self._current]
        if mine and tuning_storage.retry(self.study, mine[0], tuning_storage.RESUME):
            self.say(f"[tune {self.name}] trial {self._current}: stopped; queued again, it resumes in "
                     f"{mine[0].user_attrs.get(RUN_DIR)}")

    def _surplus(self, trial):
        """Whether complete, waiting and lower-numbered running trials already take the whole budget
        (trial numbers are given in the order trials start, so of two racing trials the later one yields)."""
        S = self.optuna.trial.TrialState
        ahead = sum(t.state in (S.COMPLETE, S.WAITING) or (t.state == S.RUNNING and t.number < trial.number)
                    for t in self.study.get_trials(deepcopy=False))
        return ahead >= self.trials

    def _said(self, study, frozen):
        """optimize()'s callback: one line per trial run here."""
        if frozen.user_attrs.get(SURPLUS):
            return
        shown = shown_settings(frozen.params) or "no tunable setting"
        self.say(f"[tune {self.name}] trial {frozen.number} ({self.complete()}/{self.trials} complete): {shown}: "
                 f"{outcome(frozen, self.epochs)}")

    # ---------------------------------------------------------------------------- one trial
    def sampler(self, number):
        """TPE seeded by the study and the trial's number (see the module docstring)."""
        return self.optuna.samplers.TPESampler(seed=mix_seed(self.seed, self.name, number) % 2 ** 32,
                                               n_startup_trials=min(10, max(3, self.trials // 4)))

    def trial_overrides(self, trial):
        """(run dir, overrides without train.pause_after) of a trial; its settings drawn now."""
        self.study.sampler = self.sampler(trial.number)  # before the first suggest: its draws are this trial's
        params = {key: rng.suggest(trial, key) for key, rng in self.space.items()}
        run_dir = trial.user_attrs.get(RUN_DIR) or os.path.join(self.trials_dir, f"trial-{trial.number:04d}")
        trial.set_user_attr(RUN_DIR, run_dir)
        return run_dir, self.overrides + as_overrides(params) + [
            "train.eval_split=tune", f"train.seed={TRIAL_SEED}", f"train.output_dir={run_dir}"]

    def objective(self, trial):
        """optimize()'s objective: train `trial` one evaluation interval at a time, report its tune
        top-1 after each; -> its final score (raises optuna.TrialPruned when the pruner stops it)."""
        self._current = trial.number
        if self._surplus(trial):
            trial.set_user_attr(SURPLUS, True)
            raise Surplus(f"trial {trial.number}: the budget of {self.trials} is taken")
        tuning_storage.claim(trial)
        run_dir, overrides = self.trial_overrides(trial)
        self.ran += 1
        resume = self.trainer.start(run_dir, overrides)  # a directory of other settings is refused here
        value = None
        for epoch in self.eval_epochs:
            value = tune_top1(run_dir, epoch, self.weights) if resume else None
            if value is None:
                value = self._train(trial, run_dir, overrides, epoch, fresh=not resume)
                resume = True
                if value is None:  # diverged
                    return 0.0
            trial.report(value, epoch)
            trial.set_user_attr(EPOCHS, epoch)
            if epoch < self.epochs and trial.should_prune():
                raise self.optuna.TrialPruned()
        return value

    def _train(self, trial, run_dir, overrides, epoch, fresh):
        """Train up to `epoch`; -> its tune top-1, None for a non-finite loss (scored 0)."""
        status = self.trainer.train(overrides + [f"train.pause_after={epoch}"], run_dir, fresh)
        if status >= 128 or self.stopped():
            raise StoppedBySignal(f"stopped during tuning trial {trial.number} of {self.name} (exit {status}); rerun "
                                  f"the same command to continue: the trial resumes from its checkpoint",
                                  status if status >= 128 else 143)
        if status == EXIT_NONFINITE:
            trial.set_user_attr(DIVERGED, True)
            trial.set_user_attr(EPOCHS, epoch)
            return None
        if status != 0:
            raise UserError(f"tuning trial {trial.number} of {self.name} failed (train.py exit {status}; see "
                            f"{run_dir}); fix the error and rerun the same command")
        value = tune_top1(run_dir, epoch, self.weights)
        if value is None:
            raise UserError(f"tuning trial {trial.number} of {self.name}: {run_dir}/{EPOCHS_FILE} has no tune "
                            f"evaluation after epoch {epoch}")
        return value

    def best(self):
        """The best COMPLETE trial (a FrozenTrial), or None."""
        try:
            return self.study.best_trial
        except ValueError:
            return None


def outcome(frozen, epochs):
    """A finished trial in words."""
    done = frozen.user_attrs.get(EPOCHS)
    if frozen.state.name == "PRUNED":
        value = frozen.intermediate_values.get(done)
        return f"pruned after epoch {done}" + (f" (tune top-1 {100 * value:.2f}%)" if value is not None else "")
    if frozen.user_attrs.get(DIVERGED):
        return f"diverged (non-finite loss) in epoch {done}: counted with top-1 0"
    if frozen.state.name == "COMPLETE":
        return f"tune top-1 {100 * frozen.value:.2f}% after {epochs} epoch(s)"
    return frozen.state.name.lower()


def tune_top1(run_dir, epoch, weights="raw"):
    """The tune top-1 train.py logged after `epoch` (epochs.csv), or None when not there yet."""
    path = os.path.join(run_dir, EPOCHS_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row.get("epoch") or 0) == epoch and row.get(f"{weights}_top1") not in (None, ""):
                value = float(row[f"{weights}_top1"])
                return value if math.isfinite(value) else 0.0
    return None
