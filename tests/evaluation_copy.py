"""A fake eval.py step's output: a finished run's evaluation written into another run as eval.py would
have written it there (its checkpoint the run's folder, its head, its count of examples), since the
comparison refuses another run's evaluation as it stands (comparison/run_results.py)."""
import json
import os

from common.rundir import examples_path
from evaluation.examples import load_examples, save_examples


def copy_evaluation(source_json, output, run_dir, head=None, records=None):
    """Write `output` (eval.json) and its records for `run_dir` from the evaluation at `source_json`;
    `records`: other per-example records to write (default: the source's)."""
    with open(source_json) as f:
        result = json.load(f)
    if records is None:
        records = load_examples(examples_path(source_json))[0]
    result.update(checkpoint=os.path.abspath(run_dir), head=head or result["head"], n=int(records["label"].numel()))
    with open(output, "w") as f:
        json.dump(result, f)
    save_examples(records, examples_path(output), head=result["head"], split=result["split"],
                  dataset=result["dataset"], weights=result["weights"], checkpoint=result["checkpoint"])
