"""scripts/export.py answers a mistake before torch loads, as every entry point does
(tests/test_config_errors_fast.py: a fresh Python whose import system refuses torch, timm, torchvision
and Accelerate): a missing run, an unknown format, a destination that exists or cannot be written,
and a format whose package is not installed, each one line naming the fix. A Python without onnx is
faked by one more refusing import hook; scripts/onnx_predict.py without onnxruntime (or numpy,
Pillow) is told the same way how to install it, before it reads anything."""
import os
import subprocess
import sys

import pytest

from test_config_errors_fast import REFUSING, ROOT, _run

EXPORT = "scripts/export.py"


def run_without(modules, argv):
    """`_run`, in a Python where `modules` (besides the heavy packages) are not installed."""
    hidden = (
        "import sys\n"
        "class NotInstalled:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.partition('.')[0] in {tuple(modules)!r}:\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NotInstalled())\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", hidden + REFUSING, os.path.join(ROOT, argv[0]), *argv[1:]],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def one_line(done):
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), (done.returncode, done.stderr[-1500:])
    return lines[0]


@pytest.fixture
def run_dir(tmp_path):
    """A run directory as far as the checks before torch look (they read no file in it)."""
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "a_file").write_text("x")
    return run


# (arguments after scripts/export.py, with RUN and TMP for the fixture's paths) -> exit status, what the line says
MISTAKES = {
    "missing run": (["no/such/run", "--format", "onnx"], 2, "checkpoint not found: no/such/run"),
    "unknown format": (["RUN", "--format", "onnxx"], 2, "unknown --format 'onnxx'; did you mean 'onnx'?"),
    "output exists": (["RUN", "--format", "onnx", "--output", "TMP/a_file"], 2,
                      "TMP/a_file exists; pass --overwrite to replace it"),
    "output is a folder": (["RUN", "--format", "torchscript", "--output", "TMP"], 2, "--output TMP is a directory"),
    "output through a file": (["RUN", "--format", "onnx", "--output", "TMP/a_file/m.onnx"], 74,
                              "cannot write TMP/a_file/m.onnx"),
    "timm with probabilities": (["RUN", "--format", "timm", "--head-probabilities"], 2, "drop --head-probabilities"),
    "timm folder is a file": (["RUN", "--format", "timm", "--output", "TMP/a_file"], 2,
                              "--format timm writes a folder"),
    "timm folder through a file": (["RUN", "--format", "timm", "--output", "TMP/a_file/timm"], 74,
                                   "cannot write TMP/a_file/timm"),
}


@pytest.mark.parametrize("case", MISTAKES)
def test_an_export_mistake_is_one_line_before_torch(case, run_dir):
    argv, status, says = MISTAKES[case]
    tmp = str(run_dir.parent)
    done = _run([EXPORT, *[a.replace("RUN", str(run_dir)).replace("TMP", tmp) for a in argv]])
    assert done.returncode == status and says.replace("TMP", tmp) in one_line(done), done.stderr[-1500:]
    assert sorted(os.listdir(tmp)) == ["a_file", "run"] and not os.listdir(run_dir)  # nothing made


def test_a_timm_folder_that_holds_an_export_needs_overwrite(run_dir):
    (run_dir / "timm").mkdir()
    (run_dir / "timm" / "config.json").write_text("{}")
    done = _run([EXPORT, str(run_dir), "--format", "timm"])
    assert done.returncode == 2 and "already holds an export (config.json); pass --overwrite" in one_line(done)


def test_a_valid_export_passes_the_checks_and_reaches_torch(run_dir):
    """The checks above can fail: a command they accept goes on to the export and, in this Python, dies
    at its first torch import, having written nothing (a timm folder that is not there is not made)."""
    for fmt in ("onnx", "timm"):
        done = _run([EXPORT, str(run_dir), "--format", fmt])
        assert done.returncode != 0 and "refused import of torch" in done.stderr, done.stderr[-1500:]
    assert not os.listdir(run_dir)


def test_a_python_without_onnx_is_told_what_to_install_before_torch(run_dir):
    done = run_without(["onnx"], [EXPORT, str(run_dir), "--format", "onnx"])
    line = one_line(done)
    assert done.returncode == 2 and line.startswith("error: --format onnx needs the onnx package, which ")
    python = os.path.relpath(sys.executable) if not os.path.relpath(sys.executable).startswith("..") \
        else sys.executable
    assert line.endswith(f"install requirements-export.txt with: {python} scripts/ensure_deps.py "
                         f"requirements-export.txt"), line  # the command as typed at the root (the cwd here)
    assert "cannot be exported" not in line and not os.listdir(run_dir)
    # the other formats need no onnx: past the checks, to torch
    done = run_without(["onnx"], [EXPORT, str(run_dir), "--format", "torchscript"])
    assert "refused import of torch" in done.stderr and "onnx package" not in done.stderr


@pytest.mark.parametrize("hidden, says", [
    (["onnxruntime"], "needs onnxruntime, which"),
    (["numpy", "PIL"], "needs numpy and Pillow, which"),
])
def test_onnx_predict_without_its_packages_is_one_line_with_the_install_command(hidden, says, tmp_path):
    done = run_without(hidden, ["scripts/onnx_predict.py", str(tmp_path / "model.onnx"), str(tmp_path)])
    line = one_line(done)
    packages = " ".join("Pillow" if m == "PIL" else m for m in hidden)
    assert done.returncode == 2 and says in line and line.endswith(f" -m pip install {packages}"), line
