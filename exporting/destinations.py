"""Where an export goes and what may stand there, checked before torch loads (standard library and
common/ only): a file and its sidecar (onnx, torchscript) or a timm folder."""
import os

from common import rundir
from common.errors import UserError
from common.io import prepare_output
from common.sidecar_format import sidecar_path

SUFFIX = {"onnx": ".onnx", "torchscript": ".torchscript.pt"}  # the file formats (each with a sidecar)
# --format timm's folder: weights in timm's names, timm's Hub config, the class map, a model card
TIMM_WEIGHTS, TIMM_CONFIG, TIMM_CARD = "model.safetensors", "config.json", "README.md"
TIMM_FILES = (TIMM_WEIGHTS, TIMM_CONFIG, rundir.CLASS_MAP, TIMM_CARD)


def default_output(checkpoint: str, fmt: str, ema: bool) -> str:
    if os.path.isdir(checkpoint):
        return os.path.join(checkpoint, ("model_ema" if ema else "model") + SUFFIX[fmt])
    return os.path.splitext(checkpoint)[0] + SUFFIX[fmt]


def default_folder(checkpoint: str, ema: bool) -> str:
    if os.path.isdir(checkpoint):
        return os.path.join(checkpoint, "timm_ema" if ema else "timm")
    return os.path.splitext(checkpoint)[0] + "_timm"


def check_file_output(output: str, fmt: str, overwrite: bool) -> None:
    """OUTPUT and OUTPUT.json may be written: not a folder, not there unless --overwrite, and the
    folder writable (common.io.prepare_output: a path through a file or a read-only folder is one
    line, exit 74; a folder it makes to check is removed again: the export makes it when it writes)."""
    if os.path.isdir(output):
        raise UserError(f"--output {output} is a directory; give a file name "
                        f"(e.g. {os.path.join(output, 'model' + SUFFIX[fmt])})")
    for path in (output, sidecar_path(output)):
        if os.path.lexists(path) and not overwrite:
            raise UserError(f"{path} exists; pass --overwrite to replace it, or choose --output")
    prepare_output(output, make=False)


def check_timm_folder(folder: str, overwrite: bool) -> None:
    """The timm folder may be written: not a file, holding no export unless --overwrite, and writable.
    A folder that is not there yet is not made (the run may still be refused, e.g. a variant timm
    has no architecture for): the write check probes the nearest folder that exists."""
    if os.path.isfile(folder):
        raise UserError(f"--output {folder} is a file; --format timm writes a folder: give a folder name")
    present = [n for n in TIMM_FILES if os.path.lexists(os.path.join(folder, n))]
    if present and not overwrite:
        raise UserError(f"{folder} already holds an export ({', '.join(present)}); pass --overwrite to replace "
                        f"those files, or choose --output")
    existing = os.path.abspath(folder)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    # a file on the way: prepare_output names `folder` (it makes nothing: the folders above the file exist)
    prepare_output(existing if os.path.isdir(existing) else folder, folder=True)
