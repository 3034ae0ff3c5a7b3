"""scripts/export.py's command line and the checks that need no model: the flags, the run's path,
the format's packages and the destination, each one line before torch loads (argparse, the standard
library and the project's torch-free modules only; inference/arguments.py has the run flags)."""
import argparse

from common import sidecar_format
from common.errors import UserError
from common.suggest import choice_metavar, one_of
from configs.overrides import parse_command_line
from inference.arguments import add_run_arguments, check_run_config, check_run_path

from .dependencies import check_dependencies
from .destinations import check_file_output, check_timm_folder, default_folder, default_output

FILE_FORMATS = sidecar_format.FORMATS  # one file and its sidecar
FORMATS = FILE_FORMATS + ("timm",)  # timm: a folder (exporting/timm_folder.py)


def parse_export_args(argv, doc):
    """The parsed command line; `doc`: the entry point's docstring (its first two paragraphs are --help's)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(p, positional=True)
    p.add_argument("--format", required=True, action=one_of(FORMATS), metavar=choice_metavar(FORMATS),
                   help=f"one of: {', '.join(FORMATS)}")
    p.add_argument("--head-probabilities", action="store_true",
                   help="append the head's probability mapping (the output is probabilities, not logits)")
    p.add_argument("--output", help="file to write (default: beside the checkpoint, model.onnx / "
                                    "model.torchscript.pt in a run directory); the sidecar is OUTPUT.json; "
                                    "--format timm: a folder (default RUN_DIR/timm, or RUN_DIR/timm_ema with --ema)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT")
    return parse_command_line(p, argv, tool="python scripts/export.py")


def output_of(args) -> str:
    """Where the export goes: --output, else beside the checkpoint (a file, or for timm a folder)."""
    if args.output:
        return args.output
    if args.format == "timm":
        return default_folder(args.checkpoint, args.ema)
    return default_output(args.checkpoint, args.format, args.ema)


def check_export_args(args):
    """What export can check before torch loads, each one line: the flags, the run's path and config, the
    format's packages (exporting/dependencies.py), then the destination (an existing one needs
    --overwrite; one that cannot be written is exit 74; none is made before the export writes)."""
    if args.format == "timm" and args.head_probabilities:
        raise UserError("--format timm exports timm's model, which returns logits: drop --head-probabilities "
                        "(config.json says how to get the head's probabilities), or use --format onnx")
    check_run_path(args.checkpoint)
    check_run_config(args)
    check_dependencies(args.format)
    if args.format == "timm":
        check_timm_folder(output_of(args), args.overwrite)
    else:
        check_file_output(output_of(args), args.format, args.overwrite)
