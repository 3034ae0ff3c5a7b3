"""The statistics of many runs, pure functions of numbers (no I/O):

- statistics: paired bootstrap, McNemar, the across-trainings t-interval, sign-flip p and power, the metric table;
- paired: each variant against its baseline over the seeds;  equivalence: the margin verdicts (TOST,
  non-inferiority, superiority) and --margin's parser;  sequential: --until-settled's group-sequential design;
- sanity: the checks stated before the verdicts (a head at chance, a coverage below its band, a budget still rising).
"""
