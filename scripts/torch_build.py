"""Which build of torch (and torchvision) scripts/ensure_deps.py installs, and from where.

    TORCH_BUILD=auto   (the default) PyTorch's CPU-only wheels on a Linux machine with no NVIDIA GPU
                       visible, else the build on pip's default index
    TORCH_BUILD=cpu    PyTorch's CPU-only wheels (https://download.pytorch.org/whl/cpu), ~0.8 GB
    TORCH_BUILD=cuda   the build on pip's default index: on Linux x86_64, PyPI's torch is the CUDA
                       build, ~5.5 GB with its NVIDIA libraries and triton

Set it in the environment or on make's command line (`make test TORCH_BUILD=cuda`). It only decides
how a missing (or too old) torch is installed: a torch already installed is kept, and a torchvision
added to a CPU torch (version +cpu) comes from the CPU index too (a torchvision built for another
torch fails to load its operators). With `auto`, an unreachable CPU index (an offline mirror, a firewall) falls back
to pip's default index, saying so; an explicit `cpu` goes to the CPU index anyway (pip says why if it
cannot). Standard library only: it runs before anything is installed.
"""
import glob
import os
import platform
import shutil
import ssl
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Optional

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from common.errors import UserError

VARIABLE = "TORCH_BUILD"
BUILDS = ("auto", "cpu", "cuda")
FAMILY = ("torch", "torchvision")  # one build: installed together, from one index
CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's "Get started" page, Compute Platform: CPU
PROBE_TIMEOUT_S = 5
# Roughly what torch puts on disk with its libraries (measured with torch 2.13/2.14 on Linux x86_64:
# the CUDA build 5.5 GB with its NVIDIA libraries and triton, the CPU build 0.76 GB). Off Linux x86_64
# the default index's torch has no CUDA libraries.
LINUX = sys.platform.startswith("linux")
CUDA_WHEELS = LINUX and platform.machine() == "x86_64"
CPU_GB = 0.8
DEFAULT_GB = 5.5 if CUDA_WHEELS else 1.0
DEFAULT_BUILD = (f"the build on pip's default index ({'the CUDA build, ' if CUDA_WHEELS else ''}"
                 f"~{DEFAULT_GB:g} GB)")
CPU_BUILD = f"PyTorch's CPU-only build from {CPU_INDEX} (~{CPU_GB:g} GB)"


@dataclass(frozen=True)
class Choice:
    index: Optional[str]  # pip's --index-url for the torch family; None: pip's default index
    gb: float  # roughly what torch puts on disk (0 when torch itself is kept)
    line: str  # what is installed from where, and why, for the user; "" when nothing differs from pip's default


def requested(environ=None):
    """TORCH_BUILD's value, checked (a typo is refused, also when nothing is to be installed)."""
    value = (os.environ if environ is None else environ).get(VARIABLE, "auto").strip().lower() or "auto"
    if value not in BUILDS:
        raise UserError(f"{VARIABLE}={value!r} is not one of {', '.join(BUILDS)}: use {VARIABLE}=cpu for PyTorch's "
                        f"CPU-only wheels, {VARIABLE}=cuda for the CUDA build, or leave it unset (auto)")
    return value


def gpu_visible(dev="/dev"):
    """An NVIDIA GPU is visible: nvidia-smi on PATH or an NVIDIA device file (its driver is loaded)."""
    return shutil.which("nvidia-smi") is not None or bool(glob.glob(os.path.join(dev, "nvidia*")))


def _tls_context():
    """The system's certificates and pip's own bundle, so that the probe trusts what pip trusts."""
    context = ssl.create_default_context()
    try:
        from pip._vendor import certifi  # optional: a Python without pip probes with the system's certificates
    except ImportError:
        return context
    context.load_verify_locations(certifi.where())
    return context


def why_unreachable(url=CPU_INDEX, timeout=PROBE_TIMEOUT_S):
    """None when `url` answers (through the environment's proxies, as pip would), else why not, in a few words."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout,
                                    context=_tls_context() if url.startswith("https:") else None):
            return None
    except urllib.error.HTTPError as err:
        return f"HTTP {err.code}"
    except urllib.error.URLError as err:
        return str(err.reason)
    except OSError as err:  # a timeout, a reset connection
        return str(err) or type(err).__name__


def choose(names, kept_torch=None, environ=None):
    """The Choice for installing `names` (the members of FAMILY to install); `kept_torch`: the version of
    an installed torch that is kept (then only torchvision is installed, matching its build)."""
    build = requested(environ)
    what = " ".join(names)
    if "torch" not in names:  # torchvision for a torch that stays
        if not (kept_torch or "").endswith("+cpu"):
            return Choice(None, 0, "")
        reason = why_unreachable()
        if reason:
            return Choice(None, 0, f"{what}: from pip's default index, which may not match the installed torch "
                                   f"{kept_torch}: PyTorch's CPU index {CPU_INDEX} is not reachable here ({reason})")
        return Choice(CPU_INDEX, 0, f"{what}: from PyTorch's CPU index {CPU_INDEX}, to match the installed torch "
                                    f"{kept_torch}")
    if build == "cuda":
        return Choice(None, DEFAULT_GB, f"{what}: {DEFAULT_BUILD}, as {VARIABLE}=cuda asks")
    if build == "cpu":
        return Choice(CPU_INDEX, CPU_GB, f"{what}: {CPU_BUILD}, as {VARIABLE}=cpu asks")
    if not LINUX:
        return Choice(None, DEFAULT_GB, f"{what}: {DEFAULT_BUILD}")
    if gpu_visible():
        return Choice(None, DEFAULT_GB, f"{what}: {DEFAULT_BUILD}, as an NVIDIA GPU is visible here; "
                                        f"{VARIABLE}=cpu installs {CPU_BUILD} instead")
    reason = why_unreachable()
    if reason:
        return Choice(None, DEFAULT_GB, f"{what}: {DEFAULT_BUILD}: no NVIDIA GPU is visible here, but PyTorch's "
                                        f"CPU index {CPU_INDEX} is not reachable ({reason})")
    return Choice(CPU_INDEX, CPU_GB, f"{what}: {CPU_BUILD}, as no NVIDIA GPU is visible here (no nvidia-smi, "
                                     f"no /dev/nvidia*); for {DEFAULT_BUILD} set {VARIABLE}=cuda "
                                     f"(make test {VARIABLE}=cuda)")
