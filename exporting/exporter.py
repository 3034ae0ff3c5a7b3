"""The ONNX and TorchScript export (scripts/export.py's body, run after exporting/arguments.py has
checked the command line, the run's path, the format's packages and the destination).

The exported module maps float32 images (B, C, H, W), already normalised with the sidecar's mean
and std, to logits (B, K), or with --head-probabilities to the head's probabilities (B, K): for the
sparse heads through the fixed-shape device threshold path (models/thresholds_device.py: sorted
thresholds, fixed bisection + Newton steps), so the graph has no data-dependent branch. The batch
dimension is dynamic; the image size is fixed by the model. Every head exports in both formats
(ONNX opset EXPORT_OPSET); tests/test_export.py checks each against eager PyTorch with onnxruntime.

TorchScript: the backbone is scripted (it keeps its one-line input-size error; with model.pool=
hopfield it is traced); the head's mapping is traced, because the mappings are autograd Functions
with a host-side choice of threshold path.
The sidecar is checked with common/sidecar_format.py, the check its consumer
(scripts/onnx_predict.py) runs, before anything is written: a sidecar its consumer would refuse is
never written. The files are written atomically, under the folder's lock (common/runlock.py).
"""
import contextlib
import copy
import os
import warnings

import torch
import torch.nn as nn

from common import rundir, sidecar_format
from common.errors import UserError
from common.io import atomic_write, atomic_write_text, prepare_output, write_json
from common.runlock import writing_into
from data.classes import class_map_text
from data.transforms import eval_transform
from inference.trained_run import open_from_args
from models.mappings import threshold_path
from models.registry import head_spec

from . import timm_folder
from .arguments import output_of

EXPORT_OPSET = 17  # ONNX opset: TopK, ReduceMax etc. as onnxruntime >= 1.14 runs them
INPUT_NAME, BATCH_AXIS = "images", "batch"


class ExportedClassifier(nn.Module):
    """images -> logits, or -> probabilities when `probabilities` (the head's mapping) is given."""

    def __init__(self, backbone: nn.Module, probabilities: nn.Module = None):
        super().__init__()
        self.backbone = backbone
        self.probabilities = probabilities if probabilities is not None else nn.Identity()

    def forward(self, images):
        return self.probabilities(self.backbone(images))


class InferenceContext:
    """The `ctx` of an autograd Function's forward when nothing will be differentiated: it keeps
    attributes and records no tensors."""

    def save_for_backward(self, *tensors):
        pass

    def mark_non_differentiable(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


@contextlib.contextmanager
def autograd_functions_inlined():
    """While tracing: every autograd Function (the heads' mappings are ones) runs its forward
    directly, so torch.jit.trace records its tensor ops instead of a Python call it cannot save.
    The exported module is for inference only: its backward is never needed."""
    original = torch.autograd.Function.__dict__["apply"]
    torch.autograd.Function.apply = classmethod(lambda cls, *args: cls.forward(InferenceContext(), *args))
    try:
        yield
    finally:
        torch.autograd.Function.apply = original


def load_classifier(args):
    """(cfg, model in eval mode, class names) as eval.py would evaluate them: the run's classes.json,
    else the configured dataset's class names."""
    run = open_from_args(args)
    classes = run.classes()
    return run.cfg, run.build_model(len(classes)), classes


def split_head(model: nn.Module):
    """(backbone without its output head, the head) from a models.create_classifier model."""
    backbone = copy.deepcopy(model)
    head = backbone.output_head
    del backbone.output_head  # (an attribute TorchScript would otherwise try to compile)
    return backbone.eval(), head.eval()


def example_images(cfg, batch: int = 2) -> torch.Tensor:
    size = cfg.data.image_size
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))


def build_exported(model: nn.Module, cfg, fmt: str, head_probabilities: bool) -> nn.Module:
    """The module to save: eager for ONNX (traced by the exporter), scripted for TorchScript."""
    backbone, head = split_head(model)
    if fmt == "onnx":
        return ExportedClassifier(backbone, head if head_probabilities else None).eval()
    probabilities = None
    # The device threshold path: fixed shapes, no branch on the values.
    with threshold_path("device"), torch.no_grad(), autograd_functions_inlined():
        if head_probabilities:
            probabilities = torch.jit.trace(head, backbone(example_images(cfg)), check_trace=False)
        if getattr(backbone, "has_hopfield_pool", False):
            # Scripted, Hopfield pooling calls its mapping through Python (models/hopfield_pool.py),
            # which torch.jit.save refuses: traced instead (the input-size error is then not kept).
            backbone = torch.jit.trace(backbone, example_images(cfg), check_trace=False)
    return torch.jit.script(ExportedClassifier(backbone, probabilities))


def save_export(module: nn.Module, cfg, fmt: str, output: str, head_name: str) -> None:
    """Write `module` to `output` through the one atomic writer (common/io.py: a temp file beside it,
    then os.replace; a write failure is one line, exit 74, and leaves no temp file)."""
    def write(path):
        if fmt == "torchscript":
            torch.jit.save(module, path)
        else:
            with threshold_path("device"), torch.no_grad():
                torch.onnx.export(module, (example_images(cfg),), path, dynamo=False, opset_version=EXPORT_OPSET,
                                  input_names=[INPUT_NAME], output_names=["output"],
                                  dynamic_axes={INPUT_NAME: {0: BATCH_AXIS}, "output": {0: BATCH_AXIS}})

    try:
        atomic_write(output, write)
    except (RuntimeError, torch.jit.Error, torch.onnx.errors.OnnxExporterError) as err:
        raise UserError(f"head '{head_name}' cannot be exported as {fmt}: "
                        f"{str(err).strip().splitlines()[0]}") from None


def sidecar(cfg, model, classes, fmt: str, head_probabilities: bool, output: str) -> dict:
    head = model.output_head
    size = cfg.data.image_size
    spec = eval_transform(cfg.data)  # the transform eval.py applies to this run's images
    return {
        "format": fmt, "file": os.path.basename(output),
        "opset": EXPORT_OPSET if fmt == "onnx" else None,
        "input": {"name": INPUT_NAME, "shape": [BATCH_AXIS, 3, size, size], "dtype": "float32",
                  "normalised": "(pixel / 255 - mean) / std, per channel, RGB"},
        "output": "probabilities" if head_probabilities else "logits",
        "classes": list(classes), "class_map": rundir.CLASS_MAP, "preprocessing": spec.describe(),
        "mean": list(spec.mean), "std": list(spec.std),
        "image_size": size, "interpolation": spec.interpolation, "crop_pct": spec.crop_pct,
        "model": cfg.model.name, "norm": cfg.model.norm,
        "head": {"name": head.name, **head.hparams()},
    }


def checked_sidecar(cfg, model, classes, fmt: str, head_probabilities: bool, output: str) -> dict:
    """`sidecar(...)`, refused (one line) where its consumer would refuse it (sidecar_format.py)."""
    record = sidecar(cfg, model, classes, fmt, head_probabilities, output)
    try:
        sidecar_format.check_sidecar(record, sidecar_format.sidecar_path(output), model=output,
                                     input_shape=record["input"]["shape"], num_outputs=model.num_classes)
    except sidecar_format.SidecarError as err:
        raise UserError(f"not writing a sidecar scripts/onnx_predict.py would refuse: {err.problem}") from None
    return record


# Warnings torch gives every export of this model, none of which says something is wrong with it:
# the tracer's about the input-size check (a constant in the trace: the exported model is for one
# image size, which the sidecar records) and the deprecation notices of TorchScript and of the
# TorchScript-based ONNX exporter (still what these mappings export with: their autograd
# Functions are inlined for it). Anything else is shown as torch gives it.
EXPECTED_WARNINGS = (
    (torch.jit.TracerWarning, "Converting a tensor to a Python boolean"),
    (DeprecationWarning, "You are using the legacy TorchScript-based ONNX export"),
    (FutureWarning, "`torch.jit."),
)
EXPECTED_NOTE = ("note: torch's tracer and deprecation warnings for this export were expected and are not shown: the "
                 "input-size check is fixed at trace time (the model is exported for {size} px, as the sidecar says) "
                 "and TorchScript and its ONNX exporter still work in this torch ({version})")


@contextlib.contextmanager
def expected_warnings_filtered(size):
    """Hold back EXPECTED_WARNINGS (one note line instead, when any came), pass every other warning on."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    expected = [w for w in caught if any(issubclass(w.category, cat) and str(w.message).startswith(text)
                                         for cat, text in EXPECTED_WARNINGS)]
    for w in caught:
        if w not in expected:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if expected:
        print(EXPECTED_NOTE.format(size=size, version=torch.__version__))  # with the "wrote" line it precedes


def export_timm_folder(args) -> str:
    """--format timm: the folder timm loads (exporting/timm_folder.py), under the folder's lock."""
    folder = output_of(args)
    run = open_from_args(args)
    timm_folder.check_exportable(run.cfg, head_spec(run.cfg.head.name))  # before reading the weights
    prepare_output(folder, folder=True, make=False)  # before the weights are read; made when written
    classes = run.classes()
    cfg, model = run.cfg, run.build_model(len(classes))
    with writing_into(folder, purpose="export"):  # its own folder: a killed export's temp files go first
        timm_folder.write_folder(folder, cfg, model, classes)
    return folder


def check_class_map(folder: str, classes, overwrite: bool) -> str:
    """The path of the export's class_map.txt (timm's format, beside it); one that lists other
    classes (another run's export in the same folder) is replaced only with --overwrite."""
    path = os.path.join(folder, rundir.CLASS_MAP)
    if os.path.isfile(path) and not overwrite:
        with open(path, encoding="utf-8") as f:
            if f.read() != class_map_text(classes):
                raise UserError(f"{path} lists other classes than this run's; pass --overwrite to replace it, "
                                f"or choose an --output in another folder")
    return path


def export(args) -> str:
    """Export the run as args say; -> the path written. The entry point has run
    exporting.arguments.check_export_args (the flags, the run's path, the packages, the destination)."""
    if args.format == "timm":
        return export_timm_folder(args)
    fmt, output = args.format, output_of(args)
    cfg, model, classes = load_classifier(args)
    class_map = check_class_map(os.path.dirname(os.path.abspath(output)), classes, args.overwrite)
    head = model.output_head
    if fmt == "onnx" and args.head_probabilities and head.spec.draws:
        raise UserError(f"head '{head.name}' cannot be exported as onnx with --head-probabilities: its Monte-Carlo "
                        f"draws come from a torch.Generator, which ONNX has no operator for; export the logits "
                        f"(drop --head-probabilities) or use --format torchscript")
    record = checked_sidecar(cfg, model, classes, fmt, args.head_probabilities, output)
    folder = os.path.dirname(os.path.abspath(output))
    # one writer per folder (a run directory: not while it trains); a killed export's temp files go first
    with writing_into(folder, purpose="export", names=[output, sidecar_format.sidecar_path(output), class_map]), \
            expected_warnings_filtered(cfg.data.image_size):
        module = build_exported(model, cfg, fmt, args.head_probabilities)
        save_export(module, cfg, fmt, output, model.output_head.name)
        write_json(record, sidecar_format.sidecar_path(output))
        atomic_write_text(class_map, class_map_text(classes))
    return output


