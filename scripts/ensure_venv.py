"""Make the project's virtual environment (default .venv) the first time `make` needs it; reuse it after.

    python3 scripts/ensure_venv.py .venv      # run by `make test` / `make quickstart` unless PYTHON= is set

Why a virtual environment: a system Python (Debian's and Ubuntu's /usr/bin/python3) refuses pip
installs (PEP 668, "externally-managed-environment"), and a pyenv or conda base Python would get
several GB of packages it never asked for. Installs go into the venv instead, and only there.

Why it may see the base Python's packages: when the Python that makes it already has torch (for
example a CUDA build the user installed for their GPU), the venv is made with
--system-site-packages, so that torch is used as it is and only what is missing is installed into
the venv; without torch it is a clean, isolated venv. The choice is printed when it is made.
Standard library only: it runs before anything is installed.
"""
import importlib.util
import os
import sys
import venv

FIX = "or point PYTHON= at a Python environment of your own (make test PYTHON=/path/to/python)"


def venv_python(path):
    return os.path.join(path, "bin", "python")


def is_ready(path):
    """A venv that was made to the end: its python and pip are there (an interrupted make has no pip)."""
    lib = os.path.join(path, "lib")
    pip = any(os.path.isdir(os.path.join(lib, d, "site-packages", "pip"))
              for d in (os.listdir(lib) if os.path.isdir(lib) else ()))
    return os.path.exists(venv_python(path)) and pip


def main(argv):
    path = argv[0] if argv else ".venv"
    if is_ready(path):
        return 0
    if os.path.lexists(venv_python(path)) and not os.path.exists(venv_python(path)):
        print(f"error: {path} was made by a Python that is gone ({venv_python(path)} is a broken link); "
              f"remove {path} and rerun, {FIX}", file=sys.stderr)
        return 2
    if importlib.util.find_spec("ensurepip") is None:
        print(f"error: {sys.executable} cannot make a virtual environment (no ensurepip module; on Debian or "
              f"Ubuntu: sudo apt install python3-venv), {FIX}", file=sys.stderr)
        return 2
    keep_torch = importlib.util.find_spec("torch") is not None
    if keep_torch:
        how = ("it sees this Python's packages (--system-site-packages), so the torch installed there is kept "
               "and only what is missing goes into the venv")
    else:
        how = "an isolated venv; torch and the rest are installed into it next"
    print(f"making the project's virtual environment {path} from {sys.executable}: {how}", flush=True)
    try:
        venv.EnvBuilder(system_site_packages=keep_torch, with_pip=True).create(path)
    except Exception as err:  # OSError, or ensurepip failing (CalledProcessError)
        print(f"error: could not make {path} ({err}); remove it and rerun, {FIX}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
