"""The command lines of eval.py and predict.py, and the flags that say which trained run to open
(shared with scripts/export.py and scripts/extract_features.py): argparse only, neither torch nor
timm, so that a mistyped flag or choice is answered before they load (the entry points import the
commands' bodies, inference/eval_command.py and predict_command.py, after parsing)."""
import argparse
import os

from common import rundir
from common.errors import UserError
from common.io import prepare_output
from common.suggest import choice_metavar, one_of
from configs.overrides import parse_command_line
from data.image_list import list_images
from data.names import SPLITS
from inference.run_config import CHANGE_FLAG, CHANGED_KEY, TRAINED_SECTIONS, is_checkpoint_dir, opened_config

ACCEPT_FLAG = "--accept-changed-weights"  # use weights whose sha256 differs from the run's record (weights_record.py)


def add_run_arguments(parser, *, positional=False, data_flags=False, batch_help="per-process batch size"):
    """The flags that say what to open, as one argparse group: --checkpoint (or a positional
    RUN_DIR|WEIGHTS), --config, --model, --head, --img-size, --ema, --accept-changed-weights,
    --accept-changed-model; with
    data_flags also --dataset, --data-root and --batch-size (overrides of data.dataset, data.root,
    data.eval_batch_size)."""
    g = parser.add_argument_group("what to open")
    what = "train.py run directory, one of its checkpoints (RUN/checkpoints/step_N), or a .safetensors/.pth " \
           "weights file (with --config or --model)"
    if positional:
        g.add_argument("checkpoint", metavar="RUN_DIR|WEIGHTS", help=what)
    else:
        g.add_argument("--checkpoint", required=True, metavar="RUN_DIR_OR_WEIGHTS", help=what)
    g.add_argument("--config", help="YAML config (needed for a weights file unless --model is given; "
                                    "replaces a run directory's config.yaml)")
    g.add_argument("--model", help="model name for a weights file without --config (e.g. resmlp_s12)")
    g.add_argument("--head", help="output head for a weights file without --config (default softmax)")
    g.add_argument("--img-size", type=int, help="model/data image size (default: the model variant's own, "
                                                "32 for the CIFAR-size models, 224 otherwise)")
    g.add_argument("--ema", action="store_true", help="the run's EMA weights (model_ema.safetensors)")
    g.add_argument(ACCEPT_FLAG, action="store_true",
                   help="use weights whose sha256 differs from the one the run recorded for them (its "
                        "checkpoint's COMPLETE.json), with a warning; without it such a file is refused")
    g.add_argument(CHANGE_FLAG, action="store_true",
                   help=f"use a run or checkpoint with {', '.join(s + '.*' for s in TRAINED_SECTIONS)}, the input "
                        "size, eval transform or held-out splits changed on the command line (a warning; eval.py "
                        f"records it as {CHANGED_KEY}); without it such a change is refused")
    if data_flags:
        g.add_argument("--dataset", help="override data.dataset")
        g.add_argument("--data-root", help="override data.root")
        g.add_argument("--batch-size", type=int, help=f"{batch_help} (data.eval_batch_size)")
    return g


# the data flags of add_run_arguments(data_flags=True): (argparse dest, config key)
DATA_FLAGS = (("dataset", "data.dataset"), ("data_root", "data.root"), ("batch_size", "data.eval_batch_size"))


def flag_overrides(model=None, head=None, img_size=None):
    """The typed flags --model, --head, --img-size as (key, value) overrides: set as they are, never
    parsed back from text."""
    flags = (("model.name", model), ("head.name", head), ("data.image_size", img_size))
    return [(key, value) for key, value in flags if value]


def data_overrides(args):
    """The data flags a command has (DATA_FLAGS) as (key, value) overrides."""
    return [(key, getattr(args, flag)) for flag, key in DATA_FLAGS if getattr(args, flag, None)]


def check_run_path(path):
    """What --checkpoint names exists (open_run asks again; the entry points ask before torch loads)."""
    if not os.path.exists(path):
        raise UserError(f"checkpoint not found: {path} (give a train.py run directory or a weights file)")


def check_run_config(args):
    """The config a run directory or checkpoint is opened with (inference/run_config.py), read now: a
    mistake on the command line or in the run's file, or a change of what the run trained, is one line
    before torch loads (open_run asks again). A weights file's config needs the model variants (torch): later."""
    path = args.checkpoint
    if is_checkpoint_dir(path) or os.path.isfile(os.path.join(path, rundir.CONFIG)):
        flags = flag_overrides(args.model, args.head, args.img_size) + data_overrides(args) + list(args.overrides)
        opened_config(path, config=args.config, flags=flags, accept=args.accept_changed_model)


# ============================================================================ eval.py
def check_eval_args(args):
    """What eval.py can check before torch loads, in the order its body does: the output, the run's path
    and config."""
    if args.output:
        prepare_output(args.output, make=False)  # a bad --output is one line now, not after the forward passes
    check_run_path(args.checkpoint)
    check_run_config(args)


CALIB_SOURCES = ("auto", "calib", "val-half", "none")


def parse_eval_args(argv, doc):
    """The checked command line; `doc`: the entry point's docstring (its first two paragraphs are --help's)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p, data_flags=True, batch_help="per-process eval batch size")
    p.add_argument("--split", default="val", action=one_of(SPLITS), metavar=choice_metavar(SPLITS))
    p.add_argument("--calib", default="auto", action=one_of(CALIB_SOURCES),
                   metavar=choice_metavar(CALIB_SOURCES),
                   help="prediction-set calibration data: auto = the calib split when the run held one "
                        "out (data.calib_fraction > 0), else half of the evaluated split; none = skip")
    p.add_argument("--eps", type=float, nargs="+", default=None, help="miscoverage levels (default 0.1 0.05)")
    p.add_argument("--ood-dataset", metavar="NAME", default=None,
                   help="out-of-distribution set for OOD detection (a data.dataset name, e.g. builtin10_ood, "
                        "imagefolder with --ood-root; auto = the built-in data's own OOD set; none, the default: "
                        "no OOD detection)")
    p.add_argument("--ood-root", metavar="DIR", default=None,
                   help="data root of the OOD set (default: the run's data.root)")
    p.add_argument("--ood-temperature", default=None, metavar="T",
                   help="temperature of the energy OOD score T*logsumexp(z/T) (default 1)")
    p.add_argument("--ood-memory", default=None, metavar="all|none|N",
                   help="feature memory of the OOD scores: the training split's penultimate features (all, "
                        "a seeded subsample of N, or none: no feature scores); stored in the run directory "
                        "(default all)")
    p.add_argument("--output", help="metrics JSON path (a CSV row and STEM.examples.safetensors are "
                                    "written beside it)")
    p.add_argument("--quiet", action="store_true", help="no table on the terminal")
    p.add_argument("--allow-class-mismatch", action="store_true",
                   help="evaluate although the dataset's class names differ from the run's classes.json")
    args = parse_command_line(p, argv, tool="python eval.py")
    if args.ood_dataset == "none":  # compare_heads' spelling of "no OOD detection", eval.py's default
        args.ood_dataset = None
    return args


# ============================================================================ predict.py
OUTPUT_FORMATS = (".csv", ".jsonl")
PRECISIONS = ("auto", "bf16", "fp32")

def parse_predict_args(argv, doc):
    """The checked command line; `doc`: the entry point's docstring (its first two paragraphs are --help's)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p)
    p.add_argument("--images", required=True, metavar="DIR|GLOB|LIST",
                   help="a folder (recursive), a quoted glob ('photos/*.jpg', ** for subfolders) or a text "
                        "file with one image path per line")
    p.add_argument("--output", required=True, metavar="PREDS.csv|PREDS.jsonl", help="where the predictions go")
    p.add_argument("--topk", type=int, default=5, help="classes listed per image (default 5, at most all)")
    p.add_argument("--batch-size", type=int, help="images per batch and process (default data.eval_batch_size)")
    p.add_argument("--num-workers", type=int, help="decoding worker processes (default data.num_workers)")
    p.add_argument("--precision", default="auto", action=one_of(PRECISIONS),
                   metavar=choice_metavar(PRECISIONS),
                   help="forward precision: auto = bf16 on CUDA, fp32 on CPU (fp32 gives eval.py's numbers)")
    p.add_argument("--classes", metavar="FILE",
                   help="class names: a classes.json ({\"classes\": [...]}) or one name per line (default: the "
                        "run's classes.json)")
    p.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    return parse_command_line(p, argv, tool="python predict.py")


def check_predict_args(args):
    """What predict.py can check before torch loads: the flags, then the output (a path through a file or
    a read-only folder is one line now), then the run's path and config, then the images: args.image_paths, the list
    the body predicts (a folder without images is one line now, not after torch and the model load)."""
    ext = os.path.splitext(args.output)[1].lower()
    if ext not in OUTPUT_FORMATS:
        raise UserError(f"--output {args.output}: the extension picks the format, one of {', '.join(OUTPUT_FORMATS)}")
    if os.path.exists(args.output) and not args.overwrite:
        raise UserError(f"--output {args.output} exists; pass --overwrite to replace it, or choose another name")
    if args.topk < 1:
        raise UserError(f"--topk must be at least 1, got {args.topk}")
    for flag in ("batch_size", "num_workers"):
        value = getattr(args, flag)
        if value is not None and value < (1 if flag == "batch_size" else 0):
            raise UserError(f"--{flag.replace('_', '-')} must be {'positive' if flag == 'batch_size' else '>= 0'}, "
                            f"got {value}")
    prepare_output(args.output, make=False)
    check_run_path(args.checkpoint)
    check_run_config(args)
    args.image_paths = list_images(args.images)


# ============================================================================ scripts/extract_features.py
DEFAULT_SHARD_SIZE = 8192
EXTRACTED_SPLITS = ("train", "val", "calib")  # --splits: what a feature folder may hold


def parse_extract_args(argv, doc):
    """scripts/extract_features.py's checked command line; `doc`: its docstring (--help's first two paragraphs)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc.split("\n\n")[1])
    add_run_arguments(p, data_flags=True, batch_help="images per forward")
    p.add_argument("--output", required=True, metavar="DIR", help="the feature folder (created)")
    p.add_argument("--splits", nargs="+", default=None, action=one_of(EXTRACTED_SPLITS),
                   metavar=choice_metavar(EXTRACTED_SPLITS),
                   help="splits to extract (default: train val, and calib when data.calib_fraction > 0)")
    p.add_argument("--views", type=int, default=1, help="augmented views per train image (with --augment)")
    p.add_argument("--augment", action="store_true",
                   help="train split through the training augmentation (default: the eval transform everywhere)")
    p.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_SIZE, help="images per shard")
    p.add_argument("--ood", metavar="NAME|auto", default=None,
                   help="also extract this OOD set's val split to OUTPUT/ood (auto: the built-in data's own)")
    p.add_argument("--ood-root", metavar="DIR", default=None, help="data root of the OOD set")
    args = parse_command_line(p, argv, tool="python scripts/extract_features.py")
    if args.views < 1:
        raise UserError(f"--views must be at least 1, got {args.views}")
    if args.views > 1 and not args.augment:
        raise UserError(f"--views {args.views} without --augment would write {args.views} equal copies (the eval "
                        f"transform is deterministic); add --augment, or drop --views")
    if args.shard_size < 1:
        raise UserError(f"--shard-size must be at least 1, got {args.shard_size}")
    return args


def check_extract_args(args):
    """What scripts/extract_features.py can check before torch loads: where it writes (made only when it
    writes: a refusal leaves no empty folder), that what it reads exists, and the run's config."""
    out = args.output
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f"--output {out} is a file; give a folder")
    if os.path.exists(args.checkpoint) and rundir.inside(args.checkpoint, out):
        raise UserError(f"--output {out} holds the source --checkpoint {args.checkpoint}: the extraction would write "
                        f"into what it reads; give another --output, e.g. --output "
                        f"features/{os.path.basename(os.path.normpath(args.checkpoint))}")
    prepare_output(out, folder=True, make=False)  # a path through a file or a read-only folder: one line now
    check_run_path(args.checkpoint)
    check_run_config(args)
