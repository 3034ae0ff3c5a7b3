"""The plain-words summary (evaluation/summary.py) is derived from the comparison's numbers: fed
synthetic comparisons (a clear win, no difference, too few seeds), it says what the verdicts and
the table say, quoting the table's own cells."""
from evaluation import comparison, summary
from synthetic_comparison import synthetic_variants

CURVE = [(1, 0.5), (2, 0.8)]
SMALL = dict(n_val=300, n_cal=200, n_ood=50)


def _found(plan, seeds=(0, 1, 2)):
    variants = synthetic_variants(plan, seeds=seeds, **SMALL)
    results, _ = comparison.paired_results(variants, [(v, "softmax") for v in variants if v != "softmax"])
    lines = summary.plain_words(variants, results, comparison.mean_curves(variants))
    return variants, results, lines


def _table_cells(variants):
    header, rows = comparison.summary_table(variants)
    return {(row[0], name): cell for row in rows for name, cell in zip(header[1:], row[1:])}


def _agrees_with_the_table(variants, lines):
    cells = _table_cells(variants)
    text = "\n".join(lines)
    for name in variants:
        assert f"{name} {cells[(comparison.ECE_MEAN_LABEL, name)]}" in text  # the table's ECE cell, as shown
    for name in ("sparsemax",):
        assert f"keeps {cells[('support size mean', name)]}" in text
        assert f"{name} {cells[('support ε=0.1 mean set size', name)]} (coverage" in text
    assert f"softmax + LAC {cells[('lac ε=0.1 mean set size', 'softmax')]}" in text


def test_a_clear_win_is_called_a_win():
    variants, results, lines = _found({"softmax": ([0.70, 0.71, 0.69], CURVE),
                                       "sparsemax": ([0.93, 0.94, 0.92], CURVE)})
    top1 = lines[0]
    assert results[0]["across"]["top1"]["significant"] and "significant at 5%" in results[0]["verdict"]
    assert top1.startswith("top-1: better than softmax across 3 trainings: sparsemax +")
    assert "distinguishable" not in top1
    _agrees_with_the_table(variants, lines)


def test_no_difference_says_so_and_what_would_settle_it():
    variants, results, lines = _found({"softmax": ([0.85, 0.86, 0.84], CURVE),
                                       "sparsemax": ([0.85, 0.86, 0.84], CURVE)})
    r = results[0]["across"]["top1"]
    assert not r["significant"] and "not significant" in results[0]["verdict"]
    assert lines[0].startswith("top-1: no head distinguishable from softmax at this budget of 2 epochs (3 seeds)")
    settle = next(line for line in lines if line.startswith("to settle it:"))
    from evaluation.statistics import mdd_range_text, seeds_range_text

    assert f"sparsemax {mdd_range_text(r)}" in settle and f"sparsemax {seeds_range_text(r)}" in settle
    assert mdd_range_text(r) in results[0]["verdict"] and seeds_range_text(r) in results[0]["verdict"]  # as the verdict
    assert "a longer run" in settle and "tuning" in settle
    _agrees_with_the_table(variants, lines)


def test_one_seed_is_too_few_to_tell():
    variants, results, lines = _found({"softmax": ([0.70], CURVE), "sparsemax": ([0.93], CURVE)}, seeds=(0,))
    assert lines[0].startswith("top-1: too few seeds to tell (sparsemax vs softmax: 1 seed")
    assert "better" not in lines[0] and "at least 3 seeds" in lines[-1]
    assert "across trainings" not in next(line for line in lines if line.startswith("calibration"))


def test_a_per_seed_difference_of_exactly_zero_is_named():
    r = {"difference": 0.01, "t_low": -0.02, "t_high": 0.04, "per_seed": [0.0, 0.02, 0.01], "n_seeds": 3}
    assert summary._zero_note(r) == " (in 1 of 3 seeds the difference is exactly 0)"


def test_no_pairs_still_describes_the_heads():
    variants = synthetic_variants({"sparsemax": ([0.9], CURVE)}, seeds=(0,), **SMALL)
    lines = summary.plain_words(variants, [], comparison.mean_curves(variants))
    assert lines[0].startswith("prediction sets") and "against" not in lines[0] and lines[1].startswith("sparsity:")


def test_the_report_opens_with_the_summary_and_shows_the_learned_alpha(tmp_path):
    variants = synthetic_variants({"softmax": ([0.80, 0.82], CURVE), "entmax_bisect": ([0.81, 0.80], CURVE)},
                                  seeds=(0, 1), **SMALL)
    for run in variants["softmax"]:
        run["flat"]["alpha"] = 1.0  # as eval.json gives softmax: not a learned α, so not in that row
    for run, alpha in zip(variants["entmax_bisect"], (1.5644, 1.5712)):  # as eval.json gives a learned α
        run["result"].update(learn_alpha=True, alpha=alpha)
        run["flat"]["alpha"] = alpha
    _, path, results = comparison.write_report(variants, str(tmp_path), "t", "cmd",
                                               pairs=[("entmax_bisect", "softmax")])
    md = open(path).read()
    lines = summary.plain_words(variants, results, comparison.mean_curves(variants))
    assert md.index("## What this comparison found") < md.index("Command:") < md.index("| metric |")
    assert all(f"- {line}\n" in md for line in lines)
    assert "| α (learned) | n/a | 1.5678 ± 0.0048 |" in md  # mean ± s.d. over seeds
    assert "entmax_bisect-s0` (learned α 1.5644)" in md and "entmax_bisect-s1` (learned α 1.5712)" in md
