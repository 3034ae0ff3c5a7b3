"""Evaluate a checkpoint: accuracy, calibration, sparsity and conformal prediction sets.

    python eval.py --checkpoint runs/quickstart                      # a train.py run directory
    python eval.py --checkpoint runs/quickstart --ema --output m.json
    python eval.py --checkpoint runs/quickstart/checkpoints/step_000000780   # one checkpoint of a run
    python eval.py --checkpoint resmlp_12_no_dist.pth --model resmlp_s12 \\
        --dataset imagefolder --data-root datasets/imagenet          # timm / FB ImageNet weights
    accelerate launch --multi_gpu --num_processes 2 eval.py --checkpoint runs/quickstart

A run directory gives the resolved config (config.yaml) and weights (model.safetensors, or
model_ema.safetensors with --ema); a checkpoint directory of a run (RUN/checkpoints/step_N) gives
its weights and the config that trained it; a weights file (.safetensors/.pth, this project's,
timm's or the original FB/DeiT ResMLP format) needs --config or --model/--dataset to say what to
build (inference/trained_run.py opens all three). Weights that differ from the sha256 their run
recorded (inference/weights_record.py) are refused unless --accept-changed-weights.
Extra `key.sub=value` or `--key.sub VALUE` arguments override the config (configs/overrides.py: the
dialect of every command); the model a run trained (model.*, head.*, its input size, eval transform and
held-out splits) only with --accept-changed-model, recorded in the JSON (inference/run_config.py). A run
directory whose training stopped before the end (no summary.json) is refused (inference/run_status.py).

Metrics (evaluation/metrics.py, through evaluation/evaluate.py, the loop train.py's periodic eval
uses too; float32, autocast off): top-1/5, the head's Fenchel-Young loss, NLL where finite and the
fraction of samples with p_y = 0, ECE (15 bins) with reliability-diagram data, support size
(mean/median/histogram), support coverage of the true class, per-class accuracy, inference img/s.
Prediction sets (evaluation/conformal.py, Campos et al., AISTATS 2025): calibrated on the run's
held-out calibration split (data.calib_fraction > 0) or, when the run held none out, on a fixed
random half of the evaluated split (reported on the other half). Sample counts are exact across
processes. APS's random tie-breaking is seeded per run (its training seed and head).
Selective prediction (evaluation/selective_report.py): risk-coverage AURC, E-AURC and the risk at
fixed coverages, with confidence = the probability of the predicted class (the top logit; for every
head but perturbmax and Taylor softmax its max probability) and, for sparse heads, also 1/support size.
Hopfield pooling (model.pool=hopfield): the pooling support, how many of the N patches each image's
feature uses (weight > 0; evaluation/pool_support.py, from the same forward pass): mean, median and
histogram in the JSON's "pooling", per image in the records (`pool_support`), and the first images'
support maps in STEM.pool_maps.safetensors (drawn by the comparison report). Average pooling: none.
Out-of-distribution detection (--ood-dataset NAME, any dataset this project loads, or `auto`: the
built-in data's own OOD set, builtin10_ood for builtin10): AUROC and FPR at 95% TPR of max
probability, entropy and (sparse heads) support size, of the energy (--ood-temperature) and max
logit, and of the feature-memory scores (minus the Hopfield energies, retrieval support, SHE, kNN) against
the training split's penultimate features (--ood-memory all | N | none; stored in the run directory
as ood_memory.safetensors and reused while the weights match), the evaluated split being
in-distribution (evaluation/ood_eval.py). Writes JSON (--output), a CSV row and the per-example records
(evaluation/examples.py: label, pred, p_y, max prob, support size, FY loss) beside it, and prints a
table, then one line per file it wrote (without --output, one saying the metrics were not kept).
Steps of tens of seconds show a bar on a terminal and a line every 10% or so in a log.
"""
from common.cli import run_cli
from common.startup import say_loading
from inference import arguments  # (argparse only: a mistyped flag is answered before torch loads)


def parse_args(argv=None):
    return arguments.parse_eval_args(argv, __doc__)


def main(argv=None):
    args = parse_args(argv)
    arguments.check_eval_args(args)
    say_loading("eval.py")  # before the imports' seconds, so the command does not look hung
    from inference import eval_command  # heavy: torch, timm and Accelerate (seconds), after the checks

    return eval_command.main(args)


if __name__ == "__main__":
    run_cli(main)
