"""The largest numbers compare_heads takes, and how they are written, checked before any work
(comparison/cli.py, --margin's parser in comparison/analysis/equivalence.py) and by the sequential
design itself (comparison/analysis/sequential.py). Torch-free: the command line is answered before
anything heavy loads.

Why these: a look's t-scale calibration draws 2^18 seeded paths of the last look's seeds, and the plan
and the cost line grow with the seeds of every variant, so MAX_SEEDS bounds the time of even a
--dry-run (docs/comparison.md gives it); a design of more looks than MAX_LOOKS spends its α on looks
too close to tell apart; the rest are far past any real use. Numbers are written plainly: Python's
int() and float() also read `1_0` (10), ` 5`, `+5`, other scripts' digits, `nan` and `inf`.
"""
import re

MIN_SEEDS = 2  # a look needs 2 seeds for a seed-to-seed s.d.
MAX_SEEDS = 1000  # seeds per variant: --max-seeds, each of --looks, the count of --seeds
MAX_LOOKS = 50  # the looks of one design
MAX_VARIANTS = 100  # heads × norms × alphas of one comparison
MAX_SEED_VALUE = 2 ** 32 - 1  # a --seeds value: a 32-bit seed, what every seeded library takes
MAX_TRIALS = 10000  # --trials per variant
MAX_JOBS = 256  # --jobs: local runs at once
MIN_MARGIN, MAX_MARGIN = 1e-6, 100.0  # --margin, in the metric's written units: no difference reaches 100 pt

WHOLE_NUMBER = re.compile(r"[+-]?[0-9]+")
PLAIN_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def plain_number(text):
    """float(text) for a number written plainly (ASCII digits, one '.', an optional exponent), else None."""
    return float(text) if PLAIN_NUMBER.fullmatch(text) else None
