"""make's setup on any Linux Python: the project venv (scripts/ensure_venv.py) and the installs
(scripts/ensure_deps.py) against a Python that refuses installs, and the build of torch they choose
(scripts/torch_build.py): the pip command lines are checked, pip is never run.

The refusing Python is a throwaway interpreter prefix: a copy of this interpreter's binary with its
standard library linked in and an EXTERNALLY-MANAGED marker beside it (PEP 668), as Debian ships.
Its site-packages is the folder this process imports torch from, so it "has torch", like a user's
CUDA environment (also when the tests run inside a venv of their own).
"""
import http.server
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENSURE_DEPS = os.path.join(ROOT, "scripts", "ensure_deps.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import ensure_deps  # noqa: E402
import torch_build  # noqa: E402
from common.errors import UserError  # noqa: E402

MISSING = "surely-not-installed-pkg-q7>=1.0\n"


def _run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT, **kw)


@pytest.fixture(scope="module")
def managed_python(tmp_path_factory):
    """bin/python3 of a throwaway prefix whose stdlib carries the PEP 668 marker."""
    prefix = tmp_path_factory.mktemp("managed")
    stdlib = sysconfig.get_path("stdlib")
    lib = prefix / "lib" / os.path.basename(stdlib)
    lib.mkdir(parents=True)
    import torch

    for entry in os.listdir(stdlib):
        if entry != "site-packages":
            os.symlink(os.path.join(stdlib, entry), lib / entry)
    os.symlink(os.path.dirname(os.path.dirname(torch.__file__)), lib / "site-packages")
    (lib / "EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=a system Python (simulated)\n")
    (prefix / "bin").mkdir()
    python = prefix / "bin" / "python3"
    shutil.copy(os.path.realpath(sys._base_executable), python)
    probe = _run([str(python), "-c", "import sys, sysconfig; print(sys.prefix, sysconfig.get_path('stdlib'))"])
    if probe.returncode != 0 or str(prefix) not in probe.stdout:
        pytest.skip(f"this interpreter does not run from a copied prefix: {probe.stderr[-300:]}")
    return str(python)


def test_a_managed_python_is_refused_in_one_line(managed_python, tmp_path):
    req = tmp_path / "req.txt"
    req.write_text(MISSING)
    proc = _run([managed_python, ENSURE_DEPS, str(req)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: ")
    assert "PEP 668" in proc.stderr and "without PYTHON=" in proc.stderr and \
        "the 1 missing requirement(s)" in proc.stderr
    assert "surely-not-installed" not in proc.stderr  # the count, not the list (18 names on a fresh machine)


@pytest.mark.skipif(shutil.which("make") is None, reason="drives the Makefile")
def test_make_builds_a_venv_that_keeps_the_base_torch_and_reuses_it(managed_python, tmp_path):
    """`make venv` from the refusing Python: a venv that sees its torch (nothing to install for the
    runtime requirements), reused by the next make."""
    venv = tmp_path / "venv"
    made = _run(["make", "--no-print-directory", "venv", f"BASE_PYTHON={managed_python}", f"VENV={venv}"])
    assert made.returncode == 0, made.stdout + made.stderr
    assert "--system-site-packages" in made.stdout and "torch installed there is kept" in made.stdout
    python = str(venv / "bin" / "python")
    req = tmp_path / "req.txt"
    req.write_text("torch>=1.0\n")
    deps = _run([python, ENSURE_DEPS, str(req)])
    # the base torch counts: nothing installed
    assert deps.returncode == 0 and deps.stdout == "", deps.stdout + deps.stderr
    again = _run(["make", "--no-print-directory", "venv", f"BASE_PYTHON={managed_python}", f"VENV={venv}"])
    assert again.returncode == 0 and "making" not in again.stdout
    # pip works in the venv: the marker binds only the system Python
    pip = _run([python, "-m", "pip", "--version"])
    assert pip.returncode == 0 and str(venv) in pip.stdout


def test_a_python_without_pip_is_told_what_to_do(tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True, timeout=60)
    req = tmp_path / "req.txt"
    req.write_text(MISSING)
    proc = _run([str(bare / "bin" / "python"), ENSURE_DEPS, str(req)])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "has no pip" in proc.stderr and "PYTHON=" in proc.stderr


class FakePip:
    """ChildProcesses.run in place of pip: records each command line with its pins file, and "installs"
    a command's FAMILY requirements at the version in `builds` (so that the next step sees them)."""

    def __init__(self, env, builds=None, status=0):
        self.env, self.builds, self.status, self.calls = env, builds or {}, status, []

    def run(self, cmd):
        with open(cmd[cmd.index("-c") + 1]) as f:
            self.calls.append((cmd, f.read()))
        for name, version in self.builds.items():
            if any(a.startswith(name + ">") for a in cmd):
                self.env[name] = version
        return self.status


def never(what):
    def fail(*_, **__):
        raise AssertionError(f"{what} consulted")
    return fail


@pytest.fixture
def setup(monkeypatch, tmp_path):
    """-> install(requirements text, {name: installed version or None}, builds=...): (FakePip, stdout lines);
    the GPU and network probes fail the test unless a test sets them."""
    monkeypatch.delenv(torch_build.VARIABLE, raising=False)
    monkeypatch.setattr(ensure_deps, "externally_managed", lambda: False)
    monkeypatch.setattr(torch_build, "LINUX", True)
    monkeypatch.setattr(torch_build, "gpu_visible", never("the GPU probe"))
    monkeypatch.setattr(torch_build, "why_unreachable", never("the network"))
    real_installed = ensure_deps.installed
    req = tmp_path / "req.txt"

    def install(text, env, builds=None, status=0, capsys=None):
        req.write_text(text)
        monkeypatch.setattr(ensure_deps, "installed", lambda n: env[n] if n in env else real_installed(n))
        pip = FakePip(env, builds, status)
        monkeypatch.setattr(ensure_deps.ChildProcesses, "run", lambda children, cmd, **_: pip.run(cmd))
        return pip, ensure_deps.main([str(req)])

    install.req = str(req)
    return install


TORCH_REQS = "torch>=2.4\ntorchvision>=0.19\n"
CPU_BUILDS = {"torch": "2.14.1+cpu", "torchvision": "0.29.1+cpu"}


def test_an_installed_torch_is_pinned_when_pip_installs_anything(setup, capsys):
    """A torch that is there is kept: one pip command on the default index, torch pinned, no probe."""
    from importlib import metadata

    pip, status = setup("torch>=1.0\n" + MISSING, {})
    assert status == 0 and len(pip.calls) == 1
    cmd, pins = pip.calls[0]
    assert f"torch=={metadata.version('torch')}\n" in pins
    assert cmd[-2:] == ["-r", setup.req] and "--index-url" not in cmd
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "surely-not-installed" in line and "keeping the installed torch" in line
    assert ": surely-not-installed-pkg-q7;" in line  # the satisfied torch is not announced


def test_no_gpu_installs_pytorchs_cpu_wheels_first_then_the_rest_with_them_pinned(setup, monkeypatch, capsys):
    monkeypatch.setattr(torch_build, "gpu_visible", lambda: False)
    monkeypatch.setattr(torch_build, "why_unreachable", lambda: None)
    pip, status = setup(TORCH_REQS + MISSING, {"torch": None, "torchvision": None}, CPU_BUILDS)
    assert status == 0 and len(pip.calls) == 2
    (first, first_pins), (rest, rest_pins) = pip.calls
    i = first.index("--index-url")
    assert first[i + 1] == "https://download.pytorch.org/whl/cpu" == torch_build.CPU_INDEX
    assert first[i + 2:] == ["torch>=2.4", "torchvision>=0.19"] and "-r" not in first and first_pins == ""
    assert rest[-2:] == ["-r", setup.req] and "--index-url" not in rest
    assert rest_pins == "torch==2.14.1+cpu\ntorchvision==0.29.1+cpu\n"  # the rest cannot swap in a CUDA torch
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "roughly 0.8 GB: torch torchvision surely-not-installed-pkg-q7" in out[0]
    assert "CPU-only build from https://download.pytorch.org/whl/cpu (~0.8 GB)" in out[1]
    assert "no NVIDIA GPU is visible" in out[1] and "TORCH_BUILD=cuda" in out[1]


def test_a_visible_gpu_gets_the_default_index_build(setup, monkeypatch, capsys):
    monkeypatch.setattr(torch_build, "gpu_visible", lambda: True)
    pip, status = setup(TORCH_REQS + MISSING, {"torch": None, "torchvision": None})
    assert status == 0 and len(pip.calls) == 1
    cmd, pins = pip.calls[0]
    assert cmd[-2:] == ["-r", setup.req] and "--index-url" not in cmd and pins == ""
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and f"roughly {torch_build.DEFAULT_GB + 0.04:.1f} GB" in out[0]
    assert "pip's default index" in out[1] and "NVIDIA GPU is visible" in out[1] and "TORCH_BUILD=cpu" in out[1]


def test_an_unreachable_cpu_index_falls_back_to_the_default_index_in_one_line(setup, monkeypatch, capsys):
    """This machine (and CI's): no GPU, download.pytorch.org unreachable; pip's default index serves torch."""
    monkeypatch.setattr(torch_build, "gpu_visible", lambda: False)
    monkeypatch.setattr(torch_build, "why_unreachable", lambda: "Name or service not known")
    pip, status = setup(TORCH_REQS + MISSING, {"torch": None, "torchvision": None})
    assert status == 0 and len(pip.calls) == 1
    cmd, _ = pip.calls[0]
    assert cmd[-2:] == ["-r", setup.req] and "--index-url" not in cmd
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "pip's default index" in out[1] and \
        "https://download.pytorch.org/whl/cpu is not reachable (Name or service not known)" in out[1]


@pytest.mark.parametrize("build", ["cpu", "CUDA"])
def test_torch_build_decides_without_probing(setup, monkeypatch, capsys, build):
    monkeypatch.setenv("TORCH_BUILD", build)
    pip, status = setup(TORCH_REQS, {"torch": "2.0.0", "torchvision": None}, CPU_BUILDS)  # torch too old
    assert status == 0 and len(pip.calls) == 1
    cmd, _ = pip.calls[0]
    if build == "cpu":
        assert cmd[-4:] == ["--index-url", torch_build.CPU_INDEX, "torch>=2.4", "torchvision>=0.19"]
    else:
        assert cmd[-2:] == ["-r", setup.req] and "--index-url" not in cmd
    assert f"as TORCH_BUILD={build.lower()} asks" in capsys.readouterr().out


def test_a_typo_in_torch_build_is_refused_before_anything_else(setup, monkeypatch):
    monkeypatch.setenv("TORCH_BUILD", "gpu")
    for text in (TORCH_REQS, "torch>=1.0\n"):  # also when nothing is missing
        with pytest.raises(UserError, match=r"TORCH_BUILD='gpu' is not one of auto, cpu, cuda: use TORCH_BUILD=cpu"):
            setup(text, {"torch": None, "torchvision": None} if text == TORCH_REQS else {})


def test_a_torchvision_added_to_a_cpu_torch_comes_from_the_cpu_index(setup, monkeypatch, capsys):
    """A CPU torch that stays gets a torchvision built for it (PyPI's fails to load its operators on it);
    nothing else is missing, so pip runs once."""
    monkeypatch.setattr(torch_build, "why_unreachable", lambda: None)
    monkeypatch.setenv("TORCH_BUILD", "cuda")  # about installing torch: a kept torch decides
    pip, status = setup(TORCH_REQS, {"torch": "2.5.1+cpu", "torchvision": None}, CPU_BUILDS)
    assert status == 0 and len(pip.calls) == 1
    cmd, pins = pip.calls[0]
    assert cmd[-3:] == ["--index-url", torch_build.CPU_INDEX, "torchvision>=0.19"] and pins == "torch==2.5.1+cpu\n"
    assert "to match the installed torch 2.5.1+cpu" in capsys.readouterr().out


def test_pip_failing_on_the_cpu_index_is_one_line_and_stops(setup, monkeypatch):
    monkeypatch.setenv("TORCH_BUILD", "cpu")
    with pytest.raises(UserError, match=r"^pip could not install torch torchvision from https://download.pytorch.org"
                                        r"/whl/cpu \(exit 1, its message above\); TORCH_BUILD=cuda installs"):
        setup(TORCH_REQS + MISSING, {"torch": None, "torchvision": None}, status=1)


def test_the_gpu_probe_sees_nvidia_smi_or_a_device_file(tmp_path, monkeypatch):
    dev, path = tmp_path / "dev", tmp_path / "bin"
    dev.mkdir()
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    (dev / "null").touch()
    assert not torch_build.gpu_visible(str(dev))
    (dev / "nvidiactl").touch()
    assert torch_build.gpu_visible(str(dev))
    (dev / "nvidiactl").unlink()
    smi = path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n")
    smi.chmod(0o755)
    assert torch_build.gpu_visible(str(dev))


class _Index(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):
        self.send_response(200 if self.path == "/whl/cpu" else 404)
        self.end_headers()

    def log_message(self, *_):
        pass


def test_the_reachability_probe_answers_in_a_few_words(monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert torch_build.why_unreachable(url + "/whl/cpu") is None
        assert torch_build.why_unreachable(url + "/nothing") == "HTTP 404"
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as s:  # a port nobody listens on: refused
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    reason = torch_build.why_unreachable(f"http://127.0.0.1:{closed}/whl/cpu", timeout=5)
    assert reason and "refused" in reason.lower()


def test_install_page_names_the_choice():
    with open(os.path.join(ROOT, "docs", "install.md"), encoding="utf-8") as f:
        page = f.read()
    assert torch_build.CPU_INDEX in page and all(f"TORCH_BUILD={b}" in page for b in ("cpu", "cuda"))
