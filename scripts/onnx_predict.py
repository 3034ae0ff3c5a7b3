"""Predict with an exported ONNX model, its sidecar and sidecar_format.py alone: onnxruntime, numpy and Pillow.

    python scripts/onnx_predict.py runs/quickstart/model.onnx photo.jpg more_photos/
    python scripts/onnx_predict.py model.onnx val/ --output predictions.jsonl

It follows only the export's sidecar (MODEL.onnx.json, written by scripts/export.py): each image is
converted to RGB (to gray in all three channels where `preprocessing.color` says gray), its shorter
side resized as `preprocessing.resize` says, centre-cropped, scaled to [0, 1] and normalised with
the sidecar's mean and std, exactly as the run's eval.py does. One JSON line per image, in input
order: the file, status ok, the top-1 class, and for an export made with --head-probabilities the
head's probabilities and their support (the classes with p > 0: for the sparse heads, the
prediction set). Folders are read recursively in sorted order. A file that cannot be read as an
image (truncated, not an image) is skipped, counted in a warning and listed with status unreadable
and the reason, as predict.py does; none readable is exit 2.

It imports neither torch nor timm, so it is also a reference for a deployment in another language:
every step below is one of the sidecar's numbers. The sidecar is read and checked by
sidecar_format.py (the standard library only, the one definition export.py checks what it writes
with; loaded by its path: beside this file, where a copy of the two goes, else the project's
common/sidecar_format.py): a sidecar that is edited, incomplete, or does not fit the model (a
class per output, the crop at the model's input size) is one line naming the key, exit 2. To run it
without the project, copy this file and common/sidecar_format.py into one folder. A Python
without onnxruntime, numpy or Pillow is told in one line how to install them.
"""
import argparse
import importlib.util
import json
import os
import sys

# (module, its pip package): what this script needs beyond the standard library
REQUIRED = (("onnxruntime", "onnxruntime"), ("numpy", "numpy"), ("PIL", "Pillow"))


def shown(path):
    """`path` as the user types it here: relative to the current folder when inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith(os.pardir) else rel


def missing_packages():
    """The pip packages of REQUIRED this Python cannot import (checked without importing them)."""
    def installed(module):
        try:
            return importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # an import hook that refuses it
            return False
    return [package for module, package in REQUIRED if not installed(module)]


def load_sidecar_format():
    """sidecar_format.py, by its path: beside this file (a copy of the two), else the project's common/."""
    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, "sidecar_format.py"),
                 os.path.join(os.path.dirname(here), "common", "sidecar_format.py")):
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("sidecar_format", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    print("error: onnx_predict.py needs sidecar_format.py beside it (the project's common/sidecar_format.py); "
          "copy it too", file=sys.stderr)
    sys.exit(2)


_missing = missing_packages()
if _missing:  # before the imports below: one line naming the fix, not their traceback
    print(f"error: onnx_predict.py needs {' and '.join(_missing)}, which {shown(sys.executable)} does not have; "
          f"install {'it' if len(_missing) == 1 else 'them'} with: {shown(sys.executable)} -m pip install "
          f"{' '.join(_missing)}", file=sys.stderr)
    sys.exit(2)

import numpy as np
import onnxruntime
from PIL import Image

sidecar_format = load_sidecar_format()
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")
INTERPOLATIONS = {name: getattr(Image, name.upper()) for name in sidecar_format.INTERPOLATIONS}
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


class Refused(Exception):
    """Bad input: one line, exit 2."""


def read_sidecar(model_path):
    """The sidecar of an ONNX export, its keys and values checked (sidecar_format.py)."""
    try:
        sidecar = sidecar_format.read_sidecar(model_path)
        sidecar_format.check_sidecar(sidecar, sidecar_format.sidecar_path(model_path))
    except sidecar_format.SidecarError as err:
        raise Refused(str(err)) from None
    if sidecar["format"] != "onnx":
        raise Refused(f"{sidecar_format.sidecar_path(model_path)} describes a {sidecar['format']} export; "
                      f"onnx_predict.py runs ONNX ones (python scripts/export.py RUN_DIR --format onnx)")
    return sidecar


def open_session(model_path, sidecar):
    """The onnxruntime session of `model_path`, checked to fit its sidecar (the crop is its input size,
    a class per output) before any image is read."""
    try:
        session = onnxruntime.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    except Exception as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        why = f"cannot load {model_path} as an ONNX model ({reason}); export it with scripts/export.py"
        raise Refused(why) from None
    outputs = session.get_outputs()[0].shape
    try:
        sidecar_format.check_model_fit(sidecar, sidecar_format.sidecar_path(model_path), model=model_path,
                                       input_shape=session.get_inputs()[0].shape,
                                       num_outputs=outputs[-1] if outputs else None)
    except sidecar_format.SidecarError as err:
        raise Refused(str(err)) from None
    return session


def to_rgb(image):
    """8-bit RGB; 16-bit gray scaled to 8 bits (round(v / 257)) rather than clipped."""
    if image.mode in SIXTEEN_BIT_MODES:
        values = np.asarray(image).astype(np.int64)
        image = Image.fromarray(np.rint(values / 257.0).clip(0, 255).astype(np.uint8), mode="L")
    return image.convert("RGB")


def resized_size(width, height, shorter_side):
    """(width, height) with the shorter side = shorter_side, the longer int(shorter_side * longer / shorter)."""
    if width <= height:
        return shorter_side, int(shorter_side * height / width)
    return int(shorter_side * width / height), shorter_side


def crop_offsets(width, height, size):
    """(left, top) of the centred size x size window; round() is half to even, as the sidecar says."""
    return int(round((width - size) / 2.0)), int(round((height - size) / 2.0))


def preprocess(image, pre):
    """PIL image -> float32 (3, size, size), as the sidecar's `preprocessing` describes."""
    image = to_rgb(image)
    if pre["color"] == sidecar_format.GRAY:  # a gray dataset's model: Pillow's luma, in the three channels
        image = image.convert("L").convert("RGB")
    w, h = resized_size(image.width, image.height, int(pre["resize"]["shorter_side"]))
    if (w, h) != image.size:
        image = image.resize((w, h), INTERPOLATIONS[pre["resize"]["interpolation"]])
    ch, cw = pre["center_crop"]["size"]
    left, top = crop_offsets(w, h, cw)
    pixels = np.asarray(image.crop((left, top, left + cw, top + ch)), dtype=np.float32) / np.float32(255.0)
    mean, std = np.asarray(pre["mean"], np.float32), np.asarray(pre["std"], np.float32)
    return ((pixels - mean) / std).transpose(2, 0, 1)


def image_files(paths):
    for path in paths:
        if os.path.isdir(path):
            found = []
            for folder, dirs, files in os.walk(path):
                dirs.sort()
                found += [os.path.join(folder, f) for f in sorted(files) if f.lower().endswith(IMAGE_EXTENSIONS)]
            if not found:
                raise Refused(f"{path} holds no images ({', '.join(IMAGE_EXTENSIONS)}, in it or its subfolders)")
            yield from found
        elif os.path.isfile(path):
            yield path
        else:
            raise Refused(f"no such image or folder: {path}")


def decode(path):
    """The image at `path`, decoded whole (a truncated file fails here, not half-way through a batch)."""
    with Image.open(path) as image:
        image.load()
        return image.copy()


def unreadable_reason(err):
    """predict.py's wording of why a file was skipped: the exception's type and first line."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def predict(model_path, paths, batch_size=32):
    """-> one dict per image, in input order: file and status; for a readable image (status ok) pred
    (index), class, and for probability exports support and probs; for an unreadable one (status
    unreadable) the error."""
    sidecar = read_sidecar(model_path)
    session = open_session(model_path, sidecar)
    input_name = session.get_inputs()[0].name
    files = list(image_files(paths))
    rows = []
    for start in range(0, len(files), batch_size):
        chunk = [{"file": path} for path in files[start:start + batch_size]]
        readable, images = [], []
        for row in chunk:
            try:
                image = decode(row["file"])
            except Exception as err:  # as predict.py: any file PIL cannot decode is listed, not fatal
                row.update({"status": "unreadable", "error": unreadable_reason(err)})
                continue
            readable.append(row)
            images.append(preprocess(image, sidecar["preprocessing"]))
        if images:
            out = session.run(None, {input_name: np.stack(images)})[0]
            for row, scores in zip(readable, out):
                pred = int(np.argmax(scores))
                row.update({"status": "ok", "pred": pred, "class": sidecar["classes"][pred]})
                if sidecar["output"] == "probabilities":
                    row["support"] = [int(i) for i in np.flatnonzero(scores > 0)]
                    row["probs"] = [float(p) for p in scores]
        rows += chunk
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="an .onnx file from scripts/export.py (its sidecar MODEL.onnx.json beside it)")
    p.add_argument("images", nargs="+", help="image files or folders")
    p.add_argument("--output", help="JSON lines file (default: standard output)")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args(argv)
    try:
        if args.batch_size < 1:
            raise Refused(f"--batch-size must be at least 1, got {args.batch_size}")
        if args.output:
            write_output(args.output, None)  # before the forward passes: a destination that cannot be written
        rows = predict(args.model, args.images, args.batch_size)
        text = "".join(json.dumps(r) + "\n" for r in rows)
        if args.output:
            write_output(args.output, text)
        else:
            sys.stdout.write(text)
        failed = [r for r in rows if r["status"] == "unreadable"]
        if failed:
            print(f"warning: {len(failed)} unreadable file(s) skipped (first: {failed[0]['file']}: "
                  f"{failed[0]['error']}); listed in {args.output or 'the output'} with status unreadable",
                  file=sys.stderr)
        if rows and len(failed) == len(rows):
            raise Refused(f"none of the {len(rows)} file(s) could be read as an image (see {args.output or 'above'})")
    except Refused as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # as the project's writer reports one (common/io.py, which this script does not import)
        why = "a part of the path is a file, not a folder" if isinstance(err, (FileExistsError, NotADirectoryError)) \
            else err.strerror or str(err)
        print(f"error: cannot write {args.output}: {why}; choose a writable --output", file=sys.stderr)
        return 74
    return 0


def write_output(path, text):
    """`text` to `path` atomically (a temporary file beside it, then a rename), its folder created;
    `text` None only checks that the file can be created there."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text or "")
        if text is not None:
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


if __name__ == "__main__":
    sys.exit(main())
