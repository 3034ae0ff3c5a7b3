"""Search ranges of tunable hyperparameters, written as text beside each one's declaration.

A hyperparameter that `compare_heads --tune` may tune declares `search=` next to its `range=`:
the head registry (models/registry.py) for the heads' own settings, the config schema
(configs/schema.py) for optim.lr and optim.weight_decay. The text reads like the range beside it:

    "log [1e-4, 0.1]"        a float, sampled uniformly in log space
    "[0, 0.5]"               a float, uniformly (linear scale)
    "int log [2, 10]"        an integer, log scale
    "int [2, 6] step 2"      an integer on a grid (2, 4, 6)

`parse_search` turns it into a `SearchRange`, which Optuna's trial samples (`suggest`).
"""
import math
import re
from dataclasses import dataclass
from typing import Optional

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_SEARCH = re.compile(rf"^\s*(?P<int>int\s+)?(?P<log>log\s+)?\[\s*(?P<low>{_NUMBER})\s*,\s*(?P<high>{_NUMBER})\s*\]"
                     rf"(?:\s+step\s+(?P<step>{_NUMBER}))?\s*$")


@dataclass(frozen=True)
class SearchRange:
    low: float
    high: float
    log: bool = False
    integer: bool = False
    step: Optional[int] = None

    def capped(self, high):
        """The same range with its upper end at most `high` (e.g. sparse_softmax's k <= classes)."""
        return SearchRange(self.low, min(self.high, high), self.log, self.integer, self.step)

    def suggest(self, trial, name):
        """Optuna's draw of `name` in this range."""
        if self.integer:
            return trial.suggest_int(name, int(self.low), int(self.high), step=self.step or 1, log=self.log)
        return trial.suggest_float(name, self.low, self.high, log=self.log)

    def text(self):
        scale = "log " if self.log else ""
        kind = "int " if self.integer else ""
        step = f" step {self.step}" if self.step else ""
        return f"{kind}{scale}[{self.low:g}, {self.high:g}]{step}"


def parse_search(text):
    """'log [1e-4, 0.1]' -> SearchRange; ValueError for text that is not one (a declaration bug)."""
    m = _SEARCH.match(text or "")
    if not m:
        raise ValueError(f"search range {text!r} is not '[low, high]', 'log [low, high]', 'int [low, high]' "
                         f"or 'int [low, high] step n'")
    low, high = float(m["low"]), float(m["high"])
    integer, log = bool(m["int"]), bool(m["log"])
    step = m["step"]
    if integer and not (low.is_integer() and high.is_integer() and (step is None or float(step).is_integer())):
        raise ValueError(f"search range {text!r}: an int range needs integer ends and step")
    if step is not None and not integer:
        raise ValueError(f"search range {text!r}: a step needs an int range")
    if not low < high or (log and low <= 0) or (log and step is not None) or not all(map(math.isfinite, (low, high))):
        raise ValueError(f"search range {text!r}: needs low < high (low > 0 on a log scale, no step there)")
    return SearchRange(low, high, log=log, integer=integer, step=int(float(step)) if step is not None else None)
