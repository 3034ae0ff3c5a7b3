"""compare_heads --tune: one Optuna study per compared variant, the same trial budget for each, on
data the verdict never sees.

Each trial is a training run of the variant with settings drawn from its search space: optim.lr,
optim.weight_decay and the head's own hyperparameters, the ranges declared beside each key
(`search=`: configs/schema.py, models/registry.py; common/search_space.py). A key the comparison
sets on its command line (optim.lr=...) or a variant fixes (--alphas) is not tuned.
Trials train on train minus the tune split (data.tune_fraction, held out deterministically after
the calib split: data/datasets.py) and evaluate every train.eval_every epochs on the tune split
(train.eval_split=tune); the val split (CIFAR's official test set) is never read. A trial's score
is its tune top-1 after the fixed budget of optim.epochs; the pruner (median or Hyperband, on
that per-epoch curve) stops the trials that fall behind.

A trial trains one evaluation interval at a time: train.py with train.pause_after=E and
--resume auto, through compare_heads' own runner (in process, its worker, or the --launcher
command), so run locks, signal forwarding and exact resume are the ones every run has. Its run
directory is RUNS_DIR/tune/trials/<variant>/trial-<number>.

Storage: one study per variant, named "<config stem>/<variant>", in any Optuna storage
(`open_storage`: an RDB URL such as sqlite:///PATH or postgresql://..., or a JournalStorage file,
journal:PATH, for shared filesystems without a database). Several processes may work on one study
at once, each running this same loop: trial numbers come from the storage, so nothing is run twice.

The budget: --trials N counts COMPLETE and PRUNED trials only. A process starts a trial while
fewer than N are finished or running live, waits while the rest are running elsewhere, and gives a
trial back (FAIL, "tune.surplus") when a race with another process made it one too many. A trial
whose process is gone (SIGKILL, a lost node) is failed and re-queued with the same settings and
run directory, so its training resumes from the last checkpoint: on this host at once (its
recorded pid is dead: common/runlock.py's check), elsewhere once its heartbeat (a user attribute
renewed every HEARTBEAT_S) is older than STALE_S. A trial stopped by a signal is failed and
re-queued the same way before the process exits.
"""
import json
import math
import os
import threading
import time

from common.errors import EXIT_NONFINITE, UserError
from common.rundir import EPOCHS as EPOCHS_FILE
from common.seeding import mix_seed
from common.search_space import parse_search

from common.children import StoppedBySignal
from common.runlock import process_record, stale_reason

TRIAL_SEED = 1000  # every trial's train.seed: the settings differ between trials, not the seed
HEARTBEAT_S = 60.0
STALE_S = 600.0  # a running trial of another host with no heartbeat this long is taken as lost
UNOWNED_GRACE_S = 60.0  # a trial is asked for, then its owner recorded: that gap is not a loss
WAIT_S = 2.0  # while other processes run the last trials
PRUNERS = ("median", "hyperband", "none")
OWNER, HEARTBEAT, RUN_DIR, EPOCHS, SURPLUS, DIVERGED, RETRY_OF = (
    "tune.owner", "tune.heartbeat", "tune.run_dir", "tune.epochs", "tune.surplus", "tune.diverged", "tune.retry_of")


def tune_overrides(tune_fraction):
    """What every trial and both verdict arms add: the tune hold-out, so they all train on the same data."""
    return [f"data.tune_fraction={tune_fraction}"]


def search_space(head, overrides, num_classes):
    """{config key: SearchRange} of a variant: optim.lr, optim.weight_decay and the head's own
    declared ranges, without the keys `overrides` set (the comparison's or the variant's)."""
    from configs.schema import SEARCH
    from models.registry import head_spec

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
        text = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{exponent if exponent[0] in '+-' else '+' + exponent}"
    return text


def as_overrides(params):
    return [f"{key}={yaml_value(value)}" for key, value in sorted(params.items())]


# ------------------------------------------------------------------------------------------- storage
def default_storage(tune_dir):
    return "sqlite:///" + os.path.abspath(os.path.join(tune_dir, "studies.db"))


def open_storage(url):
    """An Optuna storage from --storage: journal:PATH (a JournalStorage file, for shared filesystems)
    or an RDB URL (sqlite:///PATH, postgresql://..., mysql://...)."""
    import optuna

    if url.startswith("journal:"):
        from optuna.storages import journal

        path = url[len("journal:"):]
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise UserError(f"--storage {url}: the folder {folder} does not exist; create it or choose another path")
        backend = getattr(journal, "JournalFileBackend", None) or optuna.storages.JournalFileStorage
        return optuna.storages.JournalStorage(backend(path))
    if "://" not in url:
        raise UserError(f"--storage {url}: not a storage URL; use sqlite:///PATH, postgresql://..., or journal:PATH "
                        f"(a journal file on a shared filesystem)")
    kwargs = {"connect_args": {"timeout": 120}} if url.startswith("sqlite") else {}
    if url.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(os.path.abspath(url[len("sqlite:///"):])) or ".", exist_ok=True)
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    except Exception as err:  # SQLAlchemy's errors (missing driver, refused connection, bad URL)
        raise UserError(f"--storage {url}: {type(err).__name__}: {str(err).splitlines()[0]}") from None


def make_pruner(name, epochs):
    import optuna

    if name == "median":  # no pruning in the first half of the budget: under a cosine schedule a high lr
        # scores low early and ends best, and pruned at epoch 1 it was never seen to
        return optuna.pruners.MedianPruner(n_startup_trials=3, n_warmup_steps=epochs // 2 + 1)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max(epochs, 1))
    return optuna.pruners.NopPruner()


# --------------------------------------------------------------------------------------------- studies
class VariantStudy:
    """One variant's study: its search space, its trials' overrides, the budget loop."""

    def __init__(self, *, storage, name, head, space, overrides, trials, epochs, eval_every, pruner, seed,
                 trials_dir, weights="raw", say=print):
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.optuna, self.storage, self.name, self.head = optuna, storage, name, head
        self.space, self.overrides, self.trials, self.epochs = space, list(overrides), trials, epochs
        self.eval_epochs = [e for e in range(1, epochs + 1) if e % eval_every == 0 or e == epochs]
        self.seed, self.trials_dir, self.weights, self.say = seed, trials_dir, weights, say
        self.pruner_name = pruner
        self.settings = {"space": {k: r.text() for k, r in space.items()}, "overrides": self.overrides,
                         "epochs": epochs, "eval_every": eval_every, "pruner": pruner, "weights": weights}
        self.study = optuna.create_study(study_name=name, storage=storage, direction="maximize",
                                         load_if_exists=True, pruner=make_pruner(pruner, epochs))
        self._check_settings()

    def _check_settings(self):
        stored = self.study.user_attrs.get("settings")
        if stored is None:
            self.study.set_user_attr("settings", self.settings)
        elif stored != json.loads(json.dumps(self.settings)):
            diff = next((f"{k}: {stored.get(k)!r} -> {v!r}" for k, v in json.loads(json.dumps(self.settings)).items()
                         if stored.get(k) != v), "")
            raise UserError(f"the study '{self.name}' in this storage was tuned with other settings ({diff}); "
                            f"use another --runs-dir or --storage, or rerun with the settings it has")

    # ---------------------------------------------------------------------------- the budget
    def counts(self):
        """{state name: number of trials} (surplus trials given back are not FAIL of interest)."""
        out = {}
        for t in self.study.get_trials(deepcopy=False):
            out[t.state.name] = out.get(t.state.name, 0) + 1
        return out

    def finished(self):
        S = self.optuna.trial.TrialState
        return sum(t.state in (S.COMPLETE, S.PRUNED) for t in self.study.get_trials(deepcopy=False))

    def _live(self, t, now):
        """Whether a RUNNING trial has a live owner (see the module docstring)."""
        owner = t.user_attrs.get(OWNER)
        if owner is None:
            return now - t.datetime_start.timestamp() < UNOWNED_GRACE_S
        if stale_reason(owner) is not None:
            return False
        beat = t.user_attrs.get(HEARTBEAT, t.datetime_start.timestamp())
        return owner.get("host") == process_record()["host"] or now - beat < STALE_S

    def reclaim_lost(self):
        """Fail every running trial whose process is gone and queue it again (same settings and run
        directory, so it resumes from its checkpoint)."""
        S, now = self.optuna.trial.TrialState, time.time()
        for t in self.study.get_trials(deepcopy=False, states=(S.RUNNING,)):
            if self._live(t, now):
                continue
            try:
                self.study.tell(t.number, state=S.FAIL)
            except Exception:  # another process failed it first: it queues the retry
                continue
            self.requeue(t.params, t.user_attrs.get(RUN_DIR), t.number)
            self.say(f"[tune {self.name}] trial {t.number}: its process is gone; queued again (resumes "
                     f"{t.user_attrs.get(RUN_DIR)})")

    def requeue(self, params, run_dir, number):
        attrs = {RETRY_OF: number}
        if run_dir:
            attrs[RUN_DIR] = run_dir
        self.study.enqueue_trial(params, user_attrs=attrs)

    def next_trial(self, stopped):
        """The next trial this process runs (an optuna Trial), or None once N are finished. Waits while
        the last ones run elsewhere."""
        S = self.optuna.trial.TrialState
        while True:
            if stopped():
                return None
            self.reclaim_lost()
            trials = self.study.get_trials(deepcopy=False)
            now = time.time()
            done = sum(t.state in (S.COMPLETE, S.PRUNED) for t in trials)
            if done >= self.trials:
                return None
            waiting = sum(t.state == S.WAITING for t in trials)
            running = sum(t.state == S.RUNNING and self._live(t, now) for t in trials)
            if not waiting and done + running >= self.trials:
                time.sleep(WAIT_S)
                continue
            self.study.sampler = self.optuna.samplers.TPESampler(
                seed=mix_seed(self.seed, self.name, len(trials)) % 2 ** 32,
                n_startup_trials=min(10, max(3, self.trials // 4)))
            trial = self.study.ask()
            trial.set_user_attr(OWNER, process_record())
            trial.set_user_attr(HEARTBEAT, time.time())
            if self._surplus(trial):
                trial.set_user_attr(SURPLUS, True)
                self.study.tell(trial, state=S.FAIL)
                continue
            return trial

    def _surplus(self, trial):
        """A race with another process made this trial one too many for the budget."""
        S, now = self.optuna.trial.TrialState, time.time()
        ahead = 0
        for t in self.study.get_trials(deepcopy=False):
            if t.state in (S.COMPLETE, S.PRUNED, S.WAITING) or (
                    t.state == S.RUNNING and t.number < trial.number and self._live(t, now)):
                ahead += 1
        return ahead >= self.trials

    # ---------------------------------------------------------------------------- one trial
    def trial_overrides(self, trial):
        """(run dir, params, overrides without train.pause_after) of a trial."""
        params = {key: rng.suggest(trial, key) for key, rng in self.space.items()}
        run_dir = trial.user_attrs.get(RUN_DIR) or os.path.join(self.trials_dir, f"trial-{trial.number:04d}")
        trial.set_user_attr(RUN_DIR, run_dir)
        return run_dir, params, self.overrides + as_overrides(params) + [
            "train.eval_split=tune", f"train.seed={TRIAL_SEED}", f"train.output_dir={run_dir}"]

    def run_trial(self, trial, train, stopped):
        """Train `trial` one evaluation interval at a time (train(overrides, run_dir) -> exit status),
        report its tune top-1 after each, prune or finish it; -> a one-line outcome."""
        S = self.optuna.trial.TrialState
        run_dir, params, overrides = self.trial_overrides(trial)
        beat = _Heartbeat(trial)
        try:
            for epoch in self.eval_epochs:
                value = tune_top1(run_dir, epoch, self.weights)
                if value is None:
                    status = train(overrides + [f"train.pause_after={epoch}"], run_dir)
                    if status >= 128 or stopped():
                        self.study.tell(trial, state=S.FAIL)
                        self.requeue(params, run_dir, trial.number)
                        raise StoppedBySignal(f"stopped during tuning trial {trial.number} of {self.name} (exit "
                                              f"{status}); rerun the same command to continue: the trial resumes "
                                              f"from its checkpoint", status if status >= 128 else 143)
                    if status == EXIT_NONFINITE:
                        trial.set_user_attr(DIVERGED, True)
                        trial.set_user_attr(EPOCHS, epoch)
                        self.study.tell(trial, 0.0)
                        return f"diverged (non-finite loss) in epoch {epoch}: counted with top-1 0"
                    if status != 0:
                        self.study.tell(trial, state=S.FAIL)
                        raise UserError(f"tuning trial {trial.number} of {self.name} failed (train.py exit {status}; "
                                        f"see {run_dir}); fix the error and rerun the same command")
                    value = tune_top1(run_dir, epoch, self.weights)
                    if value is None:
                        self.study.tell(trial, state=S.FAIL)
                        raise UserError(f"tuning trial {trial.number} of {self.name}: {run_dir}/{EPOCHS_FILE} has no "
                                        f"tune evaluation after epoch {epoch}")
                trial.report(value, epoch)
                trial.set_user_attr(EPOCHS, epoch)
                if epoch < self.epochs and trial.should_prune():
                    self.study.tell(trial, state=S.PRUNED)
                    return f"pruned after epoch {epoch} (tune top-1 {100 * value:.2f}%)"
            self.study.tell(trial, value)
            return f"tune top-1 {100 * value:.2f}% after {self.epochs} epoch(s)"
        finally:
            beat.stop()

    def optimize(self, train, stopped=lambda: False):
        """Run trials until the study has --trials finished ones; -> trials run here."""
        ran = 0
        while True:
            trial = self.next_trial(stopped)
            if trial is None:
                return ran
            outcome = self.run_trial(trial, train, stopped)
            ran += 1
            shown = ", ".join(f"{k}={yaml_value(v)}" for k, v in sorted(trial.params.items()))
            self.say(f"[tune {self.name}] trial {trial.number} ({self.finished()}/{self.trials} finished): "
                     f"{shown or 'no tunable setting'}: {outcome}")

    def best(self):
        """The best COMPLETE trial (a FrozenTrial), or None."""
        try:
            return self.study.best_trial
        except ValueError:
            return None


class _Heartbeat:
    """Renews the trial's heartbeat attribute every HEARTBEAT_S while it runs (for other hosts)."""

    def __init__(self, trial):
        self.trial, self.done = trial, threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def _beat(self):
        while not self.done.wait(HEARTBEAT_S):
            try:
                self.trial.set_user_attr(HEARTBEAT, time.time())
            except Exception:  # the trial finished meanwhile, or the storage is briefly unreachable
                pass

    def stop(self):
        self.done.set()
        self.thread.join()


def tune_top1(run_dir, epoch, weights="raw"):
    """The tune top-1 train.py logged after `epoch` (epochs.csv), or None when not there yet."""
    import csv

    path = os.path.join(run_dir, EPOCHS_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if int(row.get("epoch") or 0) == epoch and row.get(f"{weights}_top1") not in (None, ""):
                value = float(row[f"{weights}_top1"])
                return value if math.isfinite(value) else 0.0
    return None
