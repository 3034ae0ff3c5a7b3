"""The comparison report's verdicts and sanity lines (comparison/report/document.py) and its plots
(comparison/report/plots.py), on synthetic comparisons (tests/synthetic_comparison.py: no training)."""
import os

import matplotlib
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from comparison.analysis import sanity, statistics
from comparison.report import document, ood_section, plots
from synthetic_comparison import QUICKSTART_LIKE, synthetic_variants

MINUS = "\u2212"
PAIRS = [("sparsemax", "softmax"), ("entmax15", "softmax")]


@pytest.fixture(scope="module")
def quickstart_like(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    variants = synthetic_variants(QUICKSTART_LIKE)
    _, path, results = document.write_report(variants, str(out), "t", "cmd", pairs=PAIRS)
    return variants, open(path).read(), results, out


def test_one_verdict_per_head_across_trainings_with_the_details_in_tables(quickstart_like):
    variants, md, results, _ = quickstart_like
    verdicts, checks = document.verdict_lines(variants, results)
    assert len(verdicts) == len(PAIRS)
    for (variant, baseline), res, verdict in zip(PAIRS, results, verdicts):
        top1 = res["across"]["top1"]
        assert verdict == res["verdict"] and f"- {verdict}" in md
        assert verdict.startswith(f"{variant} {MINUS} {baseline} top-1 across 3 trainings: ")
        # 3 seeds of +2-3 pt with a 1-2 pt seed s.d.: not resolvable, with the seeds it would take
        assert not top1["significant"] and top1["t_low"] < 0 < top1["t_high"]
        assert "not resolvable with 3 seeds" in verdict and "plan seeds from a pilot" in verdict
        assert f"MDD {statistics.two_figures(100 * top1['mdd_low'])}–" in verdict
        per_seed = [a["flat"]["top1"] - b["flat"]["top1"] for a, b in zip(variants[variant], variants[baseline])]
        assert top1["per_seed"] == pytest.approx(per_seed, abs=1e-9)
    assert md.index("## Verdicts") < md.index("### (a) Across trainings") < md.index("### (b) Given these trainings")
    assert "| sparsemax − softmax | top-1 |" in md and "95% t-interval over seeds" in md
    assert "95% CI given these trainings" in md and "McNemar exact p" in md
    for res in results:  # the conditional sentences stay, under (b)
        for sentence in res["sentences"]:
            assert f"- {sentence}" in md


def test_budget_guard_says_the_verdict_is_about_a_fixed_budget(quickstart_like):
    variants, md, results, _ = quickstart_like
    _, checks = document.verdict_lines(variants, results)
    budget = next(c for c in checks if c.startswith("Budget:"))
    assert "still rising" in budget and "fixed budget (2 epochs), not at convergence" in budget
    for head in QUICKSTART_LIKE:
        assert f"{head} (+" in budget
    assert f"- {budget}" in md and f"]({plots.PLOT_FILES['accuracy']})" in md
    flat = {h: (acc, [(1, 0.5), (2, 0.9), (3, 0.9), (4, 0.9)]) for h, (acc, _) in QUICKSTART_LIKE.items()}
    flat_variants = synthetic_variants(flat)
    for runs in flat_variants.values():  # the last evaluation is the run's top-1: level it with epoch 3
        for run in runs:
            run["curve"][2] = (3, run["curve"][3][1])
    flat_line = document.budget_lines(flat_variants)[0]
    assert flat_line.startswith("Budget: no rise beyond noise between the last epochs for any head")
    assert "artefact" not in flat_line and "artefact" not in budget


def test_chance_level_head_gets_no_comparison():
    plan = {"softmax": ([0.90, 0.91, 0.92], [(1, 0.8), (2, 0.9)]),
            "sparsemax": ([0.105, 0.10, 0.095], [(1, 0.1), (2, 0.1)])}
    variants = synthetic_variants(plan)
    results, _ = document.paired_results(variants, [("sparsemax", "softmax")])
    assert results[0]["verdict"].startswith("sparsemax vs softmax: no comparison: nothing learned (sparsemax within")
    assert f"- {results[0]['verdict']}" in "\n".join(document.verdict_section([results[0]["verdict"]], []))
    _, checks = document.verdict_lines(variants, results)
    assert any(c.startswith("sparsemax: no comparison: nothing learned") for c in checks)
    assert not any(c.startswith("softmax:") for c in checks)


def test_coverage_below_its_band_is_flagged_and_inside_it_explained(tmp_path):
    plan = {"softmax": ([0.9, 0.9, 0.9], [(1, 0.9), (2, 0.9)])}
    shifted = synthetic_variants(plan, coverage_shift=0.08)  # calibration images easier than validation ones
    flags = [line for line in document.coverage_lines(shifted) if line.startswith("Coverage FLAG")]
    assert flags, document.coverage_lines(shifted)
    run = shifted["softmax"][0]["result"]["prediction_sets"]
    low = run["methods"]["lac"]["eps"]["0.1"]["coverage"]
    assert sanity.coverage_check(low, 400, 600, 0.1)[0] == "below band"
    assert any("lac at ε=0.1" in f and "below its 99% finite-sample band" in f for f in flags)
    fair = synthetic_variants(plan)
    lines = document.coverage_lines(fair)
    assert not any(line.startswith("Coverage FLAG") for line in lines)
    below = [(m, e, r["coverage"]) for run in fair["softmax"]
             for m, res in run["result"]["prediction_sets"]["methods"].items()
             for e, r in res["eps"].items() if r["coverage"] < 1 - float(e)]
    assert below  # the fixture has coverages under 1 − ε, inside the band: each is explained
    explained = next(line for line in lines if line.startswith("Coverage: below 1 − ε but inside"))
    for method, eps, _ in below:
        assert f"{method} ε={eps} " in explained


def _captured_figures(monkeypatch):
    figures = []
    real_close = matplotlib.pyplot.close

    def close(fig=None):
        figures.append(fig)
        return real_close(fig)
    monkeypatch.setattr(matplotlib.pyplot, "close", close)
    return figures


def _overlaps(box, other):
    return box.x0 < other.x1 and other.x0 < box.x1 and box.y0 < other.y1 and other.y0 < box.y1


def test_reliability_legend_covers_no_bar_and_counts_are_readable(quickstart_like, monkeypatch, tmp_path):
    variants = quickstart_like[0]
    figures = _captured_figures(monkeypatch)
    diagrams = document._plot_inputs(variants)[2]
    plots.plot_reliability(diagrams, str(tmp_path / "r.png"))
    fig = figures[-1]
    canvas = FigureCanvasAgg(fig)  # the closed figure's own canvas is detached
    canvas.draw()
    renderer = canvas.get_renderer()
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    legend_box = fig.legends[0].get_window_extent(renderer)
    assert not any(_overlaps(legend_box, ax.get_window_extent(renderer)) for ax in fig.axes)
    count_axes = [ax for ax in fig.axes if ax.get_ylabel() == "samples"]
    assert len(count_axes) == len(diagrams)
    for ax, d in zip(count_axes, diagrams.values()):
        texts = [t for t in ax.texts]
        assert sorted(int(t.get_text()) for t in texts) == sorted(c for c in d["count"] if c)
        assert all(t.get_fontsize() >= 7 and matplotlib.colors.to_hex(t.get_color()) == "#000000" for t in texts)
    assert os.path.getsize(tmp_path / "r.png") > 5000


def test_ood_histograms_have_labels_one_legend_and_no_empty_panel(quickstart_like, monkeypatch, tmp_path):
    variants = quickstart_like[0]
    figures = _captured_figures(monkeypatch)
    hists = ood_section.ood_section(variants)[1]
    plots.plot_ood_histograms(hists, str(tmp_path / "o.png"), "synthetic_ood")
    fig = figures[-1]
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in fig.axes)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["in-distribution", "OOD (synthetic_ood)"]
    assert len(fig.axes) == 9  # 3 heads x 3 scores
    for ax in fig.axes:
        assert ax.axison  # no blank cell
        if ax.patches:
            assert ax.get_xlabel() and ax.get_ylabel() == "fraction of images"
        else:  # softmax has no support-size score: the panel says why
            assert ax.get_title().startswith("softmax: support size") and "dense head" in ax.texts[0].get_text()
    assert os.path.getsize(tmp_path / "o.png") > 5000


def test_support_histogram_bars_sit_on_integers_and_leave_dense_heads_out(monkeypatch, tmp_path):
    figures = _captured_figures(monkeypatch)
    many = [0] * 100
    many[:4] = [50, 30, 15, 5]  # 100 classes, supports of 1-4: the axis ends at 4, not 100
    hists = {"softmax": [0] * 99 + [100], "sparsemax": many, "entmax_bisect": list(many)}
    plots.plot_support_histograms(hists, str(tmp_path / "s.png"))
    ax = figures[-1].axes[0]
    assert list(ax.get_xticks()) == [1, 2, 3, 4]
    for bars in ax.containers:  # each size's group of bars is centred on its integer
        centres = [b.get_x() + b.get_width() / 2 for b in bars]
        assert all(abs(c - round(c)) <= 0.4 for c in centres)
    assert "softmax: always all 100 classes (dense), not drawn" in ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["sparsemax", "entmax_bisect = sparsemax (same numbers)"]  # drawn over, and said


def test_coverage_plot_keeps_the_reports_epsilons_in_view_and_labels_them(monkeypatch, tmp_path):
    figures = _captured_figures(monkeypatch)
    sweep = [(0.2, 1.0, 0.80), (0.1, 1.3, 0.90), (0.05, 1.6, 0.95), (0.01, 10.0, 1.0)]  # (ε, size, coverage)
    curves = {("softmax", "lac"): [(s, c, e) for e, s, c in sweep],
              ("sparsemax", "support"): [(s + 0.1, c, e) for e, s, c in sweep]}
    plots.plot_coverage_vs_set_size(curves, {"sparsemax": (2.1, 0.97)}, str(tmp_path / "c.png"))
    ax = figures[-1].axes[0]
    assert ax.get_xlim()[1] < 5 and "ε < 0.05 beyond the right edge, up to 10" in ax.get_xlabel()
    assert sorted(t.get_text() for t in ax.texts if t.get_text().startswith("ε=")) == ["ε=0.05", "ε=0.1"]


def test_accuracy_plot_says_when_it_joins_two_evaluations(monkeypatch, tmp_path):
    figures = _captured_figures(monkeypatch)
    two = {"mean": [(1, 0.5, 0.01), (2, 0.8, 0.02)], "seeds": [[(1, 0.5), (2, 0.8)]]}
    plots.plot_accuracy_curves({"entmax15": two, "entmax_bisect-a1.5": dict(two)}, str(tmp_path / "a.png"))
    ax = figures[-1].axes[0]
    assert "only 2 evaluations per run (one per epoch)" in ax.get_title()
    assert ax.get_legend().get_texts()[1].get_text().endswith("= entmax15 (same numbers)")


def test_coverage_plot_labels_stand_off_the_curves(monkeypatch, tmp_path):
    """The 1−ε level labels sit in the right margin and the legend below the axes: no label box
    overlaps the plotting area, where the curves are."""
    figures = _captured_figures(monkeypatch)
    sweep = [(0.2, 1.0, 0.80), (0.1, 1.3, 0.90), (0.05, 1.6, 0.95)]
    curves = {("softmax", "lac"): [(s, c, e) for e, s, c in sweep],
              ("sparsemax", "support"): [(s + 0.1, c, e) for e, s, c in sweep]}
    plots.plot_coverage_vs_set_size(curves, {}, str(tmp_path / "c.png"))
    fig = figures[-1]
    ax = fig.axes[0]
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()
    inside = ax.get_window_extent(renderer)
    levels = [t for t in ax.texts if t.get_text().startswith("1−ε")]
    assert levels
    for label in levels + [ax.get_legend()]:
        box = label.get_window_extent(renderer)
        assert box.x0 >= inside.x1 - 1 or box.y1 <= inside.y0 + 1, label
