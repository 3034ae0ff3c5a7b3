"""The tuning section of compare_heads --tune's report (comparison/report/tuning_section.py) on plain data:
both arms' paired results made by comparison/report/document.py from synthetic runs (tests/synthetic_comparison.py:
no training) and a hand-made tuning summary (comparison/tuning_summary.py's shape). The real --tune
run that writes one: tests/test_tune.py."""
import re
import statistics

import pytest

from comparison.analysis.margins import METRIC_TABLE
from comparison.analysis.statistics import signed_points
from comparison.report import document, tuning_section
from comparison.tuning import shown_settings
from synthetic_comparison import synthetic_variants

MINUS = "\u2212"
PAIRS = [("sparsemax", "softmax")]
CURVE = [(1, 0.5), (2, 0.6)]
# untuned: sparsemax clearly ahead of softmax on every seed; tuned: the two level
UNTUNED = {"softmax": ([0.80, 0.82, 0.79], CURVE), "sparsemax": ([0.90, 0.91, 0.92], CURVE)}
TUNED = {"softmax": ([0.90, 0.91, 0.89], CURVE), "sparsemax": ([0.90, 0.90, 0.91], CURVE)}
SIZES = {"n_val": 300, "n_cal": 100, "n_ood": 50}
TUNE_SPLIT = {"images": 24, "fraction": 0.1}


def _variant(complete, importance):
    """One study of comparison/tuning_summary.py's shape: `complete` trials with long floats as settings."""
    trials = [{"number": i, "state": "COMPLETE", "value": 0.5 + 0.01 * i, "epochs": 2, "diverged": False,
               "run_dir": None, "retry_of": None, "note": None,
               "params": {"optim.lr": 0.0123456789 * (i + 1), "optim.weight_decay": 0.000987654321}}
              for i in range(complete)]
    best = trials[-1]
    config = {"optim.lr": 0.01, "optim.weight_decay": 0.05}
    return {"trials": trials, "budget_epochs": 2, "importance": importance,
            "best": {"number": best["number"], "value": best["value"], "params": best["params"],
                     "text": shown_settings(best["params"])},
            "config_settings": {"params": config, "text": shown_settings(config)}}


@pytest.fixture(scope="module")
def section(tmp_path_factory):
    """(markdown, untuned variants, tuned variants, untuned results, tuned results, report folder)."""
    untuned = synthetic_variants(UNTUNED, **SIZES)
    tuned = synthetic_variants(TUNED, **SIZES)
    untuned_res, tuned_res = (document.paired_results(v, PAIRS)[0] for v in (untuned, tuned))
    few, enough = tuning_section.MIN_TRIALS_FOR_IMPORTANCE - 1, tuning_section.MIN_TRIALS_FOR_IMPORTANCE
    summary = {"timing": None, "tune_split": TUNE_SPLIT,
               "variants": {"softmax": _variant(few, {"optim.lr": 0.7, "optim.weight_decay": 0.3}),
                            "sparsemax": _variant(enough, {"optim.lr": 0.6, "optim.weight_decay": 0.4}),
                            "entmax15": _variant(2, None)}}
    out = tmp_path_factory.mktemp("tuned")
    lines = tuning_section.tuning_section(summary, tuned_res, untuned_res, str(out), "untuned/report.md", "median")
    return "\n".join(lines), untuned, tuned, untuned_res, tuned_res, out


def side_by_side_rows(markdown, metric):
    """{head: [untuned, tuned, tuned − untuned] as numbers} of the tuning section's table of `metric`."""
    heading = f"#### {METRIC_TABLE[metric].label} ("
    block = markdown.split("\n" + heading, 1)[1].split("\n\n", 2)[1]  # the heading line, then the table
    rows = {}
    for line in block.splitlines()[2:]:  # past the header and the rule
        head, *cells = [c.strip() for c in line.strip("|").split("|")]
        rows[head] = [float(c.rstrip("%pt ").replace(MINUS, "-")) for c in cells]
    return rows


def _mean_over_seeds(runs, metric):
    return statistics.fmean(run["flat"][metric] for run in runs)


@pytest.mark.parametrize("metric", list(METRIC_TABLE))
def test_one_table_per_metric_holds_each_arms_own_values_side_by_side(section, metric):
    """Each head's untuned and tuned cells are its own runs' eval.py values (mean over the seeds),
    in the units of the differences (% for top-1 and ECE), and the last cell their difference."""
    markdown, untuned, tuned = section[:3]
    rows = side_by_side_rows(markdown, metric)
    assert sorted(rows) == sorted(UNTUNED)
    scale, digits = (100, 0.005) if METRIC_TABLE[metric].in_points else (1, 5e-5)
    for head, (before, after, difference) in rows.items():
        expected = [scale * _mean_over_seeds(arm[head], metric) for arm in (untuned, tuned)]
        assert [before, after] == pytest.approx(expected, abs=digits + 1e-6)
        assert difference == pytest.approx(expected[1] - expected[0], abs=10 * digits)


def test_one_short_line_per_verdict_with_what_changed_and_both_intervals(section):
    markdown, _, _, untuned_res, tuned_res, _ = section
    before, after = untuned_res[0]["across"]["top1"], tuned_res[0]["across"]["top1"]
    assert before["significant"] and before["difference"] > 0 and not after["significant"]  # the inputs' premise
    line = next(line for line in markdown.splitlines() if line.startswith("- sparsemax − softmax: "))
    assert line.startswith("- sparsemax − softmax: CHANGED: better → within training noise; ")
    shown = {arm: f"{signed_points(e['difference'])} pt [{signed_points(e['t_low'])}, {signed_points(e['t_high'])}]"
             for arm, e in (("untuned", before), ("tuned", after))}
    assert line.endswith(f"; untuned {shown['untuned']}, tuned {shown['tuned']}")
    assert len(line) < 140 and "Tuning changed 1 of 1 verdict(s)" in markdown
    assert tuning_section.verdict_lines(tuned_res, tuned_res) == [
        f"- sparsemax − softmax: same: within training noise; untuned {shown['tuned']}, "
        f"tuned {shown['tuned']}"]


def test_the_tune_splits_size_and_settings_to_four_significant_digits(section):
    markdown = section[0]
    assert f"{TUNE_SPLIT['images']} images (data.tune_fraction={TUNE_SPLIT['fraction']:g} of train" in markdown
    shown = re.findall(r"optim\.\w+=([0-9.e+-]+)", markdown)  # significant digits: past leading zeros, no point
    assert shown and all(len(re.sub(r"e.*|\.|^0\.0*", "", s).lstrip("0")) <= 4 for s in shown)
    assert "optim.lr=0.1235" in markdown and "optim.weight_decay=0.0009877" in markdown  # the sparsemax best
    assert "optim.lr=0.01, optim.weight_decay=0.05" in markdown  # the config's, beside them


def test_an_importance_plot_from_few_complete_trials_has_a_caveat(section):
    markdown, out = section[0], section[5]
    few = tuning_section.MIN_TRIALS_FOR_IMPORTANCE - 1
    assert f"- softmax: caveat: this importance plot is fitted to {few} complete trials" in markdown
    assert "- sparsemax: caveat" not in markdown and "- entmax15: no importance plot" in markdown
    assert {p.name for p in out.iterdir()} == {"tuning_softmax_history.png", "tuning_softmax_importance.png",
                                               "tuning_sparsemax_history.png", "tuning_sparsemax_importance.png",
                                               "tuning_entmax15_history.png"}
