"""The one interval checker (common/intervals.py): what each declared range admits, its messages,
and that every numeric head hyperparameter and config key is checked by its declared range."""
import math

import pytest

from common.errors import UserError
from common.intervals import RangeCheck, parse_interval
from configs.schema import RANGES
from models.registry import HPARAMS


@pytest.mark.parametrize("text, inside, outside, words", [
    ("[0, 1)", [0, 0.5, 0.999], [-1e-9, 1, 2], "in [0, 1)"),
    ("(0, inf)", [1e-12, 1, 1e300], [0, -1], "> 0"),
    ("[1, 2]", [1, 1.5, 2], [0.999, 2.001], "in [1, 2]"),
    ("[2, inf)", [2, 3], [1.999], ">= 2")])
def test_an_interval_admits_what_its_brackets_say(text, inside, outside, words):
    interval = parse_interval(text)
    assert all(v in interval for v in inside) and not any(v in interval for v in outside)
    assert interval.describe() == words


@pytest.mark.parametrize("text", ["0, 1", "[1, 0]", "[a, 1)", "{0, 1}"])
def test_a_range_that_is_no_interval_is_a_declaration_error(text):
    with pytest.raises(ValueError, match="not an interval"):
        parse_interval(text)


@pytest.mark.parametrize("key, value, message", [
    ("scale", -1.0, "head.scale must be a finite number > 0 (the paper uses 30), got -1.0"),
    ("scale", "big", "head.scale must be a finite number > 0 (the paper uses 30), got 'big'"),
    ("margin", math.inf, "head.margin must be a finite number >= 0 (the paper uses 0.35), got inf"),
    ("alpha", 2.5, "head.alpha must be a finite number in [1, 2] (1 = softmax, 2 = sparsemax), got 2.5"),
    ("gamma", 1.0, "head.gamma must be a finite number > 1 (2 is the paper's default), got 1.0"),
    ("samples", 0.5, "head.samples must be a whole number in [1, 1048576] (Monte-Carlo draws per row), got 0.5"),
    ("samples", True, "head.samples must be a whole number in [1, 1048576] (Monte-Carlo draws per row), got True"),
    ("order", 3, "head.order must be an even whole number in [2, 64] (Taylor softmax is only positive for even "
                 "orders), got 3")])
def test_a_head_setting_outside_its_range_is_one_line_naming_key_range_and_value(key, value, message):
    with pytest.raises(UserError) as err:
        HPARAMS[key].check(value)
    assert str(err.value) == message


def test_a_whole_float_is_an_int_and_a_number_text_a_float():
    assert HPARAMS["samples"].check(4.0) == 4 and isinstance(HPARAMS["samples"].check(4.0), int)
    assert HPARAMS["order"].check(4) == 4
    assert HPARAMS["scale"].check("30") == 30.0


def test_every_numeric_head_setting_shows_the_range_its_check_enforces():
    for hp in HPARAMS.values():
        if isinstance(hp.check, RangeCheck):
            assert hp.range == hp.check.range, hp.name
    numeric = [hp.name for hp in HPARAMS.values() if hp.type in (int, float) and hp.name != "k"]
    assert numeric and all(isinstance(HPARAMS[n].check, RangeCheck) for n in numeric), numeric


def test_every_config_range_is_an_interval():
    assert RANGES and all(parse_interval(text).text == text for text in RANGES.values())
