"""--until-settled: which seeds each variant needs now, from the sequential design's decisions.

Each head is compared with its reference (the baseline of its norm) on one metric (--settle-metric,
top-1 by default) against its margin (--margin, else the metric table's), by the group-sequential
design of comparison/analysis/sequential.py: looks at n_1 < … < n_K seeds (--looks, or a default schedule up
to --max-seeds), α = 5% per head. After each look a head whose question is settled (superior,
inferior or equivalent; or the last look reached) keeps its seeds; the others get the next look's;
a reference gets as many as the most of its heads. Seeds are 0, 1, … in order, so a look at n seeds
reads seeds 0..n−1 of both, wherever and whenever they were trained. A pair where a head is within
noise of chance over the look's seeds (comparison/analysis/sanity.py, the report's own check) stops
there with no comparison ("nothing learned"), whatever the design would read: a verdict on it would
compare nothing, and more seeds of a head that learns nothing would not change that.

The design is fixed before the data are read: RUNS_DIR/sequential_design.json records it (its
fingerprint and boundaries, Design.to_dict) at the first run and every rerun checks it
(Design.from_dict): once a look has been taken a changed design (margin, metric, looks, a larger
--max-seeds) is refused, since boundaries chosen after seeing the data no longer bound the error
rates; before any look it is replaced, and said so, unless a live comparison holds the runs folder.
With --tune (comparison/tune_settle.py) the design holds the tuning too (--trials, --pruner, each study's
search space and overrides), fixed the same way: the looks' runs train the settings it chose.
A --max-seeds below the design's last look only stops this invocation at the last look it allows; a
rerun continues the same design. The record is guarded (comparison/design_record.py): written under
the runs folder's lock, read whole or refused in one line, and required where finished runs are.
"""
import copy
import math
import os

import numpy as np

from common.errors import UserError
from comparison import run_results
from comparison.analysis import sanity
from comparison.analysis.equivalence import ALPHA, format_difference, margin_text
from comparison.analysis.margins import METRIC_TABLE, default_margins, margin_as_difference, margin_units
from comparison.analysis.paired import per_example
from comparison.analysis.sequential import DEFAULT_LOOKS, Design, sequential_decision, walk
from comparison.analysis.statistics import metric_on_rows
from comparison.design_record import DESIGN_FILE, DamagedRecord, design_path, read_design, write_design
from comparison.limits import MIN_SEEDS
from comparison.plan import plan_runs

DEFAULT_MAX_SEEDS = 12  # comparison/analysis/sequential.DEFAULT_LOOKS' last
_GROWTH = 1.5  # the default schedule past 12 seeds: each look ~1.5× the previous
SIMULATED_PATHS = 2000  # the expected seeds' plug-in simulation (cost line): s.e. ≲ 0.2 seed
MAX_SHOWN_CHANGES = 4  # changed tuning settings a refusal names


# ---- the design -------------------------------------------------------------------------------------
def default_looks(max_seeds):
    """3, 5, 8, 12, 18, 27, … below max_seeds, then max_seeds (a look too close before it dropped)."""
    looks = list(DEFAULT_LOOKS)
    while looks[-1] < max_seeds:
        looks.append(int(round(looks[-1] * _GROWTH)))
    below = [n for n in looks if n < max_seeds]
    if below and max_seeds < 1.25 * below[-1]:
        below.pop()
    return tuple(below + [max_seeds])


def settle_margin(args):
    """(metric, δ in its written units) the design uses."""
    metric = args.settle_metric
    margin = args.margins.get(metric, default_margins().get(metric))
    if margin is None:
        raise UserError(f"--settle-metric {metric} has no default margin; give one with --margin {metric}=DELTA")
    return metric, float(margin)


def make_design(metric, margin, looks):
    """The Design of `looks` on `metric` at margin δ (its written units), at the comparison's α."""
    try:
        return Design(margin=margin_as_difference(metric, margin), looks=tuple(looks), alpha=ALPHA,
                      higher_is_better=METRIC_TABLE[metric].higher_is_better)
    except ValueError as err:
        raise UserError(f"--looks {' '.join(map(str, looks))}: {err}") from None


def _changes(old, new):
    """'margin 0.5 -> 1, looks 3 5 8 -> 3 5 8 12' between two (metric, margin, Design, tuning)."""
    (m0, d0, a, t0), (m1, d1, b, t1) = old, new
    pairs = [("metric", m0, m1), ("margin", f"{d0:g}", f"{d1:g}"),
             ("looks", " ".join(map(str, a.looks)), " ".join(map(str, b.looks)))]
    pairs += [(k, getattr(a, k), getattr(b, k)) for k in ("alpha", "method", "mc_paths", "mc_seed")]
    return ", ".join([f"{k} {x} -> {y}" for k, x, y in pairs if x != y] + _tuning_changes(t0, t1))


def _tuning_changes(old, new):
    """['trials 3 -> 4', 'overrides optim.epochs 2 -> 3 (every variant)'] between two tuning records (None: not
    tuned; comparison/tune_settle.py's tuning_design), at most MAX_SHOWN_CHANGES settings."""
    if old == new:
        return []
    if old is None or new is None:
        return [f"tuning {_tuned_text(old)} -> {_tuned_text(new)}"]
    out = [f"{k} {old.get(k)} -> {new.get(k)}" for k in ("trials", "pruner") if old.get(k) != new.get(k)]
    studies = [old.get("studies") or {}, new.get("studies") or {}]
    if set(studies[0]) != set(studies[1]):
        out.append(f"tuned variants {' '.join(studies[0])} -> {' '.join(studies[1])}")
    changed = {}  # (setting, old, new): the variants whose tuning changed so
    for name in [n for n in studies[1] if n in studies[0]]:
        leaves = [_leaves({k: v for k, v in study[name].items() if k != "pruner"}) for study in studies]
        for key in sorted(set(leaves[0]) | set(leaves[1])):
            if leaves[0].get(key) != leaves[1].get(key):
                changed.setdefault((key, leaves[0].get(key, "(unset)"), leaves[1].get(key, "(unset)")), []).append(name)
    out += [f"{key} {was} -> {asked} ({'every variant' if len(names) == len(studies[1]) else ', '.join(names)})"
            for (key, was, asked), names in changed.items()]
    more = len(out) - MAX_SHOWN_CHANGES
    return out[:MAX_SHOWN_CHANGES] + ([f"and {more} more"] if more > 0 else [])


def _tuned_text(tuning):
    return "none" if tuning is None else f"{tuning.get('trials')} trials per variant"


def _leaves(tree, prefix=""):
    """{'space optim.lr': 'log [0.0001, 0.1]', 'overrides optim.epochs': '2', ...} of a study's settings
    (its overrides key by key)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, list) and all(isinstance(v, str) and "=" in v for v in value):
            value = dict(v.split("=", 1) for v in value)
        if isinstance(value, dict):
            out.update(_leaves(value, f"{prefix}{key} "))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resolve_design(args, runs_dir, looks_taken, holder=None, tuning=None, record=None):
    """(metric, margin, Design, cap, to record): the design of this comparison, the seeds this invocation
    may reach (the last look ≤ --max-seeds) and the (metric, margin, Design, tuning) write_design is to
    record, None when the record stands or `record` is false (default: --dry-run / --report-only; a
    writer holds the runs folder's lock: comparison/design_record.py). `looks_taken(first_look)`:
    whether any pair has that many paired seeds finished (a look was taken). `holder`: for the others,
    the common.runlock.RunLockHeld of a live comparison holding the folder, whose design they may not
    replace. `tuning`: --tune's part of the design (comparison/tune_settle.py), fixed with the rest. A
    damaged record, or finished runs without one, is one line (the module docstring)."""
    record = not (args.dry_run or args.report_only) if record is None else record
    metric, margin = settle_margin(args)
    path = design_path(runs_dir)
    try:
        recorded = read_design(runs_dir)
    except DamagedRecord as err:
        raise UserError(f"{path} is damaged: {err}; {_damaged_fix(looks_taken)}") from None
    if recorded is None and looks_taken(MIN_SEEDS):
        raise UserError(f"{runs_dir} holds finished runs (both heads of a pair, {MIN_SEEDS} seeds or more) but no "
                        f"{DESIGN_FILE}: the design they were compared under is unknown, and one chosen now, after "
                        f"their results, would not bound its error rates; restore {path} from a copy, or use "
                        f"another --runs-dir")
    if args.looks:
        looks = tuple(args.looks)
    elif recorded and (args.max_seeds is None or args.max_seeds <= recorded[2].looks[-1]):
        looks = recorded[2].looks  # a smaller --max-seeds: a cap on this invocation, same design
    else:
        looks = default_looks(args.max_seeds or DEFAULT_MAX_SEEDS)
    asked = (metric, margin, make_design(metric, margin, looks), tuning)
    cap = _cap(args.max_seeds, asked[2])
    if recorded and (recorded[0], recorded[2].fingerprint(), recorded[3]) != (metric, asked[2].fingerprint(), tuning):
        if looks_taken(recorded[2].looks[0]):
            raise UserError(f"the sequential design recorded in {path} has taken its first look, and this command "
                            f"asks for another ({_changes(recorded, asked)}): {_why_fixed(recorded, asked)}; "
                            f"rerun with the recorded design ({_flags(recorded)}) or use another --runs-dir")
        if holder is not None:
            raise UserError(f"the design recorded in {path} took no look yet, but this command asks for another "
                            f"({_changes(recorded, asked)}) while {holder}")
        print(f"the design recorded in {path} took no look yet: {'' if record else 'would be '}replaced "
              f"({_changes(recorded, asked)})")
        recorded = None
    return metric, margin, asked[2], cap, asked if recorded is None and record else None


def _damaged_fix(looks_taken):
    """How to go on from a damaged record: anew only where no pair has finished runs."""
    if looks_taken(MIN_SEEDS):
        return ("finished runs are there, so the design cannot be chosen anew after their results: restore the "
                "file from a copy, or use another --runs-dir")
    return "no pair has finished runs yet: delete the file and rerun to record the design anew"


def _cap(max_seeds, design):
    """The last look ≤ --max-seeds (the design's last without it)."""
    allowed = [n for n in design.looks if max_seeds is None or n <= max_seeds]
    if not allowed:
        raise UserError(f"--max-seeds {max_seeds} is below the design's first look ({design.looks[0]} seeds): "
                        f"nothing would be decided")
    return allowed[-1]


def _why_fixed(old, new):
    """Why a design may not change after a look, for the change asked (two (metric, margin, Design, tuning))."""
    old, new, retuned = old[2], new[2], old[3] != new[3]
    if retuned and old.fingerprint() == new.fingerprint():
        return ("the looks taken were trained with the settings that tuning chose, and a tuning changed after "
                "seeing their results would choose with the data in view: the error rates would no longer hold")
    if old.looks[-1] != new.looks[-1]:
        return (f"the O'Brien–Fleming boundaries spend α by the fraction n/{old.looks[-1]} of the seeds, so a "
                f"design up to {new.looks[-1]} seeds would have used other boundaries at the looks already taken, "
                f"and continuing past the planned last look gives a head more chances to cross: its error "
                f"rates would no longer hold")
    return "a design chosen after seeing the data no longer bounds its error rates"


def _flags(record):
    metric, margin, design, tuning = record
    flags = f"--settle-metric {metric} --margin {metric}={margin:g} --looks {' '.join(map(str, design.looks))}"
    if tuning is not None:
        flags += f" --trials {tuning.get('trials')} --pruner {tuning.get('pruner')}, the same heads and overrides"
    return flags


# ---- the per-seed differences ----------------------------------------------------------------------
def with_seeds(args, seeds):
    """A copy of the arguments with `seeds` (plan_runs reads args.seeds)."""
    out = copy.copy(args)
    out.seeds = list(seeds)
    return out


def full_plan(args, seeds, runs_dir=None, extra=None):
    """plan_runs for seeds 0..seeds−1 of every variant: the runs any look could ask for (`extra`: plan_runs')."""
    return plan_runs(with_seeds(args, range(seeds)), runs_dir, extra)


class SeedValues:
    """The settling metric of each finished run (read from its per-example records, as the report's
    across-trainings differences are), cached per run folder for the looks of one invocation."""

    def __init__(self, metric, commands):
        self.metric, self.commands, self._cache, self._correct = metric, commands, {}, {}

    def finished(self, run_dir):
        return all(self.commands.status(run_dir))

    def value(self, run_dir):
        """(metric value, labels) of a finished run."""
        if run_dir not in self._cache:
            records = run_results.read_records(run_dir, self.commands.eval_file)
            values, n = per_example(records), len(records["label"])
            value = metric_on_rows(values, self.metric, np.arange(n)[None], np.zeros(n, dtype=np.int64))[0]
            self._cache[run_dir] = float(value), np.asarray(records["label"])
            self._correct[run_dir] = int(np.count_nonzero(values["correct"]))
        return self._cache[run_dir]

    def at_chance(self, run_dirs):
        """(top-1, chance) of one head pooled over these finished runs when it is within noise of chance
        (comparison/analysis/sanity.py, as the report checks it), else None."""
        labels = np.concatenate([self.value(d)[1] for d in run_dirs])
        top1, chance = sum(self._correct[d] for d in run_dirs) / labels.size, sanity.chance_level(labels)
        return (top1, chance) if sanity.nothing_learned(top1, chance, labels.size) else None

    def differences(self, head_dirs, ref_dirs):
        """Per-seed differences head − reference over the seeds 0, 1, … both have finished (in order,
        up to the first missing one)."""
        out = []
        for head_dir, ref_dir in zip(head_dirs, ref_dirs):
            if not (self.finished(head_dir) and self.finished(ref_dir)):
                break
            (a, labels_a), (b, labels_b) = self.value(head_dir), self.value(ref_dir)
            if labels_a.shape != labels_b.shape or not np.array_equal(labels_a, labels_b):
                raise UserError(f"{head_dir} and {ref_dir} were not evaluated on the same examples in the same "
                                f"order; evaluate both on the same split")
            out.append(a - b)
        return np.array(out, dtype=np.float64)


def run_dirs(plan):
    """{variant: [run_dir of seed 0, 1, …]} of a full plan."""
    out = {}
    for name, seed, run_dir, _ in plan:
        out.setdefault(name, {})[seed] = run_dir
    return {name: [seeds[s] for s in sorted(seeds)] for name, seeds in out.items()}


def paired_differences(pairs, dirs, values, cap):
    """{head: its differences with its reference over the first paired seeds (at most `cap`)}."""
    return {head: values.differences(dirs[head][:cap], dirs[ref][:cap]) for head, ref in pairs}


# ---- the planner ------------------------------------------------------------------------------------
def decide(pairs, differences, design):
    """{head: comparison.analysis.sequential.Decision} after the differences so far."""
    return {head: sequential_decision(differences[head], design) for head, _ in pairs}


def targets(pairs, decisions, paired, design, cap):
    """{variant: seeds it needs now}. A head whose decision stopped keeps the seeds the decision used
    (it gets no new seeds); one not stopped gets the next look after its `paired` seeds, unless that
    look lies past `cap`, where it stays at its last look; a reference needs the most of its heads."""
    out = {}
    for head, _ in pairs:
        decision = decisions[head]
        ahead = design.next_look(paired[head])
        if decision.stop or ahead is None or ahead > cap:
            out[head] = decision.interval.n if decision.interval.look else min(paired[head], cap)
        else:
            out[head] = ahead
    for head, ref in pairs:
        out[ref] = max(out.get(ref, 0), out[head])
    return out


def look_plan(plan, wanted):
    """The entries of a full plan the targets ask for (seed < the variant's target)."""
    return [entry for entry in plan if entry[1] < wanted.get(entry[0], 0)]


# ---- the words --------------------------------------------------------------------------------------
def interval_words(metric, interval):
    """'95% repeated CI [−2.1, +0.4] pt' (∞ ends when the look cannot stop yet)."""
    def end(x):
        return ("+∞" if x > 0 else "−∞") if math.isinf(x) else format_difference(metric, x)

    unit = margin_units(metric)
    return (f"{100 * interval.level:g}% repeated CI [{end(interval.low)}, {end(interval.high)}]"
            + (f" {unit}" if unit else ""))


_WHY = {"superior": "excludes 0 on the better side", "inferior": "excludes 0 on the worse side",
        "equivalent": "lies inside the margin", "non-inferior": "has its worse end inside the margin",
        "undecided": "reaches past the margin"}  # undecided: and the 1 − α interval includes 0 (_reading)


def state(decision, design, cap):
    """'settled', 'last look', 'capped' (not settled at the last look --max-seeds allows), 'continues',
    'nothing learned' (a head within noise of chance: stopped, no comparison) or 'no look' (fewer seeds
    than the first look)."""
    if not decision.interval.look:
        return "no look"
    if decision.idle:
        return "nothing learned"
    if decision.stop:
        return "settled" if decision.interval.look < len(design.looks) else "last look"
    ahead = design.next_look(decision.interval.n)
    return "capped" if ahead is None or ahead > cap else "continues"


def _no_evidence(interval, design):
    """Why a look's interval is not finite ('' when it is): the spending leaves that look no α, the
    per-seed differences are all equal (s.d. 0: comparison/analysis/sequential.py), or one is not a number."""
    if math.isnan(interval.low):
        return "a per-seed difference is not a finite number, so this look shows nothing"
    if not math.isinf(interval.low):
        return ""
    kind = "difference" if interval.level == 1 - design.alpha else "equivalence"
    if math.isinf(design.boundaries()[kind][interval.look - 1]):
        return "this look spends no α, so it cannot stop"
    return "the per-seed differences are all equal (s.d. 0), which measures no noise: no evidence"


def _reading(decision, design, metric):
    """The verdict and the interval(s) that decided it: for undecided, the 1 − 2α one reaches past the
    margin and the 1 − α one includes 0 (else the head would be superior or inferior)."""
    why = _no_evidence(decision.interval, design)
    if why:
        return f"{decision.verdict}: the {interval_words(metric, decision.interval)} ({why})"
    text = (f"{decision.verdict}: the {interval_words(metric, decision.interval)} {_WHY[decision.verdict]} "
            f"({margin_text(metric, design.margin)})")
    if decision.verdict == "undecided" and decision.difference_interval is not None:
        text += f" and the {interval_words(metric, decision.difference_interval)} includes 0"
    return text


def _chance_words(idle):
    """'sparsemax within noise of chance: top-1 10.2% vs 10.0% for the best constant guess'."""
    return (f"{' and '.join(name for name, _, _ in idle)} within noise of chance: top-1 "
            + ", ".join(f"{name} {100 * top1:.1f}%" for name, top1, _ in idle)
            + f" vs {100 * idle[0][2]:.1f}% for the best constant guess")


def describe(head, ref, decision, design, metric, cap):
    """One sentence: where a head's question stands, at which look and why."""
    k, n, looks = decision.interval.look, decision.interval.n, len(design.looks)
    where = state(decision, design, cap)
    if where == "no look":
        return f"{head} vs {ref}: no look yet ({n} of the first look's {design.looks[0]} seeds finished)"
    if where == "nothing learned":
        return (f"{head} vs {ref}: no comparison at look {k} of {looks} ({n} seeds): nothing learned "
                f"({_chance_words(decision.idle)}); no more seeds")
    reading = _reading(decision, design, metric)
    if where == "settled":
        return f"{head} vs {ref}: settled at look {k} of {looks} ({n} seeds), {reading}"
    if where == "last look":
        return f"{head} vs {ref}: the last look ({k} of {looks}, {n} seeds) reached, {reading}"
    why = _no_evidence(decision.interval, design)
    shown = interval_words(metric, decision.interval) + (f": {why}" if why else "")
    if where == "capped":
        return (f"{head} vs {ref}: not settled at look {k} of {looks} ({n} seeds, the last look --max-seeds "
                f"{cap} allows): {shown}; rerun with a larger --max-seeds (up to {design.looks[-1]}) to continue")
    return (f"{head} vs {ref}: not settled at look {k} of {looks} ({n} seeds; {shown}), continues to "
            f"{design.next_look(n)} seeds")


def outcome(head, ref, decision, design, metric, cap):
    """The summary.json entry of one head."""
    return {"variant": head, "baseline": ref, "state": state(decision, design, cap), "stopped": decision.stop,
            "look": decision.interval.look, "looks": len(design.looks), "seeds": decision.interval.n,
            "verdict": decision.verdict, "interval": [decision.interval.low, decision.interval.high],
            "interval_level": decision.interval.level,
            "idle": [{"variant": name, "top1": top1, "chance": chance} for name, top1, chance in decision.idle],
            "reason": describe(head, ref, decision, design, metric, cap)}


# ---- what is left to run (the cost line's seeds) -----------------------------------------------------
def simulated_seeds(pairs, differences, decisions, design, cap, paths=SIMULATED_PATHS, seed=0):
    """{variant: (paths,) seeds each would end with}, {head: whether simulated}: a head stopped keeps
    its seeds; one with ≥ 2 differences continues with draws from N(their mean, their s.d.) after its
    own (plug-in: the differences so far taken as the truth) through the design up to `cap`; one with
    fewer goes to `cap` (not known). A reference: per path, the most of its heads."""
    rng = np.random.default_rng(seed)
    out, simulated = {}, {}
    for head, _ in pairs:
        d, decision = differences[head][:cap], decisions[head]
        simulated[head] = decision.stop or d.size >= 2
        if decision.stop:
            out[head] = np.full(paths, decision.interval.n)
        elif d.size >= 2:
            rest = rng.normal(d.mean(), d.std(ddof=1), size=(paths, cap - d.size))
            out[head] = walk(np.concatenate([np.tile(d, (paths, 1)), rest], axis=1), design)["n_used"]
        else:
            out[head] = np.full(paths, cap)
    for head, ref in pairs:
        out[ref] = np.maximum(out.get(ref, 0), out[head])
    return out, simulated


# ---- one comparison's looks -------------------------------------------------------------------------
class Looks:
    """The looks of one --until-settled comparison: its design (checked against the recorded one), the
    runs any look up to the cap could ask for (`full`), and after each look what the decisions ask.
    `holder`, `tuning`, `record`: resolve_design's (a live comparison holding the runs folder, for --dry-run /
    --report-only; --tune's part of the design; whether to record it). `deferred`: the design is recorded by
    `record_design`, once the caller's own checks passed (--tune's studies). With --tune the runs' settings are
    known after the tuning only, which comes after the design is checked: `tuned` gives them."""

    def __init__(self, args, runs_dir, commands, pairs, holder=None, tuning=None, record=None, deferred=False):
        self.args, self.runs_dir, self.commands, self.pairs = args, runs_dir, commands, pairs
        self.values = SeedValues(settle_margin(args)[0], commands)
        self.metric, self.margin, self.design, self.cap, self._unrecorded = resolve_design(
            args, runs_dir, self._looks_taken, holder, tuning, record)
        if not deferred:
            self.record_design()
        self.tuned(None)

    def record_design(self):
        """Write the design resolve_design asked to record, if any (under the runs folder's lock)."""
        if self._unrecorded is not None:
            write_design(self.runs_dir, *self._unrecorded)
            self._unrecorded = None

    def tuned(self, settings):
        """The runs planned with `settings` {variant: overrides it adds} (plan_runs' `extra`: the tuned ones)."""
        self.full = full_plan(self.args, self.cap, self.runs_dir, settings)[0]
        self.dirs = run_dirs(self.full)

    def _looks_taken(self, first):
        dirs = run_dirs(full_plan(self.args, first, self.runs_dir)[0])
        return any(all(self.values.finished(d) for d in dirs[head] + dirs[ref]) for head, ref in self.pairs)

    def now(self):
        """(the plan the decisions ask for now, the run folders of it still missing)."""
        self.differences = paired_differences(self.pairs, self.dirs, self.values, self.cap)
        decisions = decide(self.pairs, self.differences, self.design)
        self.decisions = {head: self._sanity(head, ref, decisions[head]) for head, ref in self.pairs}
        paired = {head: len(d) for head, d in self.differences.items()}
        self.wanted = targets(self.pairs, self.decisions, paired, self.design, self.cap)
        plan = look_plan(self.full, self.wanted)
        return plan, {run_dir for _, _, run_dir, _ in plan if not self.values.finished(run_dir)}

    def _sanity(self, head, ref, decision):
        """The decision, or, when a head of the pair is within noise of chance over the look's seeds, a stop
        with no comparison: the design's verdict would compare nothing (and more seeds would not help)."""
        if not decision.interval.look:
            return decision
        n = decision.interval.n
        idle = tuple((name, *level) for name in (head, ref)
                     if (level := self.values.at_chance(self.dirs[name][:n])) is not None)
        return decision._replace(stop=True, verdict="undecided", idle=idle) if idle else decision

    def finished_seeds(self):
        """{variant: set of its seeds (< cap) finished}."""
        return {name: {s for s, d in enumerate(dirs) if self.values.finished(d)} for name, dirs in self.dirs.items()}

    def lines(self):
        """One sentence per head: where its question stands."""
        return [describe(head, ref, self.decisions[head], self.design, self.metric, self.cap)
                for head, ref in self.pairs]

    def say(self):
        """The looks' state on the terminal."""
        print(f"until settled ({METRIC_TABLE[self.metric].label}, looks {' '.join(map(str, self.design.looks))}"
              + (f", this run up to {self.cap} seeds" if self.cap < self.design.looks[-1] else "") + "):")
        for line in self.lines():
            print(f"- {line}", flush=True)

    def header(self, plan, missing):
        """'look at 5 seeds: 6 run(s) to train and evaluate (sparsemax seeds 3-4, ...)'."""
        seeds = {}
        for name, seed, run_dir, _ in plan:
            if run_dir in missing:
                seeds.setdefault(name, []).append(seed)
        what = ", ".join(f"{name} seed{'s' if len(s) > 1 else ''} {_span(s)}" for name, s in seeds.items())
        return f"look at {max(self.wanted.values())} seeds: {len(missing)} run(s) to train and evaluate ({what})"

    def why_done(self):
        """Why no head needs more seeds, in words."""
        states = {state(self.decisions[h], self.design, self.cap) for h, _ in self.pairs}
        if states <= {"settled", "last look"}:
            return "every head is settled or at the design's last look"
        if states <= {"settled", "last look", "nothing learned"}:
            return "every head is settled, at the design's last look or not compared (a head learned nothing)"
        return f"the heads not settled are at the last look --max-seeds {self.cap} allows"

    def document(self):
        """summary.json's "sequential": the design, the seeds this run allowed, and each head's outcome."""
        return {"metric": self.metric, "margin": self.margin, "units": margin_units(self.metric) or "own",
                "design_file": os.path.join(self.runs_dir, DESIGN_FILE), "max_seeds_now": self.cap,
                "design": self.design.to_dict(),
                "comparisons": [outcome(head, ref, self.decisions[head], self.design, self.metric, self.cap)
                                for head, ref in self.pairs]}


def _span(seeds):
    seeds = sorted(seeds)
    return str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}" \
        if seeds == list(range(seeds[0], seeds[-1] + 1)) else " ".join(map(str, seeds))
