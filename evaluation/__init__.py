"""One model on one dataset: the evaluation loop (per-example records), metrics, calibration, conformal
prediction sets, selective prediction, out-of-distribution scores, and the tables of one result (the analysis
of many runs is the comparison's: comparison/analysis/, comparison/report/)."""
