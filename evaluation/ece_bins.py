"""The bins of every ECE: one number, read by the metric (evaluation/metrics.py) and by the comparison's
statistics that re-bin resampled rows (comparison/analysis/statistics.py). A module of its own, without
torch: the comparison's statistics load on the torch-free path of compare_heads' argument checks."""

ECE_BINS = 15  # equal-width confidence bins on the max probability
