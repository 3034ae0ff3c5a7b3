"""Export a trained classifier as ONNX or TorchScript, with a JSON sidecar describing its input, or as timm weights.

    python scripts/export.py runs/quickstart --format onnx                       # -> runs/quickstart/model.onnx
    python scripts/export.py runs/quickstart --format torchscript --head-probabilities --ema
    python scripts/export.py w.safetensors --model resmlp_tiny --head sparsemax --format onnx --output m.onnx
    python scripts/export.py runs/s12 --format timm                              # -> runs/s12/timm/ (a folder)

--format timm writes a folder timm loads without this project (exporting/timm_folder.py): weights
in timm's names, config.json in timm's Hugging Face Hub layout, class_map.txt and a model card.
--format onnx needs the onnx package (requirements-export.txt, with onnxruntime for
scripts/onnx_predict.py): a Python without it is told the command that installs it.

The exported module maps float32 images (B, C, H, W), already normalised with the sidecar's mean
and std, to logits (B, K), or with --head-probabilities to the head's probabilities (B, K), through
the sparse heads' fixed-shape threshold path (exporting/exporter.py). The batch dimension is
dynamic; the image size is fixed by the model.
Sidecar (OUTPUT.json): format, output (logits | probabilities), classes, `preprocessing` (the run's
evaluation transform step by step: data/transforms.py EvalTransform.describe; mean, std, image size,
interpolation and crop_pct also at the top level), the model and the head with its settings.
scripts/onnx_predict.py is a consumer that follows only the sidecar (onnxruntime, numpy, Pillow).
Both check it with common/sidecar_format.py, the export before it writes anything: a sidecar its
consumer would refuse is never written.
class_map.txt beside OUTPUT lists the classes in timm's class_map format. The files are written
atomically; an existing OUTPUT (or a class_map.txt of other classes) needs --overwrite. The run directory or
weights file is opened as eval.py opens it (inference/trained_run.py: config.yaml, classes.json,
model[_ema].safetensors), its weights checked against the sha256 the run recorded for them
(inference/weights_record.py: a changed file is refused unless --accept-changed-weights).
The command line, the run's path, the format's packages and the destination are checked before
torch loads (exporting/arguments.py), each mistake one line.
"""
import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from common.cli import run_cli
from common.startup import say_loading
from exporting import arguments  # (torch-free: a mistake is answered before torch loads)
from exporting.destinations import TIMM_FILES


def parse_args(argv=None):
    return arguments.parse_export_args(argv, __doc__)


def main(argv=None):
    args = parse_args(argv)
    arguments.check_export_args(args)
    say_loading("export.py")  # before the imports' seconds, so the command does not look hung
    from exporting import exporter  # heavy: torch and timm (seconds), after the checks

    output = exporter.export(args)
    if args.format == "timm":
        print(f"wrote {output}/ (timm: {', '.join(TIMM_FILES)})")
    else:
        print(f"wrote {output} and {output}.json")


if __name__ == "__main__":
    run_cli(main)
