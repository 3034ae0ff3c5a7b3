"""The head comparison of scripts/compare_heads.py and the analysis of many runs, one module per job:

- cli: the command line and the checks of its arguments;  limits: the largest numbers it takes, and how they
  are written;  plan: variants, runs, baseline pairs;
- commands: the train.py / eval.py command lines of a run and what it still needs;
- ledger: the settings each run was trained with (a run trained with others is refused);
- run_results: the one checked reader of a run's eval.json and per-example records (damaged or foreign: redone);
- command: the command's flow and the OOD set eval.py is asked for;
- modes: one plan through --emit-slurm, --dry-run, --report-only or a run here;
- execution, slot_env, worker_slots, worker: local runs, one after another or --jobs N at once;
- slurm (+ slurm_array.sh): the SLURM array job;  tracking, progress: MLflow, the progress line;
- settle: --until-settled's looks (analysis/sequential.py decides);  design_record: their design's record,
  guarded (the runs folder's lock, read whole or refused);  cost: the plan's estimated time;
  paths: the repository's and the worker script's paths;
- tune, tuning, tuning_storage, tuning_summary: --tune's studies (Optuna's optimize() on its storages), their
  verdict runs and what the report shows of them;  storage_url: --storage checked before Optuna loads;
- analysis/: the statistics of many runs (over seeds, paired differences, equivalence, the sequential design,
  sanity checks);  report/: the comparison's report (report.md, summary.json, plots) and the quick start's numbers.
"""
