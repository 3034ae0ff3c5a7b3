"""Numeric ranges written as intervals ("[0, 1)": [ ] closed, ( ) open, inf unbounded) and the one
checker built from them.

Every numeric setting declares its range once, as such a text: the config schema's `range`
metadata (configs/schema.py) and a head hyperparameter's (models/registry.py, through the check
its module builds here). The check, the error message and the --help-config text all come from
that declaration, so they cannot disagree. Rules a check enforces: the value is a number of the
declared kind (an int setting takes 3 or 3.0, never 3.5 or true), finite, inside the interval, and
passes the setting's extra condition if it has one (e.g. even); otherwise one UserError line
naming the key, what it must be and the value given.
"""
import functools
import math
import numbers
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from .errors import UserError


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    low_closed: bool
    high_closed: bool
    text: str  # as declared, e.g. "[0, 1)"

    def __contains__(self, value) -> bool:
        above = value >= self.low if self.low_closed else value > self.low
        below = value <= self.high if self.high_closed else value < self.high
        return above and below

    def describe(self) -> str:
        """'> 0', '>= 1' for a half-line, else 'in [0, 1)' (the wording of messages and --help-config)."""
        if self.high == math.inf:
            return f"{'>=' if self.low_closed else '>'} {self.low:g}"
        return f"in {self.text}"


@functools.lru_cache(maxsize=None)
def parse_interval(text: str) -> Interval:
    """'[0, 1)' -> Interval; ValueError for a text that is not one (a declaration's mistake)."""
    try:
        low, high = (float(x) for x in text[1:-1].split(","))
    except ValueError:
        raise ValueError(f"not an interval: {text!r} (write e.g. '[0, 1)' or '(0, inf)')") from None
    if text[0] not in "[(" or text[-1] not in ")]" or not low <= high:
        raise ValueError(f"not an interval: {text!r} (write e.g. '[0, 1)' or '(0, inf)')")
    return Interval(low, high, text[0] == "[", text[-1] == "]", text)


class RangeCheck:
    """check(value) -> the value as `kind` (float or int), or a one-line UserError.

    key: the setting's name in messages (e.g. "head.scale"); interval: its declared range text;
    note: what a user needs to pick a value, shown in the message (e.g. "the paper uses 30");
    extra: (predicate, adjective) for a condition beyond the interval, e.g. (is_even, "even")."""

    def __init__(self, key: str, kind: type, interval: str, note: str = "",
                 extra: Optional[Tuple[Callable[[float], bool], str]] = None):
        if kind not in (float, int):
            raise ValueError(f"{key}: a range check is for float or int settings, not {kind.__name__}")
        self.key, self.kind, self.interval, self.note, self.extra = key, kind, parse_interval(interval), note, extra

    @property
    def range(self) -> str:
        """The declared range as --help-config shows it, e.g. '(0, inf)' or 'even, >= 2'."""
        return f"{self.extra[1]}, {self.interval.describe()}" if self.extra else self.interval.text

    def expectation(self) -> str:
        """'a finite number > 0', 'an even whole number >= 2' (without the note)."""
        noun = "finite number" if self.kind is float else "whole number"
        words = f"{self.extra[1]} {noun}" if self.extra else noun
        article = "an" if words[0] in "aeiou" else "a"
        return f"{article} {words} {self.interval.describe()}"

    def __call__(self, value):
        number = self._as_kind(value)
        if (number is None or not math.isfinite(number) or number not in self.interval
                or (self.extra is not None and not self.extra[0](number))):
            note = f" ({self.note})" if self.note else ""
            raise UserError(f"{self.key} must be {self.expectation()}{note}, got {value!r}")
        return number

    def _as_kind(self, value):
        """The value as `kind`, or None when it is not a number of that kind."""
        if isinstance(value, bool):
            return None
        if self.kind is int:
            if isinstance(value, numbers.Integral):
                return int(value)
            return int(value) if isinstance(value, float) and value.is_integer() else None
        try:
            return float(value)
        except (TypeError, ValueError):
            return None


__all__ = ["Interval", "parse_interval", "RangeCheck"]
