"""Predict with an exported ONNX model, its sidecar and sidecar_format.py alone: onnxruntime, numpy and Pillow.

    python scripts/onnx_predict.py runs/quickstart/model.onnx photo.jpg more_photos/
    python scripts/onnx_predict.py model.onnx val/ --output predictions.jsonl

It follows only the export's sidecar (MODEL.onnx.json, written by scripts/export.py): each image
is converted to RGB, its shorter side resized as `preprocessing.resize` says, centre-cropped,
scaled to [0, 1] and normalised with the sidecar's mean and std, exactly as the run's eval.py
does. One JSON line per image: the file, the top-1 class, and for an export made with
--head-probabilities the head's probabilities and their support (the classes with p > 0: for the
sparse heads, the prediction set). Folders are read recursively in sorted order.

It imports neither torch nor timm, so it is also a reference for a deployment in another language:
every step below is one of the sidecar's numbers. The sidecar is read and checked by
sidecar_format.py (beside this file; the standard library only, the one definition export.py checks
what it writes with): a sidecar that is edited, incomplete, or does not fit the model (a class per
output, the crop at the model's input size) is one line naming the key, exit 2. Copy both files.
"""
import argparse
import json
import os
import sys

import numpy as np
from PIL import Image

try:
    import sidecar_format  # beside this file (scripts/): found as `python onnx_predict.py` finds its own folder
except ImportError:
    print("error: onnx_predict.py needs sidecar_format.py beside it (both are in the project's scripts/); "
          "copy it too", file=sys.stderr)
    sys.exit(2)

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
    import onnxruntime

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
            for folder, dirs, files in os.walk(path):
                dirs.sort()
                yield from (os.path.join(folder, f) for f in sorted(files) if f.lower().endswith(IMAGE_EXTENSIONS))
        elif os.path.isfile(path):
            yield path
        else:
            raise Refused(f"no such image or folder: {path}")


def predict(model_path, paths, batch_size=32):
    """-> one dict per image: file, pred (index), class, and for probability exports support and probs."""
    sidecar = read_sidecar(model_path)
    session = open_session(model_path, sidecar)
    input_name = session.get_inputs()[0].name
    files = list(image_files(paths))
    rows = []
    for start in range(0, len(files), batch_size):
        chunk = files[start:start + batch_size]
        images = []
        for path in chunk:
            try:
                with Image.open(path) as image:
                    images.append(preprocess(image, sidecar["preprocessing"]))
            except OSError as err:
                raise Refused(f"cannot read image {path}: {err}") from None
        out = session.run(None, {input_name: np.stack(images)})[0]
        for path, row in zip(chunk, out):
            pred = int(np.argmax(row))
            result = {"file": path, "pred": pred, "class": sidecar["classes"][pred]}
            if sidecar["output"] == "probabilities":
                result["support"] = [int(i) for i in np.flatnonzero(row > 0)]
                result["probs"] = [float(p) for p in row]
            rows.append(result)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="an .onnx file from scripts/export.py (its sidecar MODEL.onnx.json beside it)")
    p.add_argument("images", nargs="+", help="image files or folders")
    p.add_argument("--output", help="JSON lines file (default: standard output)")
    p.add_argument("--batch-size", type=int, default=32)
    args = p.parse_args(argv)
    try:
        if args.output:
            write_output(args.output, None)  # before the forward passes: a destination that cannot be written
        rows = predict(args.model, args.images, args.batch_size)
        text = "".join(json.dumps(r) + "\n" for r in rows)
        if args.output:
            write_output(args.output, text)
        else:
            sys.stdout.write(text)
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
