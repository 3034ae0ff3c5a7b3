"""Seed-aware statistics (comparison/analysis/statistics.py, across trainings) and the comparison's sanity
checks (comparison/analysis/sanity.py), on simulated per-seed, per-example outcomes with a known seed
variance and effect. References are independent: closed forms, brute-force enumeration, Monte Carlo."""
import itertools
import math

import numpy as np
import pytest

from comparison.analysis import paired, sanity
from comparison.analysis import statistics as st

MINUS = "\u2212"


# ---- Student t and power ---------------------------------------------------------------------------
def test_student_t_matches_closed_forms_and_the_normal_limit():
    for x in (-7.0, -1.3, 0.0, 0.4, 2.5, 30.0):
        assert st.student_t_cdf(x, 1) == pytest.approx(0.5 + math.atan(x) / math.pi, abs=1e-12)  # Cauchy
        assert st.student_t_cdf(x, 2) == pytest.approx(0.5 + x / (2 * math.sqrt(2 + x * x)), abs=1e-12)
        assert st.student_t_cdf(x, 4000) == pytest.approx(0.5 * math.erfc(-x / math.sqrt(2)), abs=2e-4)
    assert st.student_t_quantile(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), rel=1e-9)
    q2 = st.student_t_quantile(0.975, 2)  # closed form of the df = 2 quantile: 2p−1 = x / √(2 + x²)
    assert q2 == pytest.approx(0.95 * math.sqrt(2 / (1 - 0.95 ** 2)), rel=1e-9)
    assert st.student_t_quantile(0.025, 7) == pytest.approx(-st.student_t_quantile(0.975, 7), rel=1e-12)


@pytest.mark.parametrize("n_seeds,delta", [(3, 3.0), (5, 1.0), (12, 0.6)])
def test_paired_t_power_matches_a_simulated_t_test(n_seeds, delta):
    rng = np.random.default_rng(n_seeds)
    x = rng.normal(delta, 1.0, size=(100_000, n_seeds))
    t = x.mean(axis=1) / (x.std(axis=1, ddof=1) / math.sqrt(n_seeds))
    simulated = np.mean(np.abs(t) > st.student_t_quantile(0.975, n_seeds - 1))
    assert st.paired_t_power(delta, 1.0, n_seeds) == pytest.approx(simulated, abs=0.006)  # MC sd ~0.0016
    assert st.paired_t_power(0.0, 1.0, n_seeds) == pytest.approx(0.05, abs=1e-6)  # size of the test


def test_minimum_detectable_difference_and_seeds_needed_are_the_80_percent_points():
    sd = 0.015
    for n in (2, 3, 5, 10):
        mdd = st.min_detectable_difference(sd, n)
        assert st.paired_t_power(mdd, sd, n) == pytest.approx(0.8, abs=1e-4)
    assert st.min_detectable_difference(sd, 10) < st.min_detectable_difference(sd, 3)
    for diff in (0.005, 0.02, 0.031):
        n = st.seeds_needed(diff, sd)
        assert st.paired_t_power(diff, sd, n) >= 0.8 > st.paired_t_power(diff, sd, n - 1)
    assert st.seeds_needed(0.0, sd) is None and st.seeds_needed(1e-6, sd) is None  # > 1000 seeds


def _scipy_power(diff, sd, n, alpha=0.05):
    """Power of the two-sided paired t-test from scipy's non-central t."""
    from scipy import stats

    crit, nc = stats.t.ppf(1 - alpha / 2, n - 1), diff * math.sqrt(n) / sd
    return stats.nct.sf(crit, n - 1, nc) + stats.nct.sf(crit, n - 1, -nc)  # the lower tail by symmetry


def _scipy_mdd(sd, n, power=0.8):
    from scipy import optimize

    high = sd
    while _scipy_power(high, sd, n) < power:
        high *= 2
    return optimize.brentq(lambda d: _scipy_power(d, sd, n) - power, 1e-9 * sd, high, xtol=1e-12 * sd)


@pytest.mark.parametrize("n_seeds", [3, 5, 10])
def test_power_ranges_come_from_the_sds_chi2_interval(n_seeds):
    """The verdict's s.d. interval, MDD range and seeds range against scipy's χ² and non-central t."""
    from scipy import stats

    rng = np.random.default_rng(n_seeds)
    n = 200
    a = {"correct": rng.random(n_seeds * n) < 0.8}
    b = {"correct": rng.random(n_seeds * n) < np.repeat(rng.uniform(0.7, 0.8, n_seeds), n)}
    r = st.across_trainings(a, b, groups=np.repeat(np.arange(n_seeds), n), example_ids=np.tile(np.arange(n), n_seeds),
                            metrics=["top1"], n_boot=20)["top1"]
    sd, nu = r["sd"], n_seeds - 1
    low, high = sd * math.sqrt(nu / stats.chi2.ppf(0.975, nu)), sd * math.sqrt(nu / stats.chi2.ppf(0.025, nu))
    assert (r["sd_low"], r["sd_high"]) == pytest.approx((low, high), rel=1e-9)
    assert (r["mdd_low"], r["mdd_high"]) == pytest.approx((_scipy_mdd(low, n_seeds), _scipy_mdd(high, n_seeds)),
                                                          rel=1e-4)
    for s, needed in ((low, r["seeds_needed_low"]), (high, r["seeds_needed_high"])):
        if needed is not None and needed < 200:  # the fewest seeds with 80% power (scipy) for the mean
            assert _scipy_power(r["difference"], s, needed) >= 0.8 - 1e-6
            assert needed == 2 or _scipy_power(r["difference"], s, needed - 1) < 0.8 + 1e-6
    if not r["significant"]:
        text = st.describe_across_trainings(r, "a", "b")
        assert (f"with {n_seeds} seeds the seed s.d. is known only to [{100 * low:.1f}, {100 * high:.1f}] pt "
                f"(95% χ² interval): MDD {st.two_figures(100 * r['mdd_low'])}–{st.two_figures(100 * r['mdd_high'])} "
                f"pt (80% power, non-central t)") in text
        assert text.endswith("plan seeds from a pilot") and "needs ≥" not in text


# ---- sign flips -----------------------------------------------------------------------------------
def _brute_force_sign_flip(d):
    d = list(d)
    observed = abs(sum(d) / len(d))
    hits = sum(abs(sum(s * x for s, x in zip(signs, d)) / len(d)) >= observed - 1e-12
               for signs in itertools.product((1, -1), repeat=len(d)))
    return hits / 2 ** len(d)


def test_sign_flip_p_value_matches_brute_force_enumeration():
    rng = np.random.default_rng(0)
    cases = [[0.0405, 0.012, 0.0415], [1.0, -1.0, 0.5, 2.0], [0.3, 0.3, 0.3, 0.3, 0.3], [0.0, 0.0],
             [2.0, -2.0, 1.0, -1.0]]  # the last ones with ties and zeros
    cases += [list(rng.normal(0.3, 1.0, size=n)) for n in (1, 2, 6, 9, 11)]
    for d in cases:
        assert st.sign_flip_p_value(d) == pytest.approx(_brute_force_sign_flip(d), abs=1e-15), d
    assert st.sign_flip_p_value([0.0405, 0.012, 0.0415]) == 0.25  # the issue's sparsemax − softmax seeds
    many = rng.normal(0.5, 1.0, size=18)  # beyond the exact limit: Monte Carlo, close to the exact value
    exact = st.sign_flip_p_value(many, max_exact=18)
    assert st.sign_flip_p_value(many) == pytest.approx(exact, abs=0.01)


# ---- simulated trainings ----------------------------------------------------------------------------
def _ece_by_bins(confidence, correct, n_bins=st.ECE_BINS):
    """ECE written out bin by bin (Guo et al. 2017): sum over bins of n_b/n |acc_b - conf_b|, with
    equal-width bins (lo, hi] and the first bin closed at 0."""
    confidence, correct = np.asarray(confidence, np.float64), np.asarray(correct, np.float64)
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        rows = (confidence > lo) & (confidence <= hi) if b else (confidence <= hi)
        if rows.any():
            total += rows.sum() / confidence.size * abs(correct[rows].mean() - confidence[rows].mean())
    return total


def _simulate(rng, n_seeds, n, effect, seed_sd, base=0.8):
    """Per-seed, per-example correctness of two heads. Each training's true accuracy varies around
    the recipe's (base + effect for A, base for B) with s.d. seed_sd; example difficulty is shared by
    all trainings of both heads (what pairing cancels)."""
    difficulty = rng.normal(0.0, 1.0, n)
    groups, ids = np.repeat(np.arange(n_seeds), n), np.tile(np.arange(n), n_seeds)

    def head(mean):
        acc = np.clip(mean + rng.normal(0.0, seed_sd, n_seeds), 0.05, 0.95)
        # a logistic shift per training so that its mean accuracy is about acc
        shift = np.log(acc / (1 - acc))[:, None] * 1.6
        p = 1 / (1 + np.exp(-(shift + difficulty[None, :])))
        return {"correct": (rng.uniform(size=(n_seeds, n)) < p).ravel()}

    return head(base + effect), head(base), groups, ids


def _population_effect(effect, base=0.8, draws=400_000):
    """The recipe-level effect of _simulate (the average over trainings and examples), by Monte Carlo
    without seed noise (its mean is zero and the map is smooth, so the offset is tiny)."""
    rng = np.random.default_rng(99)
    difficulty = rng.normal(0.0, 1.0, draws)

    def acc(mean):
        shift = math.log(mean / (1 - mean)) * 1.6
        return np.mean(1 / (1 + np.exp(-(shift + difficulty))))
    return acc(base + effect) - acc(base)


def test_across_trainings_interval_covers_and_the_conditional_one_does_not_when_seeds_vary():
    """Seed s.d. 3 pt, 5 seeds, 1000 images: the t-interval over seeds covers the recipe's effect at
    about 95%; the bootstrap over images (given these trainings) is far too narrow for that question."""
    rng = np.random.default_rng(1)
    effect = 0.02
    truth = _population_effect(effect)
    covered_t, covered_conditional, widths = [], [], []
    for experiment in range(200):
        a, b, groups, ids = _simulate(rng, 5, 1000, effect, seed_sd=0.03)
        across = st.across_trainings(a, b, groups=groups, example_ids=ids, metrics=["top1"], n_boot=20,
                                     seed=experiment, power=None)["top1"]
        conditional = st.paired_bootstrap(a, b, groups=groups, example_ids=ids, n_boot=100, seed=experiment)["top1"]
        covered_t.append(across["t_low"] <= truth <= across["t_high"])
        covered_conditional.append(conditional["ci_low"] <= truth <= conditional["ci_high"])
        widths.append((across["t_high"] - across["t_low"], conditional["ci_high"] - conditional["ci_low"]))
    assert 0.89 <= np.mean(covered_t) <= 0.99  # binomial sd at 200 experiments: 1.5 points
    assert np.mean(covered_conditional) < 0.7
    assert np.mean([w[0] for w in widths]) > 2 * np.mean([w[1] for w in widths])


def test_without_seed_variance_both_intervals_cover():
    """The conditional interval is right for its own question: with no training-to-training noise
    the two agree on coverage."""
    rng = np.random.default_rng(2)
    effect = 0.03
    truth = _population_effect(effect)
    covered = []
    for experiment in range(120):
        a, b, groups, ids = _simulate(rng, 4, 300, effect, seed_sd=0.0)
        conditional = st.paired_bootstrap(a, b, groups=groups, example_ids=ids, n_boot=100, seed=experiment)["top1"]
        covered.append(conditional["ci_low"] <= truth <= conditional["ci_high"])
    assert np.mean(covered) >= 0.85


def test_across_trainings_per_seed_values_and_two_level_bootstrap_by_brute_force():
    rng = np.random.default_rng(3)
    a, b, groups, ids = _simulate(rng, 3, 60, 0.05, seed_sd=0.03)
    a["confidence"] = b["confidence"] = rng.uniform(0.2, 1.0, groups.size)
    a["loss"], b["loss"] = rng.exponential(size=groups.size), rng.exponential(size=groups.size)
    out = st.across_trainings(a, b, groups=groups, example_ids=ids, n_boot=40, seed=5)
    for s in range(3):
        rows = groups == s
        assert out["top1"]["per_seed"][s] == pytest.approx(a["correct"][rows].mean() - b["correct"][rows].mean())
        assert out["ece"]["per_seed"][s] == pytest.approx(
            _ece_by_bins(a["confidence"][rows], a["correct"][rows])
            - _ece_by_bins(b["confidence"][rows], b["correct"][rows]), abs=1e-12)
    d = np.array(out["top1"]["per_seed"])
    half = st.student_t_quantile(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert (out["top1"]["t_low"], out["top1"]["t_high"]) == pytest.approx((d.mean() - half, d.mean() + half))
    assert out["top1"]["min_sign_flip_p"] == 0.25
    # the bootstrap replicates, redone with explicit loops from the same random draws
    draw = np.random.default_rng(5)
    table = np.arange(groups.size).reshape(3, 60)
    seed_draws, example_draws = draw.integers(0, 3, size=(40, 3)), draw.integers(0, 60, size=(40, 60))
    reps = []
    for seeds_drawn, examples in zip(seed_draws, example_draws):
        reps.append(np.mean([a["correct"][table[s, examples]].mean() - b["correct"][table[s, examples]].mean()
                             for s in seeds_drawn]))
    assert (out["top1"]["boot_low"], out["top1"]["boot_high"]) == pytest.approx(
        tuple(np.quantile(reps, [0.025, 0.975])), abs=1e-12)


def test_a_diverged_runs_nan_loss_stays_nan_across_trainings():
    """One seed's FY loss is NaN (a diverged run): its per-seed difference is NaN, and so is every number
    built on it (before: sign-flip p 0, "seeds needed" 2); the table says n/a, the other metrics are
    untouched (top-1 per seed by hand)."""
    rng = np.random.default_rng(4)
    a, b, groups, ids = _simulate(rng, 4, 50, 0.02, seed_sd=0.02)
    a["loss"], b["loss"] = rng.exponential(size=groups.size), rng.exponential(size=groups.size)
    a["confidence"] = b["confidence"] = rng.uniform(0.2, 1.0, groups.size)
    a["loss"][groups == 2] = np.nan
    out = st.across_trainings(a, b, groups=groups, example_ids=ids, n_boot=20, seed=1)
    loss = out["loss"]
    assert math.isnan(loss["per_seed"][2]) and not math.isnan(loss["per_seed"][0])
    for key in ("difference", "sd", "t_low", "t_high", "sign_flip_p", "boot_low", "boot_high", "mdd_low",
                "mdd_high"):
        assert math.isnan(loss[key]), key
    assert loss["seeds_needed_low"] is None and loss["seeds_needed_high"] is None and not loss["significant"]
    assert math.isnan(st.sign_flip_p_value([0.1, math.nan, 0.2])) and math.isnan(st.sign_flip_p_value([math.inf, 1]))
    per_seed = [a["correct"][groups == s].mean() - b["correct"][groups == s].mean() for s in range(4)]
    assert out["top1"]["per_seed"] == pytest.approx(per_seed) and np.isfinite(out["top1"]["sign_flip_p"])
    _, rows = paired.across_rows([{"variant": "a", "baseline": "b", "across": out}])
    row = next(r for r in rows if r[1] == "FY loss")
    assert row[4] == row[6] == "n/a (a difference is not finite)" and row[5].startswith("n/a (min")
    assert row[7] == row[8] == "n/a" and "nan" in row[2] and "−nan" not in row[2] and "+nan" not in row[2]


# ---- verdicts ------------------------------------------------------------------------------------
def _records(correct, labels):
    pred = np.where(correct, labels, (labels + 1) % 10)
    return {"label": labels, "pred": pred, "max_prob": np.full(labels.size, 0.5), "loss": np.ones(labels.size)}


def _runs(outcome, n_seeds, n, labels):
    return {s: _records(outcome["correct"].reshape(n_seeds, n)[s], labels) for s in range(n_seeds)}


def test_issue_numbers_give_the_not_resolvable_sentence():
    r = {"metric": "top1", "per_seed": [0.0405, 0.0120, 0.0415], "n_seeds": 3, "level": 0.95, "power": 0.8}
    mean, sd, low, high = st.t_interval(r["per_seed"])
    r.update(difference=mean, sd=sd, t_low=low, t_high=high, sign_flip_p=st.sign_flip_p_value(r["per_seed"]),
             min_sign_flip_p=0.25, significant=bool(low > 0 or high < 0))
    sd_low, sd_high = st.sd_interval(sd, 3)
    r.update(sd_low=sd_low, sd_high=sd_high, mdd_low=st.min_detectable_difference(sd_low, 3),
             mdd_high=st.min_detectable_difference(sd_high, 3), seeds_needed_low=st.seeds_needed(mean, sd_low),
             seeds_needed_high=st.seeds_needed(mean, sd_high))
    text = st.describe_across_trainings(r, "sparsemax", "softmax")
    assert text.startswith(f"sparsemax {MINUS} softmax top-1 across 3 trainings: +3.1 pt [{MINUS}1.0, +7.3] "
                           "(t-interval over seeds; sign-flip p = 0.25), not significant at 5%: not resolvable "
                           "with 3 seeds; the per-seed differences have s.d. 1.7 pt, but with 3 seeds the seed "
                           "s.d. is known only to [0.9, 10.5] pt (95% χ² interval): MDD 2.8–34 pt (80% power, "
                           "non-central t); were the true difference the observed +3.1 pt, it would take ")
    assert text.endswith(f"{r['seeds_needed_low']}–{r['seeds_needed_high']} seeds; plan seeds from a pilot")
    # a consistent difference: significant by the t-interval, but 3 seeds cannot confirm it by sign flips
    r.update(per_seed=[0.030, 0.031, 0.029], difference=0.03, t_low=0.0275, t_high=0.0325, significant=True)
    text = st.describe_across_trainings(r, "sparsemax", "softmax")
    assert "significant at 5% by the t-interval" in text and "smallest p is 0.25; ≥ 6 seeds" in text
    assert "not significant" not in text


def test_identical_heads_are_not_significant_and_same_recipe_is_not_resolvable():
    rng = np.random.default_rng(4)
    n, labels = 500, np.tile(np.arange(10), 50)
    a, _, _, _ = _simulate(rng, 3, n, 0.0, seed_sd=0.01)
    same = paired.compare_pair(_runs(a, 3, n, labels), _runs(a, 3, n, labels), "copy", "softmax", n_boot=100)
    assert same["verdict"] == f"copy {MINUS} softmax top-1: 0.0 pt on each of the 3 seeds: no difference, " \
                              "not significant at 5%"
    assert same["across"]["top1"]["sign_flip_p"] == 1.0 and not same["across"]["top1"]["significant"]
    # two heads trained by the same recipe (new training noise, no effect): not resolvable
    a, b, _, _ = _simulate(rng, 3, n, 0.0, seed_sd=0.01)
    null = paired.compare_pair(_runs(a, 3, n, labels), _runs(b, 3, n, labels), "twin", "softmax", n_boot=100)
    if not null["across"]["top1"]["significant"]:  # 5% of the time a null difference is significant
        assert "not significant at 5%: not resolvable with 3 seeds" in null["verdict"]
    one = paired.compare_pair({0: _runs(a, 3, n, labels)[0]}, {0: _runs(b, 3, n, labels)[0]}, "x", "y", n_boot=50)
    assert "not resolvable with 1 seed" in one["verdict"]


def test_a_constant_nonzero_difference_is_not_called_significant():
    """The variant wrong on the same 3 more images at every seed: per-seed differences all −0.6 pt (by hand),
    s.d. 0. The t-interval's formula gives [−0.6, −0.6], but with no spread a t-test has no scale: not
    significant (before: "significant at 5%"), as the equivalence verdict gives none (comparison/analysis/
    equivalence.py)."""
    rng = np.random.default_rng(6)
    n, labels = 500, np.tile(np.arange(10), 50)
    base = {"correct": rng.uniform(size=3 * n) < 0.8}
    worse = {"correct": base["correct"].reshape(3, n).copy()}
    for s in range(3):
        worse["correct"][s, np.flatnonzero(worse["correct"][s])[:3]] = False
    worse["correct"] = worse["correct"].ravel()
    res = paired.compare_pair(_runs(worse, 3, n, labels), _runs(base, 3, n, labels), "sparsemax", "softmax",
                              n_boot=50)
    top1 = res["across"]["top1"]
    assert top1["per_seed"] == pytest.approx([-3 / n] * 3) and top1["sd"] == pytest.approx(0, abs=1e-15)
    assert not top1["significant"]
    assert res["verdict"] == (f"sparsemax {MINUS} softmax top-1: {MINUS}0.6 pt on each of the 3 seeds (s.d. 0: no "
                              "spread to measure the noise by, so no t-test), not significant at 5%")


def test_chance_level_head_gets_nothing_learned():
    rng = np.random.default_rng(5)
    n, labels = 1000, np.tile(np.arange(10), 100)
    guessing = {s: _records(rng.uniform(size=n) < 0.105, labels) for s in range(3)}  # 10.5%, chance 10%
    good = {s: _records(rng.uniform(size=n) < 0.9, labels) for s in range(3)}
    res = paired.compare_pair(guessing, good, "sparsemax", "softmax", n_boot=50)
    assert res["verdict"].startswith("sparsemax vs softmax: no comparison: nothing learned (sparsemax within "
                                     "noise of chance")
    assert res["learned"]["softmax"]["nothing_learned"] is False
    assert paired.compare_pair(good, good, "a", "softmax", n_boot=50)["verdict"].endswith("not significant at 5%")
    assert sanity.chance_level(np.array([3, 3, 3, 1])) == 0.75
    # the threshold: 3 standard errors above chance
    assert sanity.nothing_learned(0.1 + 2.9 * math.sqrt(0.09 / 1000), 0.1, 1000)
    assert not sanity.nothing_learned(0.1 + 3.1 * math.sqrt(0.09 / 1000), 0.1, 1000)


# ---- coverage band --------------------------------------------------------------------------------
def test_coverage_band_matches_simulated_split_conformal():
    """Continuous scores, n_cal = 200, n_test = 300, ε = 0.1: the band is the central 99% of the
    simulated empirical coverages, and its mean the Beta mean k/(n+1)."""
    rng = np.random.default_rng(6)
    n_cal, n_test, eps = 200, 300, 0.1
    k = math.ceil((n_cal + 1) * (1 - eps))
    cal = np.sort(rng.uniform(size=(20_000, n_cal)), axis=1)[:, k - 1]
    coverage = (rng.uniform(size=(20_000, n_test)) <= cal[:, None]).mean(axis=1)
    low, high, mean = sanity.coverage_band(n_cal, n_test, eps)
    q_low, q_high = np.quantile(coverage, [0.005, 0.995])
    assert abs(low - q_low) <= 2 / n_test and abs(high - q_high) <= 2 / n_test
    assert mean == pytest.approx(k / (n_cal + 1)) and mean == pytest.approx(coverage.mean(), abs=0.002)
    pmf = sanity.beta_binomial_pmf(40, 2.5, 4.0)
    brute = [math.comb(40, x) * math.exp(math.lgamma(x + 2.5) + math.lgamma(44 - x) - math.lgamma(46.5)
                                         - math.lgamma(2.5) - math.lgamma(4.0) + math.lgamma(6.5))
             for x in range(41)]
    assert pmf == pytest.approx(brute, abs=1e-12)


def test_coverage_check_explains_inside_and_flags_outside_the_band():
    low, high, _ = sanity.coverage_band(2500, 2000, 0.1)
    assert 0.87 < low < 0.9 < high < 0.93
    assert sanity.coverage_check(0.892, 2500, 2000, 0.1)[0] == "within band"  # the issue's LAC coverage
    assert sanity.coverage_check(0.905, 2500, 2000, 0.1)[0] == "ok"
    assert sanity.coverage_check(low - 0.002, 2500, 2000, 0.1)[0] == "below band"
    assert sanity.coverage_check(0.9, 5, 100, 0.1) == (None, None)  # too few to calibrate: sets are all classes


# ---- budget ---------------------------------------------------------------------------------------
def test_still_rising_compares_the_last_gain_with_its_noise():
    n_rows = 6000  # 3 seeds x 2000 images: noise 2 x sqrt(2 p (1 - p) / n) ~ 1.1 pt at 90%
    assert sanity.still_rising([(1, 0.80), (2, 0.90)], n_rows)[:2] == (True, pytest.approx(0.10))
    assert sanity.still_rising([(1, 0.979), (2, 0.981)], n_rows)[0] is False
    up, gain, span = sanity.still_rising([(e, 0.5 + 0.04 * e) for e in range(1, 9)], n_rows)
    assert up and span == (6, 8) and gain == pytest.approx(0.08)  # the last quarter of 8 epochs
    assert sanity.still_rising([(1, 0.9)], n_rows) == (None, None, None)
