"""Models: the ResMLP family (models/resmlp.py) and the swappable output heads (models/heads.py).

    import timm, models          # or: import models, timm / from models import create_classifier
    timm.create_model("resmlp_tiny", num_classes=10)

Registration with timm: `import models` registers the resmlp_* variants with timm whenever timm is
imported, in either order. If timm is already imported, models.resmlp is imported at once; if not,
a one-shot import hook (common/after_import.py) imports it right after timm's own import finishes.

Importing the package itself imports neither torch nor timm: the declarations (models/registry.py,
models/names.py, models/head_checks.py) are read by the config loader, which answers a mistake
before torch loads, and the hook costs nothing until something imports timm. The names below load
their module on first use (PEP 562)."""
import importlib

from common.after_import import run_after_import

_EXPORTS = {
    "convert_state_dict": "convert", "load_pretrained": "convert",
    "OutputHead": "heads",
    "softmax": "mappings", "sparsemax": "mappings", "entmax15": "mappings", "entmax_bisect": "mappings",
    "softmax_loss": "losses", "sparsemax_loss": "losses", "entmax15_loss": "losses", "entmax_bisect_loss": "losses",
    "HEAD_NAMES": "registry", "HPARAMS": "registry",
    "MODEL_NAMES": "names",
    "Affine": "resmlp", "ResMLP": "resmlp", "create_resmlp": "resmlp",
    "create_classifier": "classifier",
}


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def _register_with_timm():
    importlib.import_module(".resmlp", __name__)  # its @register_model functions run on import


run_after_import("timm", _register_with_timm)

__all__ = [*_EXPORTS]
