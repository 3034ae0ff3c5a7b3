"""make's setup on any Linux Python: the project venv (scripts/ensure_venv.py) and the installs
(scripts/ensure_deps.py) against a Python that refuses installs.

The refusing Python is a throwaway interpreter prefix: a copy of this interpreter's binary with its
standard library linked in and an EXTERNALLY-MANAGED marker beside it (PEP 668), as Debian ships.
Its site-packages is the folder this process imports torch from, so it "has torch", like a user's
CUDA environment (also when the tests run inside a venv of their own).
"""
import os
import shutil
import subprocess
import sys
import sysconfig

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENSURE_DEPS = os.path.join(ROOT, "scripts", "ensure_deps.py")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import ensure_deps  # noqa: E402

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


def test_an_installed_torch_is_pinned_when_pip_installs_anything(tmp_path, monkeypatch, capsys):
    req = tmp_path / "req.txt"
    req.write_text("torch>=1.0\n" + MISSING)
    seen = {}

    def run(self, cmd, **_):
        pins = cmd[cmd.index("-c") + 1]
        seen["pins"] = open(pins).read()
        seen["cmd"] = cmd
        return 0

    monkeypatch.setattr(ensure_deps.ChildProcesses, "run", run)
    monkeypatch.setattr(ensure_deps, "externally_managed", lambda: False)
    assert ensure_deps.main([str(req)]) == 0
    from importlib import metadata

    assert f"torch=={metadata.version('torch')}\n" in seen["pins"]
    assert seen["cmd"][-2:] == ["-r", str(req)]
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and "surely-not-installed" in line and "keeping the installed torch" in line
    assert ": surely-not-installed-pkg-q7;" in line  # the satisfied torch is not announced
