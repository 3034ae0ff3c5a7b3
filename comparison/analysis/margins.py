"""The compared metrics and their equivalence margins: declarations and the `--margin` parser, with no
numpy (comparison/cli.py reads them before anything heavy loads: a mistyped margin is one line at once).
statistics.py computes the metrics, equivalence.py the verdicts at these margins."""
import math
from dataclasses import dataclass
from typing import Optional, Tuple

from common.errors import UserError
from common.suggest import suggest_value
from comparison.limits import MAX_MARGIN, MIN_MARGIN, plain_number


@dataclass(frozen=True)
class Metric:
    """A compared metric: its label, the per-example arrays it is computed from, whether its
    differences read as percentage points (a fraction) or in its own units, the decimals a
    sentence gives them, whether a higher value is better, and the default equivalence margin δ
    of its head − reference difference in the units its differences read in (points when
    in_points; None: no equivalence verdict unless a margin is given; comparison/analysis/equivalence.py)."""

    label: str
    needs: Tuple[str, ...]
    in_points: bool
    digits: int
    higher_is_better: bool
    margin: Optional[float]


# The compared metrics, in report order (results, tables and sentences of comparison/analysis/paired.py).
# The margins are judgements of what difference does not matter, not statistics; each is stated in
# the report, and `--margin METRIC=δ` (parse_margins, below) replaces it:
#   top-1 0.5 pt: below the gains usually reported for a changed head or recipe on CIFAR-scale image
#     classification, and about the spread that the training seed alone causes there (Picard 2021,
#     "torch.manual_seed(3407) is all you need"; Bouthillier et al., MLSys 2021): a head within
#     ±0.5 pt of softmax is as good a choice on accuracy;
#   ECE 1 pt (0.01): the 15-bin ECE estimate itself is biased and noisy at that level on a
#     validation set of ~10,000 images (Kumar, Liang & Ma, NeurIPS 2019; Roelofs et al., AISTATS
#     2022), so smaller differences are not calibration differences anyone could act on;
#   FY loss none: each head's loss is a different function (its own Fenchel-Young loss), so "as
#     good as" on it has no common scale; give `--margin loss=δ` to ask anyway.
METRIC_TABLE = {"top1": Metric("top-1", ("correct",), True, 1, higher_is_better=True, margin=0.5),
                "ece": Metric("ECE", ("confidence", "correct"), True, 2, higher_is_better=False, margin=1.0),
                "loss": Metric("FY loss", ("loss",), False, 3, higher_is_better=False, margin=None)}
METRICS = tuple(METRIC_TABLE)


# ---- margins ---------------------------------------------------------------------------------------------
def default_margins():
    """{metric: δ} of every metric with a default margin, in the units its differences read in."""
    return {m: t.margin for m, t in METRIC_TABLE.items() if t.margin is not None}


def margin_units(metric):
    """'pt' or '' (own units): how a metric's margin and differences are written."""
    return "pt" if METRIC_TABLE[metric].in_points else ""


def margin_as_difference(metric, margin):
    """A margin in the metric's written units (points for top-1 / ECE) in the units of its differences
    (fractions): 0.5 pt of top-1 -> 0.005."""
    return margin / 100.0 if METRIC_TABLE[metric].in_points else margin


def parse_margins(texts):
    """{metric: δ} from `--margin` values such as ["top1=0.5", "ece=1"] (δ in points for top-1 and ECE,
    in its own units for the loss). Raises UserError (one line) on a malformed item, an unknown metric
    (with a did-you-mean), a δ not written plainly (float() reads `1_0` as 10), outside
    [MIN_MARGIN, MAX_MARGIN) (comparison/limits.py) or not finite, or a metric given twice."""
    margins = {}
    for text in texts or ():
        name, sep, value = str(text).partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise UserError(f"--margin {text!r}: expected METRIC=DELTA, e.g. top1=0.5 (metrics: {', '.join(METRICS)})")
        if name not in METRIC_TABLE:
            raise UserError(f"--margin {text!r}: unknown metric {name!r}{suggest_value(name, METRICS)} "
                            f"(metrics: {', '.join(METRICS)})")
        try:
            delta = float(value)
        except ValueError:
            raise UserError(f"--margin {text!r}: {value!r} is not a number") from None
        if math.isfinite(delta) and plain_number(value) is None:
            raise UserError(f"--margin {text!r}: write the margin in plain digits, e.g. {name}=0.5 ({value!r} "
                            f"has a character a number does not: '_', a space or a digit of another script)")
        if not (math.isfinite(delta) and MIN_MARGIN <= delta < MAX_MARGIN):
            unit = f" {margin_units(name)}" if margin_units(name) else f" (the {METRIC_TABLE[name].label}'s own units)"
            raise UserError(f"--margin {text!r}: the margin must be a positive finite number, from {MIN_MARGIN:g} to "
                            f"below {MAX_MARGIN:g}{unit}, got {value}")
        if name in margins:
            raise UserError(f"--margin {name} given twice ({margins[name]:g} and {delta:g}); give each metric once")
        margins[name] = delta
    return margins
