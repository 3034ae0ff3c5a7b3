"""Predict the classes of new, unlabeled images with a trained model.

    python predict.py --checkpoint runs/small_images --images photos/ --output preds.csv
    python predict.py --checkpoint runs/small_images --images 'photos/**/*.png' --output preds.jsonl --topk 3
    python predict.py --checkpoint model.safetensors --config cfg.yaml --classes classes.json \\
        --images list.txt --output preds.csv                            # exported weights
    accelerate launch --multi_gpu --num_processes 2 predict.py --checkpoint RUN --images DIR --output p.csv

--checkpoint is a train.py run directory (its config.yaml, classes.json and model.safetensors, or
model_ema.safetensors with --ema), one of its checkpoints, or a weights file with --config or --model,
opened as eval.py opens it (inference/trained_run.py: weights that differ from the sha256 their run
recorded are refused unless --accept-changed-weights). --images is a folder (searched recursively), a
glob or a list file (one path per line). Each image goes through the run's eval transform (data/transforms.py:
any shape and mode).
Per image the output (CSV or JSONL, by the extension of --output) has: the path, the top-k classes
and probabilities (PROB_DIGITS significant digits; a sparse head lists only classes with p > 0, so
fewer than k when its support is smaller), the head's support (sparse heads: the classes with p > 0) and the conformal
prediction set at each ε that eval.py calibrated on this run (RUN_DIR/conformal.json, written by
eval.py; built by evaluation/conformal.py, the code eval.py measures the sets with). Unreadable
files are skipped, counted and listed in the output with status "unreadable".
Batches of --batch-size on the device (bf16 on CUDA, float32 on CPU: --precision), a progress bar
on a terminal, and multi-GPU through Accelerate (the image list is split by process and gathered
back in order).
"""
from common.cli import run_cli
from common.startup import say_loading
from inference import arguments  # (argparse only: a mistyped flag is answered before torch loads)


def parse_args(argv=None):
    return arguments.parse_predict_args(argv, __doc__)


def main(argv=None):
    args = parse_args(argv)
    arguments.check_predict_args(args)
    say_loading("predict.py")  # before the imports' seconds, so the command does not look hung
    from inference import predict_command  # heavy: torch, timm and Accelerate (seconds), after the checks

    return predict_command.main(args)


if __name__ == "__main__":
    run_cli(main)
