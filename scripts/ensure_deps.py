"""Install a requirements file only when something in it is missing or too old.

`pip install -r` on an up-to-date environment still costs seconds of resolver work; this check
costs milliseconds, so `make test` and `make quickstart` stay fast once set up (idempotent).

    python scripts/ensure_deps.py requirements-test.txt
"""
import os
import sys
from importlib import metadata

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from engine.children import ChildProcesses  # noqa: E402  (standard library only: fine in a bare environment)

try:
    from packaging.requirements import Requirement
except ImportError:  # a bare environment: pip always vendors packaging
    from pip._vendor.packaging.requirements import Requirement


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


def missing(requirements):
    """The requirements that are not installed, or installed at a version outside their range."""
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


def main():
    paths = sys.argv[1:] or ["requirements.txt"]
    todo = [r for p in paths for r in missing(read_requirements(p))]
    if not todo:
        return 0
    print(f"installing missing requirements: {', '.join(todo)}", flush=True)
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    for p in paths:
        cmd += ["-r", p]
    with ChildProcesses() as children:  # a signal reaches pip too; none is left running
        return children.run(cmd)


if __name__ == "__main__":
    sys.exit(main())
