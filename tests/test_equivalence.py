"""Equivalence, non-inferiority and superiority verdicts (comparison/analysis/equivalence.py) against scipy's t-tests,
Holm's procedure against its step-down definition, the --margin parser, and the margin and verdicts as
report.md, summary.json and the plain-words summary give them (synthetic comparisons: no training)."""
import json
import math

import numpy as np
import pytest
from scipy import stats

from common.errors import UserError
from comparison.analysis import equivalence, margins
from comparison.analysis.margins import METRIC_TABLE
from comparison.report import document, plain_words
from synthetic_comparison import QUICKSTART_LIKE, synthetic_variants

ALPHA = 0.05
CURVE = [(1, 0.5), (2, 0.8)]
SMALL = dict(n_val=300, n_cal=200, n_ood=50)


def _scipy_reference(d, margin, alpha, higher_is_better):
    """The four claims by scipy: TOST as two ttest_1samp with shifted nulls (and ttest_rel on a shifted pair),
    the 1 − 2α and 1 − α t-intervals, the two-sided test of 0."""
    d = np.asarray(d, dtype=np.float64)
    p_lower = stats.ttest_1samp(d, -margin, alternative="greater").pvalue
    p_upper = stats.ttest_1samp(d, margin, alternative="less").pvalue
    reference = np.linspace(0.7, 0.9, d.size)  # any reference: the pair's difference is what is tested
    assert stats.ttest_rel(reference + d + margin, reference, alternative="greater").pvalue == pytest.approx(p_lower)
    sem = stats.sem(d)
    interval = stats.t.interval(1 - 2 * alpha, d.size - 1, loc=d.mean(), scale=sem)
    difference_interval = stats.t.interval(1 - alpha, d.size - 1, loc=d.mean(), scale=sem)
    p_difference = stats.ttest_1samp(d, 0.0).pvalue
    better = d.mean() > 0 if higher_is_better else d.mean() < 0
    return {"p_lower": p_lower, "p_upper": p_upper, "p_equivalence": max(p_lower, p_upper),
            "p_non_inferiority": p_lower if higher_is_better else p_upper, "p_difference": p_difference,
            "interval": interval, "difference_interval": difference_interval,
            "equivalent": max(p_lower, p_upper) < alpha, "superior": p_difference < alpha and better,
            "inferior": p_difference < alpha and not better,
            "non_inferior": (p_lower if higher_is_better else p_upper) < alpha}


@pytest.mark.parametrize("n", [3, 5, 10])
@pytest.mark.parametrize("margin", [0.002, 0.005, 0.02])
@pytest.mark.parametrize("higher_is_better", [True, False])
def test_tost_and_non_inferiority_match_scipy(n, margin, higher_is_better):
    rng = np.random.default_rng(n * 1000 + int(margin * 1e4))
    verdicts = set()
    for trial in range(40):  # true differences from well inside to well outside the margin
        d = rng.normal(loc=rng.uniform(-3, 3) * margin, scale=rng.uniform(0.2, 2.0) * margin, size=n)
        ours = equivalence.equivalence_verdict(d, margin, ALPHA, higher_is_better)
        ref = _scipy_reference(d, margin, ALPHA, higher_is_better)
        for key in ("p_lower", "p_upper", "p_equivalence", "p_non_inferiority", "p_difference"):
            assert ours[key] == pytest.approx(ref[key], rel=1e-7, abs=1e-12), (key, d)
        for key in ("interval", "difference_interval"):
            assert ours[key] == pytest.approx(ref[key], rel=1e-9, abs=1e-12)
        for key in ("equivalent", "superior", "inferior", "non_inferior"):
            assert ours[key] == ref[key], (key, d)
        # the interval rule and the p rule are the same test
        low, high = ours["interval"]
        assert ours["equivalent"] == (-margin < low and high < margin)
        assert ours["mean"] == pytest.approx(d.mean()) and ours["n"] == n
        verdicts.add(ours["verdict"])
    assert {"equivalent", "undecided"} <= verdicts or n == 3  # both sides of the margin were exercised
    assert verdicts & {"superior", "inferior"}


def test_the_verdict_names_the_strongest_claim_in_order():
    # better by less than the margin: superior and equivalent both hold; superior is named
    d = np.array([0.001, 0.0012, 0.0011, 0.0009, 0.001, 0.0011])
    v = equivalence.equivalence_verdict(d, 0.005)
    assert v["superior"] and v["equivalent"] and v["non_inferior"] and v["verdict"] == "superior"
    # the same differences on a lower-is-better metric: inferior, still within the margin
    v = equivalence.equivalence_verdict(d, 0.005, higher_is_better=False)
    assert v["inferior"] and v["equivalent"] and v["verdict"] == "inferior"
    # somewhat better, too noisy for equivalence, clearly not worse by the margin: non-inferior
    v = equivalence.equivalence_verdict([0.004, 0.012, 0.0, 0.009, 0.002], 0.005)
    assert v["verdict"] == "non-inferior" and not v["equivalent"] and v["p_non_inferiority"] < ALPHA
    # three noisy seeds: nothing established
    v = equivalence.equivalence_verdict([0.02, -0.015, 0.004], 0.005)
    assert v["verdict"] == "undecided"


def test_degenerate_inputs():
    one = equivalence.equivalence_verdict([0.01], 0.005)
    assert one["verdict"] == "undecided" and math.isnan(one["p_equivalence"]) and math.isnan(one["interval"][0])
    # s.d. 0: no t-test (d̄ / 0 would claim anything at p = 0; before, 4 equal seeds read superior and
    # equivalent, and 4 zeros equivalent at TOST p = 0)
    for value in (0.001, 0.0, 0.0025):
        same = equivalence.equivalence_verdict([value] * 4, 0.005)
        assert same["untested"] == "no spread" and same["verdict"] == "undecided" and same["sd"] == 0
        assert not (same["superior"] or same["inferior"] or same["equivalent"] or same["non_inferior"])
        assert all(math.isnan(same[k]) for k in ("p_equivalence", "p_difference", "p_non_inferiority"))
        assert "s.d. 0" in equivalence.describe_equivalence(same, "a", "b", "top1")
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError):
            equivalence.equivalence_verdict([0.1, 0.2], bad)


def _holm_rejections(p, alpha):
    """Holm's procedure by its definition: step down the sorted p, rejecting while p_(i) ≤ α / (K − i)."""
    order = np.argsort(p)
    rejected = np.zeros(len(p), dtype=bool)
    for i, index in enumerate(order):
        if p[index] > alpha / (len(p) - i):
            break
        rejected[index] = True
    return rejected


def test_holm_adjusted_p_rejects_exactly_what_the_step_down_procedure_rejects():
    rng = np.random.default_rng(3)
    for _ in range(300):
        k = int(rng.integers(1, 7))
        p = rng.uniform(0, 0.1, size=k) ** rng.uniform(0.5, 2)
        adjusted = equivalence.holm_adjust(p)
        assert np.all(adjusted >= p - 1e-15) and np.all(adjusted <= 1)
        for alpha in (0.01, 0.05, 0.1):
            # ≤ and < differ only on ties with α, which random p never hit
            assert np.array_equal(adjusted <= alpha, _holm_rejections(p, alpha))
    assert equivalence.holm_adjust([0.01, math.nan, 0.04]) == pytest.approx([0.02, math.nan, 0.04], nan_ok=True)


def test_family_verdicts_read_the_adjusted_p_and_keep_the_per_comparison_one():
    rng = np.random.default_rng(5)
    verdicts = [equivalence.equivalence_verdict(rng.normal(0.0, 0.004, size=6), 0.005) for _ in range(4)]
    family = equivalence.family_verdicts(verdicts, "holm")
    for v, f in zip(verdicts, family):
        assert f["family_size"] == 4 and f["unadjusted_verdict"] == v["verdict"]
        assert f["equivalent"] == (f["p_equivalence_adjusted"] < ALPHA)
        assert f["p_equivalence_adjusted"] >= v["p_equivalence"]
        assert not f["equivalent"] or f["non_inferior"]  # equivalence implies non-inferiority after Holm too
    none = equivalence.family_verdicts(verdicts, "none")
    assert [f["verdict"] for f in none] == [v["verdict"] for v in verdicts]
    alone = equivalence.family_verdicts(verdicts[:1], "holm")[0]  # one head: Holm changes nothing
    assert alone["verdict"] == verdicts[0]["verdict"]
    assert alone["p_equivalence_adjusted"] == verdicts[0]["p_equivalence"]
    with pytest.raises(ValueError):
        equivalence.family_verdicts(verdicts, "bonferroni")


def _holm_by_definition(p):
    """Holm-adjusted p-values by their formula, p̃_(i) = max_{j ≤ i} min(1, (K − j + 1) p_(j)) over the K given."""
    order = np.argsort(p)
    out, running = np.empty(len(p)), 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[index]))
        out[index] = running
    return out


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_difference_stays_nan_and_out_of_the_holm_family(bad):
    """A diverged run's NaN ECE or loss: before, TOST p 0.5 and difference p 1.0 that entered the family
    (K = 3 below instead of 2). Now every p is nan, no claim holds, and Holm runs over the 2 others only."""
    rng = np.random.default_rng(45)
    good = [rng.normal(0.0, 0.002, size=6), rng.normal(0.001, 0.002, size=6)]
    broken = equivalence.equivalence_verdict([0.001, bad, 0.002, 0.0, 0.001, 0.003], 0.005)
    assert broken["untested"] == "not finite" and broken["verdict"] == "undecided"
    assert all(math.isnan(broken[k]) for k in ("p_lower", "p_upper", "p_equivalence", "p_non_inferiority",
                                                  "p_superiority", "p_inferiority", "p_difference"))
    assert not (broken["superior"] or broken["inferior"] or broken["equivalent"] or broken["non_inferior"])
    family = equivalence.family_verdicts([broken] + [equivalence.equivalence_verdict(d, 0.005) for d in good])
    assert [f["family_size"] for f in family] == [2, 2, 2]
    assert all(math.isnan(family[0][f"{k}_adjusted"]) for k in equivalence.FAMILY_P)
    for key in equivalence.FAMILY_P:  # the others' adjusted p: Holm over K = 2, from scipy's p-values
        margin_p = [max(stats.ttest_1samp(d, -0.005, alternative="greater").pvalue,
                        stats.ttest_1samp(d, 0.005, alternative="less").pvalue) for d in good]
        raw = {"p_difference": [stats.ttest_1samp(d, 0.0).pvalue for d in good], "p_equivalence": margin_p,
               "p_non_inferiority": [stats.ttest_1samp(d, -0.005, alternative="greater").pvalue for d in good]}[key]
        assert [f[f"{key}_adjusted"] for f in family[1:]] == pytest.approx(_holm_by_definition(raw), rel=1e-7)
    sentence = equivalence.describe_equivalence(family[0], "sparsemax", "softmax", "ece")
    assert "not a finite number" in sentence and "nan" not in sentence
    assert "Holm" not in sentence  # not in the family, so no Holm note


def test_the_sentence_says_what_the_interval_shows_when_holm_demotes():
    """Three heads, each equivalent per comparison (its 90% t-interval, by scipy, inside ±0.5 pt) but not
    all after Holm: a demoted head's sentence says its interval lies within the margin (before: "reaches past
    the margin") and gives its TOST p before and after Holm's correction, both from their formulas."""
    margin = 0.005
    centred = np.array([0.0, 0.2, -0.2, 0.1, -0.1])  # pt; TOST p 0.022, 0.032, 0.043 at the spreads below
    diffs = [(0.05 + spread * centred) / 100 for spread in (2.2, 2.5, 2.8)]
    intervals = [stats.t.interval(0.9, 4, loc=d.mean(), scale=stats.sem(d)) for d in diffs]
    assert all(-margin < low and high < margin for low, high in intervals)
    tost = [max(stats.ttest_1samp(d, -margin, alternative="greater").pvalue,
                stats.ttest_1samp(d, margin, alternative="less").pvalue) for d in diffs]
    assert max(tost) < ALPHA
    adjusted = _holm_by_definition(tost)
    family = equivalence.family_verdicts([equivalence.equivalence_verdict(d, margin) for d in diffs])
    demoted = [i for i, f in enumerate(family) if f["unadjusted_verdict"] == "equivalent" != f["verdict"]]
    assert demoted == [i for i in range(3) if adjusted[i] >= ALPHA] and demoted  # the case is exercised
    for i in demoted:
        sentence = equivalence.describe_equivalence(family[i], f"head{i}", "softmax", "top1")
        assert "reaches past" not in sentence and "lies within the margin" in sentence
        assert f"its TOST p from {tost[i]:.2g} to {adjusted[i]:.2g}, not below 5%" in sentence
        assert "Holm across 3 heads: per comparison it would read equivalent" in sentence
    # a head whose interval does reach past the margin still says so
    wide = equivalence.equivalence_verdict(np.array([0.5, -1.6, 0.9, -1.2, 0.3]) / 100, margin)
    assert "reaches past the margin" in equivalence.describe_equivalence(wide, "a", "b", "top1")


# ---- --margin ----------------------------------------------------------------------------------------
def test_parse_margins():
    assert margins.parse_margins(["top1=0.5", " ece = 1 ", "loss=0.02"]) == {"top1": 0.5, "ece": 1.0, "loss": 0.02}
    assert margins.parse_margins([]) == {} and margins.parse_margins(None) == {}
    cases = {"top-1=0.5": "did you mean 'top1'?", "acc=1": "unknown metric 'acc'", "top1": "expected METRIC=DELTA",
             "top1=": "expected METRIC=DELTA", "top1=half": "is not a number", "top1=0": "positive finite",
             "top1=-0.5": "positive finite", "top1=nan": "positive finite", "top1=inf": "positive finite"}
    for text, message in cases.items():
        with pytest.raises(UserError) as err:
            margins.parse_margins([text])
        assert message in str(err.value) and "\n" not in str(err.value), text
    with pytest.raises(UserError, match="top1 given twice"):
        margins.parse_margins(["top1=0.5", "top1=1"])


def test_every_default_margin_is_declared_in_the_metric_table():
    assert margins.default_margins() == {m: t.margin for m, t in METRIC_TABLE.items() if t.margin is not None}
    assert METRIC_TABLE["top1"].higher_is_better and not METRIC_TABLE["ece"].higher_is_better
    assert margins.margin_as_difference("top1", 0.5) == pytest.approx(0.005)
    assert margins.margin_as_difference("loss", 0.02) == 0.02


# ---- the report ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def eight_seeds(tmp_path_factory):
    """Two heads with the same accuracy over 8 seeds (the realised top-1 differs by sampling noise only)
    and a ±5 pt top-1 margin given: equivalent."""
    plan = {"softmax": ([0.85] * 8, CURVE), "sparsemax": ([0.85] * 8, CURVE)}
    variants = synthetic_variants(plan, seeds=tuple(range(8)), **SMALL)
    out = tmp_path_factory.mktemp("report")
    _, path, results = document.write_report(variants, str(out), "t", "cmd", pairs=[("sparsemax", "softmax")],
                                               margins={"top1": 5.0})
    return variants, results, open(path).read(), json.loads((out / "summary.json").read_text())


def test_a_given_margin_reaches_report_summary_json_and_plain_words(eight_seeds):
    variants, results, md, summary_json = eight_seeds
    per_seed = [a["flat"]["top1"] - b["flat"]["top1"] for a, b in zip(variants["sparsemax"], variants["softmax"])]
    low, high = stats.t.interval(0.9, 7, loc=np.mean(per_seed), scale=stats.sem(per_seed))
    assert -0.05 < low and high < 0.05  # the scipy interval lies inside ±5 pt: the verdict must say so
    top1 = summary_json["comparisons"][0]["equivalence"]["top1"]
    assert top1["verdict"] == "equivalent" and top1["equivalent"] and top1["margin"] == pytest.approx(0.05)
    assert top1["interval"] == pytest.approx([low, high], rel=1e-9)
    assert summary_json["margins"]["top1"] == {"margin": 5.0, "units": "pt", "margin_as_difference": 0.05,
                                               "source": "given"}
    assert summary_json["margins"]["ece"]["source"] == "default" and "loss" not in summary_json["margins"]
    assert summary_json["multiplicity"] == "holm" and summary_json["alpha"] == pytest.approx(ALPHA)
    ends = [f"{100 * x:+.1f}".replace("-", "\u2212") for x in (low, high)]
    sentence = f"sparsemax top-1 is within ±5 pt of softmax (90% CI [{ends[0]}, {ends[1]}] over 8 seeds"
    assert top1["sentence"].startswith(sentence)
    assert "top-1 ±5 pt (given)" in md and "ECE ±1 pt (the default)" in md and "Holm's step-down" in md
    assert "| sparsemax − softmax | top-1 | ±5 pt | 8 |" in md and f"- {top1['sentence']}" in md
    lines = plain_words.plain_words(variants, results, document.mean_curves(variants))
    margin_line = next(line for line in lines if line.startswith("top-1 against a ±5 pt margin (TOST at 5%)"))
    assert sentence in margin_line and summary_json["plain_words"] == lines
    assert md.index("## What this comparison found") < md.index(margin_line) < md.index("## Equivalence")


def test_default_margins_and_holm_on_the_quickstart_like_comparison(tmp_path):
    variants = synthetic_variants(QUICKSTART_LIKE)
    pairs = [("sparsemax", "softmax"), ("entmax15", "softmax")]
    _, path, results = document.write_report(variants, str(tmp_path), "t", "cmd", pairs=pairs)
    md = open(path).read()
    assert "top-1 ±0.5 pt (the default)" in md and "no margin for FY loss" in md
    for res in results:
        top1 = res["equivalence"]["top1"]
        ref = _scipy_reference(res["across"]["top1"]["per_seed"], 0.005, ALPHA, True)
        assert top1["p_equivalence"] == pytest.approx(ref["p_equivalence"], rel=1e-7)
        assert top1["family_size"] == 2 and top1["multiplicity"] == "holm"
        # 3 noisy seeds of a +2-3 pt difference: neither equivalent within ±0.5 pt nor resolved
        assert top1["verdict"] == "undecided" and "undecided at the ±0.5 pt margin" in top1["sentence"]
        assert "loss" not in res["equivalence"]
    summary_json = json.loads((tmp_path / "summary.json").read_text())
    assert [c["variant"] for c in summary_json["comparisons"]] == ["sparsemax", "entmax15"]
    per_comparison, _ = document.paired_results(variants, pairs, multiplicity="none")
    assert all(r["equivalence"]["top1"]["verdict"] == r["equivalence"]["top1"]["unadjusted_verdict"]
               for r in per_comparison)
    none_md = "\n".join(document.equivalence_section(per_comparison))
    assert "Error rate: per comparison" in none_md


def test_a_head_at_chance_gets_no_equivalence_verdict():
    plan = {"softmax": ([0.90, 0.91, 0.92], CURVE), "sparsemax": ([0.105, 0.10, 0.095], CURVE)}
    results, _ = document.paired_results(synthetic_variants(plan, **SMALL), [("sparsemax", "softmax")])
    assert results[0]["equivalence"] == {} and document.equivalence_section(results) == []
