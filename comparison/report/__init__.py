"""The comparison's report, written from the finished runs (the numbers: comparison/analysis/):

- write: the hand-off from the comparison (the report folder, the finished runs, --until-settled's section, what
  the terminal shows);  document: report.md, the CSV and JSON files (summary.json) and the plots it links;
- plain_words: the summary in plain words;  the sections: selective_section, ood_section, pool_section (Hopfield
  pooling), tuning_section (--tune);  plots: the PNGs;
- readme_numbers: the recorded comparisons' numbers in README.md, docs/quickstart.md and docs/results.md, rebuilt
  from their records.
"""
