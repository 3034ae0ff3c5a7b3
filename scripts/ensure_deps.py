"""Install a requirements file only when something in it is missing or too old.

`pip install -r` on an up-to-date environment still costs seconds of resolver work; this check
costs milliseconds, so `make test` and `make quickstart` stay fast once set up (idempotent).

    python scripts/ensure_deps.py requirements-test.txt

Before installing it says in one line what goes where and roughly how much. An installed torch is
kept as it is (pinned for pip), so a torchvision that pip adds must match it instead of pulling a
new torch over a user's CUDA build. It refuses, in one line naming the fix, to install into a Python
that has no pip or that is externally managed (PEP 668: a system Python outside any venv).
"""
import os
import platform
import sys
import sysconfig
import tempfile
from importlib import metadata

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from common.children import ChildProcesses
from common.cli import run_cli
from common.errors import UserError  # (standard library only: fine in a bare environment)

# Where to go instead of this Python (make's default, or an environment of one's own).
FIX = ("run make without PYTHON= (it makes and uses the project's .venv), or point PYTHON= at a virtual or "
       "conda environment of your own")
# Packages a user is told about before they arrive: roughly what pip puts on disk, in GB.
LARGE_GB = {"torch": 5.5 if sys.platform.startswith("linux") and platform.machine() == "x86_64" else 1,
            "nvidia-dali-cuda130": 0.5, "onnxruntime": 0.1, "matplotlib": 0.1}
KEPT = ("torch", "torchvision")  # pinned at their installed versions when pip installs anything


def read_requirements(path):
    """Yield requirement strings from a requirements file, following `-r other.txt` includes."""
    base = os.path.dirname(os.path.abspath(path))
    with open(path) as f:
        for raw in f:
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if line.startswith("-r "):
                yield from read_requirements(os.path.join(base, line[3:].strip()))
            else:
                yield line


def _requirement_type():
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a bare environment: pip always vendors packaging
        try:
            from pip._vendor.packaging.requirements import Requirement
        except ImportError:
            raise UserError(f"{sys.executable} has no pip to install the requirements with; {FIX}") from None
    return Requirement


def missing(requirements):
    """The requirements that are not installed, or installed at a version outside their range."""
    Requirement = _requirement_type()
    out = []
    for text in requirements:
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate():
            continue  # not for this platform (e.g. DALI's Linux-only wheels)
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            out.append(text)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            out.append(text)
    return out


def externally_managed():
    """PEP 668: the marker file in the stdlib folder of a Python that is not a virtual environment."""
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    return not in_venv and os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))


def installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def kept(todo):
    """{name: version} of the KEPT packages installed at a version the requirements accept."""
    Requirement = _requirement_type()
    names = {Requirement(t).name for t in todo}
    return {k: installed(k) for k in KEPT if installed(k) and k not in names}


def install_line(todo):
    """One line: what goes into which Python, and roughly how much (torch, the big one, named)."""
    Requirement = _requirement_type()
    names = [Requirement(t).name for t in todo]
    size = sum(LARGE_GB.get(n, 0.02) for n in names)
    line = f"installing {len(names)} missing requirement(s) into {sys.executable}, roughly {size:.1f} GB"
    if "torch" in names and LARGE_GB["torch"] > 1:
        line += (" (torch with its CUDA libraries is ~5.5 GB; on a machine without a GPU install PyTorch's "
                 "CPU-only wheels first, see docs/install.md)")
    keep = ", ".join(f"{k} {v}" for k, v in kept(todo).items())
    return line + f": {' '.join(names)}" + (f"; keeping the installed {keep}" if keep else "")


def main(argv=None):
    paths = (sys.argv[1:] if argv is None else argv) or ["requirements.txt"]
    todo = [r for p in paths for r in missing(read_requirements(p))]
    if not todo:
        return 0
    if externally_managed():
        raise UserError(f"{sys.executable} is managed by the system (PEP 668: pip may not install the "
                        f"{len(todo)} missing requirement(s) into it); {FIX}")
    import importlib.util

    if importlib.util.find_spec("pip") is None:
        raise UserError(f"{sys.executable} has no pip to install the {len(todo)} missing requirement(s) with; {FIX}")
    print(install_line(todo), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        pins = os.path.join(tmp, "keep.txt")  # a user's torch (e.g. a CUDA build) stays as it is
        with open(pins, "w") as f:
            f.write("".join(f"{k}=={v}\n" for k, v in kept(todo).items()))
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", pins]
        for p in paths:
            cmd += ["-r", p]
        with ChildProcesses() as children:  # a signal reaches pip too; none is left running
            status = children.run(cmd)
            stopped = children.stopped
    if status and not stopped:
        raise UserError(f"pip could not install the requirements (exit {status}, its message above); with a torch "
                        f"of your own, install a torchvision built for it from the same place, or {FIX}")
    return status


if __name__ == "__main__":
    run_cli(main)
