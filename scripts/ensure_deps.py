"""Install a requirements file only when something in it is missing or too old.

`pip install -r` on an up-to-date environment still costs seconds of resolver work; this check
costs milliseconds, so `make test` and `make quickstart` stay fast once set up (idempotent).

    python scripts/ensure_deps.py requirements-test.txt

Before installing it says in one line what goes where and roughly how much, and in another which
build of torch it installs (scripts/torch_build.py: PyTorch's CPU-only wheels where no NVIDIA GPU is
visible, TORCH_BUILD=cuda for the CUDA build); a CPU torch goes in first, from PyTorch's CPU index,
then the rest from pip's default index. An installed torch is kept as it is (pinned for pip), so a
torchvision that pip adds must match it instead of pulling a new torch over a user's CUDA build. It
refuses, in one line naming the fix, to install into a Python that has no pip or that is externally
managed (PEP 668: a system Python outside any venv).
"""
import importlib
import importlib.util
import os
import sys
import sysconfig
import tempfile
from importlib import metadata

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from common.children import ChildProcesses
from common.cli import run_cli
from common.errors import UserError  # (standard library only: fine in a bare environment)
from torch_build import FAMILY, VARIABLE, choose, requested

# Where to go instead of this Python (make's default, or an environment of one's own).
FIX = ("run make without PYTHON= (it makes and uses the project's .venv), or point PYTHON= at a virtual or "
       "conda environment of your own")
# Packages a user is told about before they arrive: roughly what pip puts on disk, in GB (torch's
# depends on its build: scripts/torch_build.py).
LARGE_GB = {"nvidia-dali-cuda130": 0.5, "onnxruntime": 0.1, "matplotlib": 0.1}
KEPT = FAMILY  # pinned at their installed versions when pip installs anything


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
        from packaging.requirements import Requirement  # optional: a bare environment may lack packaging
    except ImportError:  # a bare environment: pip always vendors packaging
        try:
            from pip._vendor.packaging.requirements import Requirement  # optional: pip's own copy
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
        version = installed(req.name)
        if version is None:
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


def names_of(todo):
    Requirement = _requirement_type()
    return [Requirement(t).name for t in todo]


def install_line(todo, torch_gb=0):
    """One line: what goes into which Python, and roughly how much (`torch_gb`: its chosen build's)."""
    names = names_of(todo)
    size = sum(torch_gb if n == "torch" else LARGE_GB.get(n, 0.02) for n in names)
    line = f"installing {len(names)} missing requirement(s) into {sys.executable}, roughly {size:.1f} GB"
    keep = ", ".join(f"{k} {v}" for k, v in kept(todo).items())
    return line + f": {' '.join(names)}" + (f"; keeping the installed {keep}" if keep else "")


def pip_install(children, pins, todo, targets, index=None):
    """Run pip on `targets` (requirement strings or -r FILE pairs), the KEPT packages installed now pinned
    (`todo`: what is missing now); -> pip's exit status."""
    with open(pins, "w") as f:  # a user's torch (e.g. a CUDA build) stays as it is
        f.write("".join(f"{k}=={v}\n" for k, v in kept(todo).items()))
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", pins]
    return children.run(cmd + (["--index-url", index] if index else []) + list(targets))


def family_failed(names, index, status):
    """The one line for pip failing on torch's own index."""
    fix = (f"{VARIABLE}=cuda installs torch from pip's default index instead" if "torch" in names else
           f"install a torchvision built for torch {installed('torch')} yourself")
    return f"pip could not install {' '.join(names)} from {index} (exit {status}, its message above); {fix}"


def main(argv=None):
    paths = (sys.argv[1:] if argv is None else argv) or ["requirements.txt"]
    requested()  # a typo in TORCH_BUILD is refused also when nothing is missing
    todo = [r for p in paths for r in missing(read_requirements(p))]
    if not todo:
        return 0
    if externally_managed():
        raise UserError(f"{sys.executable} is managed by the system (PEP 668: pip may not install the "
                        f"{len(todo)} missing requirement(s) into it); {FIX}")
    if importlib.util.find_spec("pip") is None:
        raise UserError(f"{sys.executable} has no pip to install the {len(todo)} missing requirement(s) with; {FIX}")
    family = [t for t, n in zip(todo, names_of(todo)) if n in FAMILY]
    choice = choose(names_of(family), installed("torch")) if family else None
    print(install_line(todo, choice.gb if choice else 0), flush=True)
    if choice and choice.line:
        print(choice.line, flush=True)
    with tempfile.TemporaryDirectory() as tmp, ChildProcesses() as children:  # a signal reaches pip too
        pins = os.path.join(tmp, "keep.txt")
        status = 0
        if choice and choice.index:  # torch's build first, from its own index; then the rest, torch pinned
            status = pip_install(children, pins, todo, family, choice.index)
            if status and not children.stopped:
                raise UserError(family_failed(names_of(family), choice.index, status))
            importlib.invalidate_caches()  # so that the metadata of what pip just added is read
            todo = [r for p in paths for r in missing(read_requirements(p))]
        if todo and not status:
            status = pip_install(children, pins, todo, [a for p in paths for a in ("-r", p)])
        stopped = children.stopped
    if status and not stopped:
        raise UserError(f"pip could not install the requirements (exit {status}, its message above); with a torch "
                        f"of your own, install a torchvision built for it from the same place, or {FIX}")
    return status


if __name__ == "__main__":
    run_cli(main)
