"""Evaluation of trained heads: metrics, paired statistics, selective prediction, OOD detection."""
