"""The export sidecar (MODEL.json beside an ONNX or TorchScript export): read it and check it.

scripts/export.py writes the sidecar and checks it here before writing; scripts/onnx_predict.py
reads it here and checks it against the model it describes. The check (`check_sidecar`) covers
what a consumer follows: the required keys and their types, known values (format, output,
interpolation), the class list (not empty, no empty name, no class twice), a resize that covers the
crop and, given the model's shapes, a class per output and the crop at the model's input size. A
sidecar that fails is one line (SidecarError) naming the file, the key and the fix.

Python's standard library only, and no import of this project: onnx_predict.py runs in a plain
onnxruntime Python without the project and loads this file by its path (beside itself, where a user
copies both, or in the project's exporting/), so the writer and its consumers share one definition.
The class-list rule (`class_list_problem`) is the project's own for every label order: data/classes.py
imports it from here (a module that imports nothing of the project may sit below any package:
tests/test_layering.py checks that it stays so).
"""
import json
import math

FORMATS = ("onnx", "torchscript")  # the export formats that have a sidecar
OUTPUTS = ("logits", "probabilities")
# the resize filters of an evaluation transform (data/transforms.py; 'random' is a training choice)
INTERPOLATIONS = ("bicubic", "bilinear", "nearest")
# the colour of the images a model takes: RGB, or gray in all three channels (a gray dataset's model:
# every image is converted to gray first; data/transforms.py writes it)
GRAY = "gray"
COLORS = ("RGB", GRAY)
FIX = "restore the sidecar scripts/export.py wrote, or export the model again"


class SidecarError(ValueError):
    """A sidecar a consumer cannot follow: `problem` (naming the file and the key), then the fix; the
    message is the one line to show."""

    def __init__(self, problem, fix=FIX):
        super().__init__(f"{problem}; {fix}")
        self.problem = problem


def read_sidecar(model_path):
    """The sidecar of `model_path` (MODEL_PATH.json) as a dict, not yet checked."""
    path = sidecar_path(model_path)
    try:
        with open(path, encoding="utf-8") as f:
            sidecar = json.load(f)
    except (OSError, ValueError) as err:
        raise SidecarError(f"cannot read the sidecar {path} ({err})",
                           fix="export the model with scripts/export.py") from None
    if not isinstance(sidecar, dict):
        raise SidecarError(f"{path} is not an export sidecar (a JSON object), it holds {_kind(sidecar)}")
    return sidecar


def sidecar_path(model_path):
    return model_path + ".json"


def _kind(value):
    """What a JSON value is, in words (a string or number with its value)."""
    if isinstance(value, (dict, list)):
        return "an object" if isinstance(value, dict) else f"a list of {len(value)}"
    return json.dumps(value)[:40]


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(count, positive=False):
    def ok(value):
        return isinstance(value, list) and len(value) == count and all(
            _is_number(v) and (v > 0 or not positive) for v in value)
    return ok


# (key path, what it must be, the test); a parent comes before its children
FIELDS = (
    (("format",), f"one of {', '.join(FORMATS)}", lambda v: v in FORMATS),
    (("output",), f"one of {', '.join(OUTPUTS)}", lambda v: v in OUTPUTS),
    (("classes",), "a list of class names", lambda v: isinstance(v, list) and all(isinstance(n, str) for n in v)),
    (("preprocessing",), "an object", lambda v: isinstance(v, dict)),
    (("preprocessing", "color"), f"one of {', '.join(COLORS)}", lambda v: v in COLORS),
    (("preprocessing", "resize"), "an object", lambda v: isinstance(v, dict)),
    (("preprocessing", "resize", "shorter_side"), "a positive whole number", lambda v: _is_int(v) and v > 0),
    (("preprocessing", "resize", "interpolation"), f"one of {', '.join(INTERPOLATIONS)}",
     lambda v: v in INTERPOLATIONS),
    (("preprocessing", "center_crop"), "an object", lambda v: isinstance(v, dict)),
    (("preprocessing", "center_crop", "size"), "[height, width], two equal positive whole numbers",
     lambda v: isinstance(v, list) and len(v) == 2 and all(_is_int(n) and n > 0 for n in v) and v[0] == v[1]),
    (("preprocessing", "mean"), "a list of 3 numbers (R, G, B)", _numbers(3)),
    (("preprocessing", "std"), "a list of 3 positive numbers (R, G, B)", _numbers(3, positive=True)),
)


def _check_fields(sidecar, where):
    for keys, expected, ok in FIELDS:
        value = sidecar
        for key in keys:
            if key not in value:  # (its parent passed: an object)
                raise SidecarError(f"{where} has no '{'.'.join(keys)}' (an edited, incomplete or older sidecar)")
            value = value[key]
        if not ok(value):
            raise SidecarError(f"{where}: '{'.'.join(keys)}' must be {expected}, not {_kind(value)}")


def class_list_problem(names):
    """Why `names` cannot be a label order (no name, an empty name, a name listed twice), or None:
    label j means one class, so a repeated name would make two outputs print as the same class. The
    one rule for a run's classes.json, a --classes file and a sidecar's `classes`."""
    if not names:
        return "lists no class names"
    seen = {}
    for i, name in enumerate(names):
        if not name.strip():
            return f"has an empty class name (entry {i + 1})"
        if name in seen:
            return f"lists {name!r} twice (entries {seen[name] + 1} and {i + 1})"
        seen[name] = i
    return None


def check_sidecar(sidecar, where, *, model="the model", input_shape=None, num_outputs=None):
    """Raise SidecarError (one line, naming `where`) unless `sidecar` is one a consumer can follow;
    with the model's shapes also `check_model_fit`. -> the sidecar."""
    _check_fields(sidecar, where)
    problem = class_list_problem(sidecar["classes"])
    if problem:
        raise SidecarError(f"{where}: 'classes' {problem}: each class once, in label order")
    pre = sidecar["preprocessing"]
    crop, shorter = pre["center_crop"]["size"], pre["resize"]["shorter_side"]
    if shorter < crop[0]:
        raise SidecarError(f"{where}: 'preprocessing.resize.shorter_side' {shorter} is smaller than the "
                           f"{crop[0]} px crop (the crop would reach outside the image)")
    if input_shape is not None or num_outputs is not None:
        check_model_fit(sidecar, where, model=model, input_shape=input_shape, num_outputs=num_outputs)
    return sidecar


def check_model_fit(sidecar, where, *, model="the model", input_shape=None, num_outputs=None):
    """A checked sidecar against the model it describes: `input_shape` ([batch, 3, H, W]) must take
    the crop, `num_outputs` (K of the (batch, K) output) be the class count. A dimension that is not a
    number (a symbolic batch, an unknown size) is not compared."""
    crop = sidecar["preprocessing"]["center_crop"]["size"]
    if input_shape is not None and len(input_shape) == 4:
        channels, size = input_shape[1], list(input_shape[2:])
        if _is_int(channels) and channels != 3:
            raise SidecarError(f"{model} takes {channels}-channel images (input shape {list(input_shape)}), the "
                               f"sidecar {where} describes RGB ones")
        if all(_is_int(d) for d in size) and size != crop:
            raise SidecarError(f"{where}: 'preprocessing.center_crop.size' is {crop[0]}x{crop[1]} but {model} takes "
                               f"{size[0]}x{size[1]} images (input shape {list(input_shape)})")
    if _is_int(num_outputs) and len(sidecar["classes"]) != num_outputs:
        raise SidecarError(f"{where} lists {len(sidecar['classes'])} classes but {model} gives {num_outputs} "
                           f"scores per image")
