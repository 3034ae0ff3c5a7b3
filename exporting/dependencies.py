"""What an export format needs beyond the project's requirements, checked before torch loads:
--format onnx writes through the onnx package (torch's exporter imports it at the end of an export,
so a missing one used to be reported after the model was built, as the head's fault).
requirements-export.txt lists them (with onnxruntime, for scripts/onnx_predict.py); the one line
for a missing one names it and the command that installs that file (scripts/ensure_deps.py: only
what is missing, into this Python)."""
import importlib.util
import os
import sys

from common.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REQUIREMENTS = "requirements-export.txt"
NEEDS = {"onnx": ("onnx",)}  # format -> the modules its export imports (each its pip package's name)


def installed(module: str) -> bool:
    """Whether `module` can be imported, without importing it (an import hook that refuses it: not)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def shown(path: str) -> str:
    """`path` as the user types it here: relative to the current folder when inside it."""
    rel = os.path.relpath(path)
    return path if rel.startswith(os.pardir) else rel


def install_command() -> str:
    return f"{shown(sys.executable)} {shown(os.path.join(ROOT, 'scripts', 'ensure_deps.py'))} " \
           f"{shown(os.path.join(ROOT, REQUIREMENTS))}"


def check_dependencies(fmt: str) -> None:
    """One line naming the packages `fmt` needs that this Python lacks, and how to install them."""
    missing = [m for m in NEEDS.get(fmt, ()) if not installed(m)]
    if missing:
        packages = " and ".join(missing) + (" packages" if len(missing) > 1 else " package")
        raise UserError(f"--format {fmt} needs the {packages}, which {shown(sys.executable)} does not have; "
                        f"install {REQUIREMENTS} with: {install_command()}")
