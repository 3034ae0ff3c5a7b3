"""The output heads, one declaration each: the single source of what a head is.

A `HeadSpec` holds a head's mapping and loss, its hyperparameters (`HParam`: default, type,
range, one-line check), its entmax alpha where it has one, and three flags: whether its
probabilities have exact zeros (`sparse`: its support is a prediction set), whether that
support has the closed-form conformal score of the entmax family (`conformal_support`,
evaluation/conformal.py) and whether it needs a cosine classifier (`cosine_classifier`: the
model's final Linear becomes a CosineLinear scaled by the head's `scale`).

Everything else reads from here: OutputHead and models.create_classifier (models/heads.py,
models/__init__.py), the config schema's head section and the loader's head check
(configs/schema.py, configs/loader.py), evaluation (which heads are sparse) and the benchmarks.
Adding a head means adding its module and one `register(HeadSpec(...))` below: its settings'
checks go in models/head_checks.py and its module is named as `DeferredModule("models.NAME")`
(common/lazy.py), because this table is read without torch (the config loader answers a mistake
before torch loads; tests/test_config_errors_fast.py).

Calling conventions of the declarations:
    mapping(logits, dim, settings) -> probabilities
    loss(logits, target, settings, training, label_smoothing=, ignore_index=, reduction=) -> loss
where `settings` is the head's own hyperparameters by name (a learned alpha is a tensor there)
and `training` is the module's mode (am_softmax's margin applies in training only).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple, Union

from common.errors import UserError
from common.intervals import RangeCheck
from common.lazy import DeferredModule, load_deferred
from common.search_space import parse_search

from .head_checks import (
    ALPHA_OF,
    LOGIT_SCALE,
    NOISES,
    check_alpha,
    check_flag,
    check_gamma_value,
    check_k,
    check_margin,
    check_noise,
    check_order,
    check_samples,
    check_scale,
    check_sigma,
)
from .mapping_table import MAPPINGS

# The heads' implementations, imported on first use: the declarations below are read without torch
# (the config loader answers a mistake before torch loads); models/heads.py loads them at import.
am_softmax = DeferredModule("models.am_softmax")
losses = DeferredModule("models.losses")
mappings = DeferredModule("models.mappings")
normmax = DeferredModule("models.normmax")
perturbmax = DeferredModule("models.perturbmax")
taylor_softmax = DeferredModule("models.taylor_softmax")
topk_softmax = DeferredModule("models.topk_softmax")


@dataclass(frozen=True)
class HParam:
    """One hyperparameter: config key head.<name>. `check` returns the normalised value or raises
    a one-line UserError naming head.<name>; a number's check is its module's
    common.intervals.RangeCheck, and `range` (the --help-config text) is that check's `.range`.
    `only_for_head`: setting it away from its default with another head is an error (a changed
    setting is never silently ignored). `search`: the range compare_heads --tune samples it from
    (common/search_space.py; None: not tuned), inside `range`."""

    name: str
    type: type
    default: Any
    range: str
    check: Callable[[Any], Any]
    doc: str
    only_for_head: bool = False
    search: Optional[str] = None  # compare_heads --tune's range, e.g. "log [0.1, 3]" (common/search_space.py)


@dataclass(frozen=True)
class HeadSpec:
    name: str
    mapping: Callable
    loss: Callable
    hparams: Tuple[HParam, ...]
    alpha: Union[None, float, str]  # the entmax alpha: a number, "alpha" (the hparam), None (not entmax)
    sparse: bool
    conformal_support: bool
    cosine_classifier: bool
    doc: str
    check_settings: Optional[Callable[[dict], None]] = None  # cross-field checks of its settings
    check_classes: Optional[Callable[[dict, int], None]] = None  # checks against the class count
    draws: bool = False  # random: its settings get "draw" = (seed, step[, row ids]) of its noise (OutputHead)


HEADS: Dict[str, HeadSpec] = {}
HPARAMS: Dict[str, HParam] = {}  # every head's hyperparameters by name (one config field each)


def _fail(spec_name: str, what: str):
    raise ValueError(f"head declaration '{spec_name}' is incomplete: {what}")


def _validate(spec: HeadSpec) -> None:
    """A declaration must be complete: a programming error (ValueError), caught by the tests."""
    if not (isinstance(spec.name, str) and spec.name.isidentifier()):
        _fail(spec.name, "name must be an identifier")
    if spec.name in HEADS:
        _fail(spec.name, "declared twice")
    if not (callable(spec.mapping) and callable(spec.loss)):
        _fail(spec.name, "mapping and loss must be callables")
    for flag in ("sparse", "conformal_support", "cosine_classifier"):
        if not isinstance(getattr(spec, flag), bool):
            _fail(spec.name, f"flag '{flag}' must be True or False")
    if not (isinstance(spec.doc, str) and spec.doc.strip()):
        _fail(spec.name, "doc (one line for --help and reports) is missing")
    if spec.conformal_support and (not spec.sparse or spec.alpha is None):
        _fail(spec.name, "conformal_support needs a sparse entmax head (sparse=True and an alpha)")
    names = {hp.name for hp in spec.hparams}
    if spec.alpha == "alpha" and "alpha" not in names:
        _fail(spec.name, "alpha='alpha' needs an 'alpha' hyperparameter")
    if not (spec.alpha is None or spec.alpha == "alpha" or isinstance(spec.alpha, float)):
        _fail(spec.name, "alpha must be a float, 'alpha' or None")
    if spec.cosine_classifier and "scale" not in names:
        _fail(spec.name, "cosine_classifier needs a 'scale' hyperparameter")
    for hp in spec.hparams:
        _validate_hparam(spec.name, hp)


def _validate_hparam(spec_name: str, hp: HParam) -> None:
    if not isinstance(hp, HParam) or not callable(hp.check) or not hp.range or not hp.doc:
        _fail(spec_name, f"hyperparameter {getattr(hp, 'name', hp)!r} needs a type, default, range, check and doc")
    if isinstance(hp.check, RangeCheck) and hp.range != hp.check.range:
        _fail(spec_name, f"head.{hp.name} shows range {hp.range!r} but its check enforces {hp.check.range!r}")
    if hp.check(hp.default) != hp.default:
        _fail(spec_name, f"the default of head.{hp.name} does not pass its own check")
    if hp.search is not None:  # a search range inside what the check accepts
        try:
            rng = parse_search(hp.search)
            for end in (rng.low, rng.high):
                hp.check(int(end) if rng.integer else end)
        except (ValueError, UserError) as err:
            _fail(spec_name, f"head.{hp.name}: search range {hp.search!r}: {err}")
    other = HPARAMS.get(hp.name)
    if other is not None and (other.default, other.type) != (hp.default, hp.type):
        _fail(spec_name, f"head.{hp.name} is declared by another head with another default or type")


def register(spec: HeadSpec) -> HeadSpec:
    _validate(spec)
    HEADS[spec.name] = spec
    for hp in spec.hparams:
        HPARAMS.setdefault(hp.name, hp)
    return spec


def head_spec(name: str) -> HeadSpec:
    spec = HEADS.get(name)
    if spec is None:
        raise UserError(f"unknown output head '{name}'; valid names: {', '.join(HEADS)}")
    return spec


def check_settings(name: str, values: dict, every_head: bool = False) -> dict:
    """The head's own settings, normalised, from `values` (missing keys take their defaults).

    Unknown keys are refused; `only_for_head` settings changed for another head are refused.
    With `every_head` (the config loader) every head's values are checked, so a typo fails at load
    even where the selected head ignores it."""
    spec = head_spec(name)
    unknown = sorted(set(values) - set(HPARAMS))
    if unknown:
        raise UserError(f"unknown head setting '{unknown[0]}'; valid: {', '.join(HPARAMS)}")
    own = {hp.name for hp in spec.hparams}
    for key, value in values.items():
        hp = HPARAMS[key]
        if hp.only_for_head and key not in own and value != hp.default:
            holders = [h.name for h in HEADS.values() if key in {p.name for p in h.hparams}]
            raise UserError(f"head.{key}={value} needs head {' or '.join(holders)} (got '{name}'); "
                            f"set head.name={holders[0]} or head.{key}={hp.default}")
        if every_head:
            hp.check(value)
    settings = {hp.name: hp.check(values.get(hp.name, hp.default)) for hp in spec.hparams}
    if spec.check_settings is not None:
        spec.check_settings(settings)
    return settings


def defaults() -> dict:
    """Every head setting's default by name (the config schema's head section)."""
    return {name: hp.default for name, hp in HPARAMS.items()}


# ------------------------------------------------------------------------------- the heads' checks
def _learned_alpha_inside(settings: dict) -> None:
    alpha = settings["alpha"]
    if settings["learn_alpha"] and not 1.0 < alpha < 2.0:
        raise UserError(f"head.alpha: a learned alpha starts strictly inside (1, 2), got {alpha}; e.g. head.alpha=1.5")


def learned_alpha_logit(alpha: float) -> float:
    """alpha = 1 + sigmoid(alpha_logit) keeps a learned alpha in (1, 2) (Correia et al. 2019)."""
    return math.log((alpha - 1.0) / (2.0 - alpha))


def _check_k_classes(settings: dict, num_classes: int) -> None:
    check_k(settings["k"], num_classes)


# ------------------------------------------------------------------------------- the declarations
ALPHA = HParam("alpha", float, 1.5, check_alpha.range, check_alpha,
               "entmax_bisect only: in [1, 2], strictly inside when learned", search="[1.05, 2]")
LEARN_ALPHA = HParam("learn_alpha", bool, False, "true | false", check_flag("learn_alpha"),
                     "entmax_bisect only: alpha = 1 + sigmoid(alpha_logit) is trained", only_for_head=True)
GAMMA = HParam("gamma", float, 2.0, check_gamma_value.range, check_gamma_value,
               "normmax only: gamma > 1 (Santos et al. 2024 use 2)", search="log [1.1, 8]")
K = HParam("k", int, 5, "[1, num_classes]", check_k,
           "sparse_softmax only: classes kept, 1 <= k <= num_classes (5: the top-5 metric)",
           search="int log [2, 20]")  # capped at the class count when tuned
ORDER = HParam("order", int, 2, check_order.range, check_order,
               "taylor_softmax only: even order >= 2 (2: 1 + x + x^2/2)", search="int [2, 6] step 2")
SCALE = HParam("scale", float, 30.0, check_scale.range, check_scale,
               "am_softmax only: s > 0, logits = s * cos (Wang et al. 2018 use 30)", search="log [4, 64]")
MARGIN = HParam("margin", float, 0.35, check_margin.range, check_margin,
                "am_softmax only: m >= 0 subtracted from the true cosine in training (paper: 0.35)",
                search="[0, 0.5]")

register(HeadSpec(
    "softmax", MAPPINGS["softmax"].apply, lambda z, t, s, training, **kw: losses.softmax_loss(z, t, **kw),
    (), ALPHA_OF["softmax"], sparse=False, conformal_support=False, cosine_classifier=False,
    doc="softmax and cross-entropy (the baseline)"))
register(HeadSpec(
    "sparsemax", MAPPINGS["sparsemax"].apply, lambda z, t, s, training, **kw: losses.sparsemax_loss(z, t, **kw),
    (), ALPHA_OF["sparsemax"], sparse=True, conformal_support=True, cosine_classifier=False,
    doc="sparsemax and its Fenchel-Young loss (Martins & Astudillo 2016)"))
register(HeadSpec(
    "entmax15", MAPPINGS["entmax15"].apply, lambda z, t, s, training, **kw: losses.entmax15_loss(z, t, **kw),
    (), ALPHA_OF["entmax15"], sparse=True, conformal_support=True, cosine_classifier=False,
    doc="1.5-entmax and its Fenchel-Young loss (Peters et al. 2019)"))
register(HeadSpec(
    "entmax_bisect", MAPPINGS["entmax_bisect"].apply,
    lambda z, t, s, training, **kw: losses.entmax_bisect_loss(z, t, alpha=s["alpha"],
                                                              n_iter=mappings.entmax_bisect_steps(z, s), **kw),
    (ALPHA, LEARN_ALPHA), "alpha", sparse=True, conformal_support=True, cosine_classifier=False,
    doc="alpha-entmax, alpha fixed or learned (Correia et al. 2019)", check_settings=_learned_alpha_inside))
register(HeadSpec(
    "normmax", lambda z, dim, s: normmax.normmax(z, s["gamma"], dim),
    lambda z, t, s, training, **kw: normmax.normmax_loss(z, t, s["gamma"], **kw),
    (GAMMA,), None, sparse=True, conformal_support=False, cosine_classifier=False,
    doc="gamma-normmax and its Fenchel-Young loss (Santos et al. 2024)"))
register(HeadSpec(
    "sparse_softmax", lambda z, dim, s: topk_softmax.topk_softmax(z, s["k"], dim),
    lambda z, t, s, training, **kw: topk_softmax.topk_softmax_loss(z, t, s["k"], **kw),
    (K,), None, sparse=True, conformal_support=False, cosine_classifier=False,
    doc="softmax over the top k logits (Sun et al. 2021)", check_classes=_check_k_classes))
register(HeadSpec(
    "taylor_softmax", lambda z, dim, s: taylor_softmax.taylor_softmax(z, s["order"], dim),
    lambda z, t, s, training, **kw: taylor_softmax.taylor_softmax_loss(z, t, s["order"], **kw),
    (ORDER,), None, sparse=False, conformal_support=False, cosine_classifier=False,
    doc="Taylor softmax and its negative log-likelihood (de Brebisson & Vincent 2016)"))
register(HeadSpec(
    # the margin belongs to the training loss only: probabilities and eval loss are margin-free
    "am_softmax", lambda z, dim, s: mappings.softmax(z, dim),
    lambda z, t, s, training, **kw: am_softmax.am_softmax_loss(z, t, s["scale"], s["margin"] if training else 0.0,
                                                               **kw),
    (SCALE, MARGIN), None, sparse=False, conformal_support=False, cosine_classifier=True,
    doc="additive-margin softmax on a cosine classifier (Wang et al. 2018)"))

SIGMA = HParam("sigma", float, 1.0, check_sigma.range, check_sigma,
               "perturbmax only: noise scale sigma (Gumbel, sigma = 1: softmax in expectation), at least "
               f"float32's resolution next to logits up to +-{LOGIT_SCALE:g}", search="log [0.1, 3]")
SAMPLES = HParam("samples", int, 16, check_samples.range, check_samples, "perturbmax only: Monte-Carlo draws per row")
NOISE = HParam("noise", str, "gumbel", " | ".join(NOISES), check_noise, "perturbmax only: noise distribution")


def _perturbmax_args(s: dict) -> dict:
    seed, step, *ids = s["draw"]  # (seed, step) in training; (seed, step, row ids) in evaluation
    return dict(sigma=s["sigma"], samples=s["samples"], noise=s["noise"], seed=seed, step=step,
                ids=ids[0] if ids else None)


register(HeadSpec(
    "perturbmax", lambda z, dim, s: perturbmax.perturbmax(z, dim=dim, **_perturbmax_args(s)),
    lambda z, t, s, training, **kw: perturbmax.perturbmax_loss(z, t, **_perturbmax_args(s), **kw),
    (SIGMA, SAMPLES, NOISE), None, sparse=False, conformal_support=False, cosine_classifier=False,
    doc="Monte-Carlo perturbed argmax and its perturbed Fenchel-Young loss (Berthet et al. 2020)", draws=True))

HEAD_NAMES = tuple(HEADS)
# Heads whose probabilities have exact zeros: their support is a prediction set.
SPARSE_HEAD_NAMES = tuple(name for name, spec in HEADS.items() if spec.sparse)
# The entmax family, whose support has a closed-form conformal score (evaluation/conformal.py).
ENTMAX_HEAD_NAMES = tuple(name for name, spec in HEADS.items() if spec.conformal_support)


def is_sparse(name: str) -> bool:
    """Whether the named head's probabilities have exact zeros (False for an unknown name)."""
    spec = HEADS.get(name)
    return spec is not None and spec.sparse


def load_implementations() -> None:
    """Import every head's implementation now: torch.compile must not meet a module still to load."""
    load_deferred(globals())


__all__ = ["load_implementations", "HParam", "HeadSpec", "HEADS", "HPARAMS", "register", "head_spec", "check_settings",
           "defaults", "HEAD_NAMES", "SPARSE_HEAD_NAMES", "ENTMAX_HEAD_NAMES", "is_sparse", "learned_alpha_logit"]
