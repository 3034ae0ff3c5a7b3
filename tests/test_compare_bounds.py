"""Every number compare_heads takes is checked against its limit (comparison/limits.py) before any work, in
one line that names the limit, and is read as written: `1_0` is not 10, `nan` no margin. The sequential
design holds the same limits, so a record that names more (tests/test_design_record.py) is refused too,
and its calibration's memory is bounded by drawing long designs in fewer rows, which leaves the seeded
stream, and so the boundaries, as they were. (The same lines without torch: test_config_errors_fast.py.)"""
import math

import numpy as np
import pytest

import compare_heads  # scripts/ is on sys.path (tests/conftest.py)
from common.errors import UserError
from comparison import limits
from comparison.analysis import sequential
from comparison.analysis.sequential import Design

SETTLE = ["--until-settled"]
CASES = [
    (SETTLE + ["--looks", "3", "99999999999999999999"], "--looks must be at most 1000 (seeds per variant"),
    (SETTLE + ["--max-seeds", "99999999999999999999"], "--max-seeds must be at most 1000 (seeds per variant"),
    (SETTLE + ["--max-seeds", "1001"], "--max-seeds must be at most 1000"),
    (SETTLE + ["--max-seeds", "1"], "--max-seeds must be at least 2 (seeds per variant: a look needs 2"),
    (SETTLE + ["--max-seeds", "1_000"], "--max-seeds takes whole numbers written in digits (e.g. --max-seeds 3), "
                                        "got '1_000'"),
    (SETTLE + ["--max-seeds=-5"], "--max-seeds must be at least 2"),
    (SETTLE + ["--looks", *map(str, range(2, 53))], "--looks: at most 50 looks per design, got 51"),
    (SETTLE + ["--looks", "5", "3"], "--looks 5 3: the looks' seed counts must increase"),
    (["--jobs", "0"], "--jobs must be at least 1 (local runs at once), got 0"),
    (["--jobs", "99999999999999999999"], "--jobs must be at most 256 (local runs at once)"),
    (["--seeds", "0", "0"], "--seeds: 0 is given twice; give each once"),
    (["--heads", "softmax", "softmax"], "--heads: softmax is given twice"),
    (["--heads", "entmax_bisect", "--alphas", "1.5", "1.5"], "--alphas: 1.5 is given twice"),
    (["--norms", "affine", "layernorm", "affine"], "--norms: affine is given twice"),
    (["--heads", "softmax", "entmax_bisect", "--alphas", *(f"1.{i:03d}" for i in range(1, 101))],
     "at most 100 variants per comparison (heads × norms × alphas), got 101"),
    (["--seeds", "-1"], "--seeds must be at least 0 (a 32-bit seed), got -1"),
    (["--seeds", "4294967296"], "--seeds must be at most 4294967295 (a 32-bit seed)"),
    (["--seeds", "9" * 5000], "--seeds must be at most 4294967295 (a 32-bit seed), got 999999999999999999999999999..."),
    (["--seeds", *map(str, range(1001))], "--seeds: at most 1000 seeds per variant, got 1001"),
    (["--seeds", "1_0"], "--seeds takes whole numbers written in digits"),
    (["--tune", "--trials", "10001"], "--trials must be at most 10000 (complete trials per variant)"),
    (["--heads", "entmax_bisect", "--alphas", "1_5"], "--alphas takes numbers written in digits (e.g. --alphas 1.5)"),
    (["--margin", "top1=1_0"], "--margin 'top1=1_0': write the margin in plain digits, e.g. top1=0.5"),
    (["--margin", "top1=nan"], "the margin must be a positive finite number, from 1e-06 to below 100 pt, got nan"),
    (["--margin", "top1=inf"], "positive finite number, from 1e-06 to below 100 pt, got inf"),
    (["--margin", "ece=100"], "from 1e-06 to below 100 pt, got 100"),
    (["--margin", "loss=1e999"], "below 100 (the FY loss's own units), got 1e999"),
    (["--margin", "top1=1e-7"], "from 1e-06 to below 100 pt, got 1e-7"),
]


@pytest.mark.parametrize("extra, says", CASES, ids=[" ".join(e)[:40] for e, _ in CASES])
def test_an_absurd_number_is_one_line_naming_its_limit(extra, says):
    with pytest.raises(UserError) as err:
        compare_heads.parse_args(["--config", "x.yaml", *extra])  # (the config is read after: nothing is)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_numbers_at_their_limits_are_taken():
    args = compare_heads.parse_args(["--config", "x.yaml", "--until-settled", "--max-seeds", str(limits.MAX_SEEDS),
                                     "--jobs", str(limits.MAX_JOBS), "--margin", "top1=99.5", "--margin", "ece=1e-6"])
    assert (args.max_seeds, args.jobs, args.margins) == (1000, 256, {"top1": 99.5, "ece": 1e-6})
    looks = [str(n) for n in range(2, 2 + limits.MAX_LOOKS - 1)] + [str(limits.MAX_SEEDS)]
    assert compare_heads.parse_args(["--config", "x.yaml", "--until-settled", "--looks", *looks]).looks[-1] == 1000
    assert compare_heads.parse_args(["--config", "x.yaml", "--seeds", "0", str(limits.MAX_SEED_VALUE)]).seeds[-1] \
        == 2 ** 32 - 1


@pytest.mark.parametrize("fields, says", [
    ({"looks": (3, 1001)}, "at most 1000 seeds"),
    ({"looks": tuple(range(2, 53))}, "at most 50 seed counts"),
    ({"looks": (3, math.inf)}, "looks must be whole numbers"),  # was an OverflowError (int(inf))
    ({"looks": (3, 5.0)}, "looks must be whole numbers"),
    ({"mc_paths": 10 ** 12}, "mc_paths must be a whole number from 1000 to 1048576"),
    ({"mc_paths": math.inf}, "mc_paths must be a whole number"),
    ({"mc_seed": -1}, "mc_seed one >= 0"),
])
def test_the_design_holds_the_same_limits(fields, says):
    with pytest.raises(ValueError, match=says):
        Design(margin=0.005, **fields)


def test_a_long_design_is_drawn_in_fewer_rows_with_the_same_stream(monkeypatch):
    """The calibration's chunks hold whole rows, so how many rows a chunk holds (fewer for long designs, to
    bound the memory) does not change a single statistic."""
    looks, paths = (3, 5, 8), 5000
    sequential._null_t_statistics.cache_clear()
    whole = sequential._null_t_statistics(looks, paths, 7)
    monkeypatch.setattr(sequential, "_MC_CHUNK_VALUES", 8 * 37)  # 37 rows a chunk: a last chunk part-full
    sequential._null_t_statistics.cache_clear()
    assert np.array_equal(sequential._null_t_statistics(looks, paths, 7), whole, equal_nan=True)
    sequential._null_t_statistics.cache_clear()
