"""Evaluation and analysis: predictions over a loader, metrics, prediction sets, head comparison reports and plots."""
