"""scripts/export.py's application: a trained run as ONNX or TorchScript with a JSON sidecar, or as a
folder timm loads by itself.

- arguments.py: the command line and every check of it, of the paths and of the format's packages,
  torch-free, so a mistake is answered before torch loads (destinations.py: where an export goes;
  dependencies.py: what a format needs installed).
- exporter.py: the ONNX and TorchScript export (the body scripts/export.py runs after the checks).
- timm_folder.py: --format timm.

The sidecar's one definition is common/sidecar_format.py (standard library only), shared with
scripts/onnx_predict.py, which loads it by its path, and with data/classes.py (the class-list rule).
"""
