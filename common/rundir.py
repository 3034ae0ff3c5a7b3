"""The names of every file of a run directory and of its checkpoints: the one place they are spelled.

    RUN_DIR/
        config.yaml              the resolved config (configs/loader.py)
        classes.json             the training data's class names (data/classes.py)
        class_map.txt            the same names, one per line: timm's class_map format
        run.lock                 one writer at a time (common/runlock.py)
        metrics.jsonl            one row per logged step, eval and accepted config change
        epochs.csv               one row per epoch (training/logging.py)
        model.safetensors        exported raw weights, after every epoch
        model_ema.safetensors    exported EMA weights (train.ema)
        summary.json             written last by a finished training
        tensorboard/<name>/      TensorBoard logs through Accelerate (train.log_with, training/trackers.py)
        mlflow.db, trackers.json MLflow's local store when MLFLOW_TRACKING_URI is unset; the MLflow run id
        eval.json, eval_ema.json eval results scripts/compare_heads.py asks eval.py for (with the
                                 .csv row and .examples.safetensors records beside, see below)
        compare_request.json     the settings compare_heads trained the run with
        compare.log              the run's output under compare_heads --jobs N > 1
        checkpoints/step_<N>/    one checkpoint (training/checkpoint/files.py):
            model.safetensors, model_ema.safetensors, optimizer.pt, scheduler.pt, scaler.pt,
            trainer_state.json, rng_<rank>.json, COMPLETE.json (written last)

One EMA name in both places: model_ema.safetensors.

An eval result OUTPUT.json has its CSV row at OUTPUT.csv and its per-example records at
OUTPUT.examples.safetensors (`eval_csv_path`, `examples_path`); a hopfield-pooled model's support
maps at OUTPUT.pool_maps.safetensors (`pool_maps_path`).
"""
import os

# ----------------------------------------------------------------------------- a run directory
CONFIG = "config.yaml"
CONFIG_HISTORY = "config_history.yaml"  # --resume-with-changes records, beside config.yaml
CLASSES = "classes.json"
CLASS_MAP = "class_map.txt"  # the same names in timm's class_map format (one per line, in label order)
LOCK = "run.lock"
METRICS = "metrics.jsonl"
EPOCHS = "epochs.csv"
WEIGHTS = "model.safetensors"
EMA_WEIGHTS = "model_ema.safetensors"
SUMMARY = "summary.json"
TENSORBOARD = "tensorboard"
TRACKERS = "trackers.json"  # the MLflow run a resumed training goes on logging into (training/trackers.py)
CHECKPOINTS = "checkpoints"
EVAL_RESULT = "eval.json"
EVAL_EMA_RESULT = "eval_ema.json"
COMPARE_REQUEST = "compare_request.json"  # what scripts/compare_heads.py asked train.py for
COMPARE_LOG = "compare.log"  # a run's train + eval output under compare_heads --jobs N > 1

# What marks a directory as holding a run (a fresh start there needs --overwrite), in listing order.
RUN_ARTEFACTS = (WEIGHTS, EMA_WEIGHTS, SUMMARY, METRICS, EPOCHS, CHECKPOINTS)

# ----------------------------------------------------------------------------- a checkpoint directory
MARKER = "COMPLETE.json"
TRAINER_STATE = "trainer_state.json"
OPTIMIZER = "optimizer.pt"
SCHEDULER = "scheduler.pt"
SCALER = "scaler.pt"

# ----------------------------------------------------------------------------- eval outputs
OOD_MEMORY = {"raw": "ood_memory.safetensors", "ema": "ood_memory_ema.safetensors"}  # eval.py's feature memory
EVAL_CSV_SUFFIX = ".csv"
EXAMPLES_SUFFIX = ".examples.safetensors"
POOL_MAPS_SUFFIX = ".pool_maps.safetensors"  # model.pool=hopfield: the first images' pooling weights


def inside(path, folder):
    """Whether `path` is `folder` or lies inside it, links and relative parts resolved (either may
    not exist yet)."""
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def checkpoint_name(step):
    return f"step_{step:09d}"


def rng_file(rank):
    """Checkpoint file of one rank's RNG states."""
    return f"rng_{rank}.json"


def checkpoints_dir(run_dir):
    return os.path.join(run_dir, CHECKPOINTS)


def ood_memory_name(weights_kind):
    """The OOD feature memory of a run's raw or EMA weights (evaluation/feature_memory.py)."""
    return OOD_MEMORY[weights_kind]


def eval_result_name(ema=False):
    """The eval result a comparison keeps in each run directory (raw or EMA weights)."""
    return EVAL_EMA_RESULT if ema else EVAL_RESULT


def _stem(output_json):
    return os.path.splitext(output_json)[0]


def eval_csv_path(output_json):
    """Where the CSV row of an eval result saved at `output_json` goes."""
    return _stem(output_json) + EVAL_CSV_SUFFIX


def examples_path(output_json):
    """Where the per-example records of an eval result saved at `output_json` go."""
    return _stem(output_json) + EXAMPLES_SUFFIX


def pool_maps_path(output_json):
    """Where the pooling support maps of an eval result saved at `output_json` go (hopfield pooling)."""
    return _stem(output_json) + POOL_MAPS_SUFFIX


def eval_outputs(output_json):
    """Every file eval.py writes for `--output output_json` (and, for hopfield pooling, `pool_maps_path`)."""
    return [output_json, eval_csv_path(output_json), examples_path(output_json)]
