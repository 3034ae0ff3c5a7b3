"""Evaluation and analysis: predictions over a loader, metrics, prediction sets, paired statistics,
selective prediction, out-of-distribution detection, head comparison reports and plots."""
