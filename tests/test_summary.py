"""The plain-words summary (comparison/report/plain_words.py) is derived from the comparison's numbers: fed
synthetic comparisons (a clear win, no difference, too few seeds), it says what the verdicts and
the table say, quoting the table's own cells. Its first line, the bottom line, is checked against the
verdicts it is built from: each kind of verdict (better, worse, equivalent, non-inferior, not
distinguishable, one seed, a head at chance, Holm undoing a per-comparison win), one head, a tuned
comparison and the until-settled design's verdicts."""
import functools
from unittest import mock

import numpy as np
import pytest

from comparison import settle
from comparison.analysis import paired
from comparison.analysis.margins import margin_as_difference
from comparison.analysis.sequential import Design, sequential_decision
from comparison.analysis.statistics import signed_points
from comparison.report import document, plain_words
from synthetic_comparison import synthetic_variants

CURVE = [(1, 0.5), (2, 0.8)]
SMALL = dict(n_val=300, n_cal=200, n_ood=50)
N_EXACT = 400  # examples per run where the per-seed top-1 is set exactly (steps of 0.25 pt)


def _found(plan, seeds=(0, 1, 2)):
    variants = synthetic_variants(plan, seeds=seeds, **SMALL)
    results, _ = document.paired_results(variants, [(v, "softmax") for v in variants if v != "softmax"])
    lines = plain_words.plain_words(variants, results, document.mean_curves(variants))
    return variants, results, lines


def _line(lines, start):
    return next(line for line in lines if line.startswith(start))


def _exact(correct, margins=None):
    """A comparison whose per-seed top-1 is exactly correct[head][seed] / N_EXACT (the runs' records are
    replaced; their table cells, support sizes included, stay the synthetic runs'), every head against
    softmax. -> (variants, paired results, plain-words lines)."""
    variants = synthetic_variants({h: ([0.8] * len(c), CURVE) for h, c in correct.items()},
                                  seeds=tuple(range(len(correct["softmax"]))), **SMALL)
    label = np.arange(N_EXACT) % 10
    for head, counts in correct.items():
        for run, k in zip(variants[head], counts):
            right = np.arange(N_EXACT) < k
            run["records"] = {"label": label, "pred": np.where(right, label, (label + 1) % 10),
                              "max_prob": np.full(N_EXACT, 0.5), "loss": np.ones(N_EXACT)}
    fewer = functools.partial(paired.compare_pair, n_boot=100)  # the verdicts read t-intervals, not the bootstrap
    with mock.patch.object(paired, "compare_pair", fewer):
        results, _ = document.paired_results(variants, [(v, "softmax") for v in correct if v != "softmax"], margins)
    return variants, results, plain_words.plain_words(variants, results, document.mean_curves(variants))


def _keeps(variants, head):
    """A sparse head's mean support size over its seeds (the table row's mean), to two figures."""
    sizes = [run["flat"]["support_mean"] for run in variants[head]]
    return f"{sum(sizes) / len(sizes):.2g}"


def _verdict(results, head):
    return next(res["equivalence"]["top1"] for res in results if res["variant"] == head)


def _table_cells(variants):
    header, rows = document.summary_table(variants)
    return {(row[0], name): cell for row in rows for name, cell in zip(header[1:], row[1:])}


def _agrees_with_the_table(variants, lines):
    cells = _table_cells(variants)
    text = "\n".join(lines)
    for name in variants:
        assert f"{name} {cells[(document.ECE_MEAN_LABEL, name)]}" in text  # the table's ECE cell, as shown
    for name in ("sparsemax",):
        assert f"keeps {cells[('support size mean', name)]}" in text
        assert f"{name} {cells[('support ε=0.1 mean set size', name)]} (coverage" in text
    assert f"softmax + LAC {cells[('lac ε=0.1 mean set size', 'softmax')]}" in text


def test_a_clear_win_is_called_a_win():
    variants, results, lines = _found({"softmax": ([0.70, 0.71, 0.69], CURVE),
                                       "sparsemax": ([0.93, 0.94, 0.92], CURVE)})
    top1 = lines[1]
    assert results[0]["across"]["top1"]["significant"] and "significant at 5%" in results[0]["verdict"]
    assert top1.startswith("top-1: better than softmax across 3 trainings: sparsemax +")
    assert "distinguishable" not in top1
    _agrees_with_the_table(variants, lines)


def test_no_difference_says_so_and_what_would_settle_it():
    variants, results, lines = _found({"softmax": ([0.85, 0.86, 0.84], CURVE),
                                       "sparsemax": ([0.85, 0.86, 0.84], CURVE)})
    r = results[0]["across"]["top1"]
    assert not r["significant"] and "not significant" in results[0]["verdict"]
    assert lines[1].startswith("top-1: no head distinguishable from softmax at this budget of 2 epochs (3 seeds)")
    settle = next(line for line in lines if line.startswith("to settle it:"))
    from comparison.analysis.statistics import mdd_range_text, seeds_range_text

    assert f"sparsemax {mdd_range_text(r)}" in settle and f"sparsemax {seeds_range_text(r)}" in settle
    assert mdd_range_text(r) in results[0]["verdict"] and seeds_range_text(r) in results[0]["verdict"]  # as the verdict
    assert "a longer run" in settle and "tuning" in settle
    _agrees_with_the_table(variants, lines)


def test_one_seed_is_too_few_to_tell():
    variants, results, lines = _found({"softmax": ([0.70], CURVE), "sparsemax": ([0.93], CURVE)}, seeds=(0,))
    assert lines[1].startswith("top-1: too few seeds to tell (sparsemax vs softmax: 1 seed")
    assert "better" not in lines[1] and "at least 3 seeds" in lines[-1]
    assert results[0]["equivalence"]["top1"]["verdict"] == "undecided"  # one seed: no verdict either way
    assert lines[0].startswith("On this data, sparsemax cannot be told apart from softmax with 1 seed")
    assert "accurate" not in lines[0]
    assert "across trainings" not in next(line for line in lines if line.startswith("calibration"))


def test_a_per_seed_difference_of_exactly_zero_is_named():
    r = {"difference": 0.01, "t_low": -0.02, "t_high": 0.04, "per_seed": [0.0, 0.02, 0.01], "n_seeds": 3}
    assert plain_words._zero_note(r) == " (in 1 of 3 seeds the difference is exactly 0)"


def test_no_pairs_still_describes_the_heads():
    variants = synthetic_variants({"sparsemax": ([0.9], CURVE)}, seeds=(0,), **SMALL)
    lines = plain_words.plain_words(variants, [], document.mean_curves(variants))
    assert lines[1].startswith("prediction sets") and "against" not in lines[1] and lines[2].startswith("sparsity:")
    assert lines[0] == (f"On this data, sparsemax is the only head, so there is nothing to compare it with; "
                        f"it keeps {_keeps(variants, 'sparsemax')} of 10 classes on average.")


def test_the_report_opens_with_the_summary_and_shows_the_learned_alpha(tmp_path):
    variants = synthetic_variants({"softmax": ([0.80, 0.82], CURVE), "entmax_bisect": ([0.81, 0.80], CURVE)},
                                  seeds=(0, 1), **SMALL)
    for run in variants["softmax"]:
        run["flat"]["alpha"] = 1.0  # as eval.json gives softmax: not a learned α, so not in that row
    for run, alpha in zip(variants["entmax_bisect"], (1.5644, 1.5712)):  # as eval.json gives a learned α
        run["result"].update(learn_alpha=True, alpha=alpha)
        run["flat"]["alpha"] = alpha
    _, path, results = document.write_report(variants, str(tmp_path), "t", "cmd",
                                               pairs=[("entmax_bisect", "softmax")])
    md = open(path).read()
    lines = plain_words.plain_words(variants, results, document.mean_curves(variants))
    assert md.index("## What this comparison found") < md.index("Command:") < md.index("| metric |")
    assert all(f"- {line}\n" in md for line in lines)
    assert "| α (learned) | n/a | 1.5678 ± 0.0048 |" in md  # mean ± s.d. over seeds
    assert "entmax_bisect-s0` (learned α 1.5644)" in md and "entmax_bisect-s1` (learned α 1.5712)" in md


# ---- the bottom line: the first line, against the verdicts it is built from ------------------------------
def test_a_better_head_is_called_more_accurate_with_its_difference():
    variants, results, lines = _exact({"softmax": [320, 320, 320], "sparsemax": [340, 344, 348]})
    v, r = _verdict(results, "sparsemax"), results[0]["across"]["top1"]
    assert v["verdict"] == "superior" and not v["equivalent"]
    assert lines[0] == (f"On this data, sparsemax is more accurate than softmax ({signed_points(r['difference'])} "
                        f"pt) and keeps {_keeps(variants, 'sparsemax')} of 10 classes on average.")
    assert lines[1].startswith("top-1: better than softmax across 3 trainings: sparsemax +6.0 pt")  # the same call


def test_a_worse_head_is_called_less_accurate_and_none_was_better():
    variants, results, lines = _exact({"softmax": [320, 320, 320], "sparsemax": [300, 296, 304],
                                       "entmax15": [321, 319, 320]}, margins={"top1": 1})
    assert [_verdict(results, h)["verdict"] for h in ("sparsemax", "entmax15")] == ["inferior", "equivalent"]
    r = results[0]["across"]["top1"]
    assert lines[0] == (f"On this data, sparsemax is less accurate than softmax ({signed_points(r['difference'])} "
                        f"pt) and keeps {_keeps(variants, 'sparsemax')} of 10 classes on average; entmax15 is as "
                        f"accurate as softmax within ±1 pt and keeps {_keeps(variants, 'entmax15')}; no head was "
                        f"more accurate than softmax.")
    assert "worse than softmax across 3 trainings: sparsemax" in lines[1]


def test_equivalent_heads_are_as_accurate_within_the_margin():
    variants, results, lines = _exact({"softmax": [320, 320, 320], "sparsemax": [321, 319, 320],
                                       "entmax15": [320, 321, 319]}, margins={"top1": 1})
    assert {_verdict(results, h)["verdict"] for h in ("sparsemax", "entmax15")} == {"equivalent"}
    assert lines[0] == (f"On this data, sparsemax is as accurate as softmax within ±1 pt and keeps "
                        f"{_keeps(variants, 'sparsemax')} of 10 classes on average; so is entmax15, which keeps "
                        f"{_keeps(variants, 'entmax15')}; no head was more accurate than softmax.")
    assert "sparsemax top-1 is within ±1 pt of softmax" in _line(lines, "top-1 against a ±1 pt margin")


def test_a_non_inferior_head_is_at_most_the_margin_less_accurate():
    _, results, lines = _exact({"softmax": [320, 320, 320], "sparsemax": [320, 321, 323]})
    v = _verdict(results, "sparsemax")
    assert v["verdict"] == "non-inferior" and v["margin_source"] == "default" and v["margin"] == pytest.approx(0.005)
    assert lines[0].startswith("On this data, sparsemax is at most 0.5 pt less accurate than softmax and keeps")
    assert "no head" not in lines[0]  # one head: nothing to add


def test_no_verdict_either_way_is_not_distinguishable_with_the_seeds_at_hand():
    _, results, lines = _exact({"softmax": [320, 320, 320], "sparsemax": [308, 324, 336]})
    r = results[0]["across"]["top1"]
    assert _verdict(results, "sparsemax")["verdict"] == "undecided" and not r["significant"]
    assert lines[0].startswith(f"On this data, sparsemax is not distinguishable from softmax in accuracy with "
                               f"{r['n_seeds']} seeds and keeps")
    assert "as accurate" not in lines[0] and "more accurate" not in lines[0]


def test_without_a_top1_margin_the_t_interval_decides():
    variants, results, _ = _exact({"softmax": [320, 320, 320], "sparsemax": [321, 319, 320]})
    for res in results:
        del res["equivalence"]["top1"]  # as results without a top-1 margin would be
    line = plain_words.bottom_line(variants, results)
    assert not results[0]["across"]["top1"]["significant"]
    assert line.startswith("On this data, sparsemax is not distinguishable from softmax in accuracy with 3 seeds")


def test_a_win_that_holm_undoes_is_not_called_a_win():
    variants, results, lines = _exact({"softmax": [320, 320, 320], "sparsemax": [328, 332, 336],
                                       "entmax15": [328, 332, 336]})
    v, r = _verdict(results, "sparsemax"), results[0]["across"]["top1"]
    assert r["significant"] and v["unadjusted_verdict"] == "superior" and v["verdict"] == "non-inferior"
    assert lines[0].startswith(f"On this data, sparsemax is at most 0.5 pt less accurate than softmax (alone, its "
                               f"{signed_points(r['difference'])} pt would count as more accurate; not once all 2 "
                               f"heads are counted) and keeps")
    assert "no head was" not in lines[0]  # the top-1 line below calls it better per comparison
    assert "better than softmax across 3 trainings" in lines[1]


def test_a_head_at_chance_is_not_compared():
    _, results, lines = _exact({"softmax": [320, 320, 320], "sparsemax": [40, 40, 40]})
    assert results[0]["learned"]["sparsemax"]["nothing_learned"] and results[0]["equivalence"] == {}  # no verdict
    assert lines[0].startswith("On this data, sparsemax is not compared with softmax (sparsemax learned nothing)")
    assert "no comparison for sparsemax vs softmax" in lines[1]


def test_a_tuned_comparison_says_each_head_ran_its_tuned_settings():
    variants, results, _ = _exact({"softmax": [320, 320, 320], "sparsemax": [340, 344, 348]})
    untuned = plain_words.bottom_line(variants, results)
    token = plain_words.TUNED.set({"settings": ["optim.lr"], "complete": {"softmax": 5, "sparsemax": 5}})
    try:
        tuned = plain_words.bottom_line(variants, results)
    finally:
        plain_words.TUNED.reset(token)
    assert tuned == untuned.replace("On this data, ", "On this data, with each head's tuned settings, ")


def test_the_until_settled_design_gives_the_verdicts():
    """The design's verdicts, not the fixed-seed ones: each state (settled, last look, not settled, no look)."""
    variants, results, _ = _exact({"softmax": [320] * 3, "sparsemax": [320] * 3, "entmax15": [320] * 3})
    design = Design(margin=margin_as_difference("top1", 0.5), looks=(3, 5), method="bonferroni-t")
    differences = {"sparsemax": [-0.03, -0.031, -0.029], "entmax15": [0.01, -0.03, 0.02, -0.01, 0.03]}
    doc = {"metric": "top1", "margin": 0.5, "comparisons": [
        settle.outcome(head, "softmax", sequential_decision(d, design), design, "top1", cap=5)
        for head, d in differences.items()]}
    assert [(c["state"], c["verdict"]) for c in doc["comparisons"]] == [("settled", "inferior"),
                                                                       ("last look", "undecided")]
    with plain_words.sequential_verdicts(doc):
        line = plain_words.plain_words(variants, results, document.mean_curves(variants))[0]
    assert plain_words.SEQUENTIAL.get() is None
    assert line == (f"On this data, by the until-settled design on top-1, sparsemax is less accurate than softmax "
                    f"(settled at 3 seeds) and keeps {_keeps(variants, 'sparsemax')} of 10 classes on average; "
                    f"entmax15 is not distinguishable from softmax in accuracy with 5 seeds (the design's last look) "
                    f"and keeps {_keeps(variants, 'entmax15')}; no head was more accurate than softmax.")
    waiting = {"metric": "top1", "margin": 0.5, "comparisons": [
        settle.outcome("sparsemax", "softmax", sequential_decision([0.01, -0.03, 0.02], design), design, "top1",
                       cap=5),
        settle.outcome("entmax15", "softmax", sequential_decision([0.01], design), design, "top1", cap=5)]}
    assert [c["state"] for c in waiting["comparisons"]] == ["continues", "no look"]
    with plain_words.sequential_verdicts(waiting):
        line = plain_words.bottom_line(variants, results)
    assert "sparsemax is not settled against softmax yet after 3 seeds" in line
    assert "entmax15 has too few seeds yet (1) for the design's first look against softmax" in line
    assert "no head was" not in line and "accurate" not in line


def test_a_design_on_ece_speaks_of_calibration():
    variants, results, _ = _exact({"softmax": [320] * 3, "sparsemax": [320] * 3})
    design = Design(margin=margin_as_difference("ece", 1.0), looks=(3, 5), higher_is_better=False,
                    method="bonferroni-t")
    entry = settle.outcome("sparsemax", "softmax", sequential_decision([-0.03, -0.031, -0.029], design), design,
                           "ece", cap=5)
    assert (entry["state"], entry["verdict"]) == ("settled", "superior")  # lower ECE is better
    with plain_words.sequential_verdicts({"metric": "ece", "margin": 1.0, "comparisons": [entry]}):
        line = plain_words.bottom_line(variants, results)
    assert line.startswith("On this data, by the until-settled design on ECE, sparsemax is better calibrated than "
                           "softmax (settled at 3 seeds) and keeps")
