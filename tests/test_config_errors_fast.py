"""A mistake on the command line is answered before torch, timm, torchvision or Accelerate load:
every entry point checks its flags, its config (keys, types, ranges, choices, the head and dataset
declarations) and the paths it must read first, so the one-line answer costs a fraction of a
second instead of the seconds of those imports.

Each command runs in a fresh Python whose import system refuses those packages: an answer that
needed them fails there with the refused import, on any machine speed. The CPU time of one such
answer is also measured against `python -c pass` in the same run. TMP in a command is a fresh folder
(`scene`) holding what the mistakes point at; no mistake may create or change anything there."""
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys

import pytest

from common.runlock import process_record
from configs import load_config, save_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("torch", "timm", "torchvision", "accelerate")
# a fresh interpreter that refuses the heavy packages, then runs the entry point as `python FILE ARGS`
REFUSING = (
    "import runpy, sys\n"
    "class Refuse:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    f"        if name.partition('.')[0] in {HEAVY!r}:\n"
    "            raise ImportError('refused import of ' + name)\n"
    "sys.meta_path.insert(0, Refuse())\n"
    "sys.argv = sys.argv[1:]\n"
    "sys.path.insert(0, __import__('os').path.dirname(__import__('os').path.abspath(sys.argv[0])))\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n")

MISTAKES = [
    (["train.py", "--config", "configs/quickstart.yaml", "optim.lrr=1"], "did you mean 'optim.lr'"),
    (["train.py", "--config", "configs/quickstart.yaml", "head.name=entmax_bisect", "head.alpha=3"], "head.alpha"),
    (["train.py", "--config", "configs/quickstart.yaml", "head.name=sparsmax"], "did you mean 'sparsemax'"),
    (["train.py", "--config", "configs/quickstart.yaml", "data.dataset=cifar11"], "did you mean 'cifar10'"),
    (["train.py", "--config", "configs/quickstart.yaml", "model.pool_k=3"], "model.pool_k"),
    (["train.py", "--config", "configs/no_such.yaml"], "config file not found"),
    (["scripts/compare_heads.py", "--config", "configs/quickstart_compare.yaml", "--seeds", "0", "optim.lrr=1"],
     "did you mean 'optim.lr'"),
    (["scripts/compare_heads.py", "--config", "configs/quickstart_compare.yaml", "--margin", "top11=0.5"],
     "did you mean 'top1'"),
    (["scripts/compare_heads.py", "--config", "configs/quickstart_compare.yaml", "--heads", "softmaxx"],
     "did you mean 'softmax'"),
    (["eval.py", "--checkpoint", "runs/x", "--split", "vall"], "did you mean 'val'"),
    (["eval.py", "--checkpoint", "no/such/run"], "checkpoint not found"),
    (["predict.py", "--checkpoint", "runs/x", "--images", "x", "--output", "p.csv", "--precision", "fp16"],
     "unknown --precision 'fp16'"),
    (["predict.py", "--checkpoint", "no/such/run", "--images", "x", "--output", "p.csv"], "checkpoint not found"),
    (["scripts/extract_features.py", "--checkpoint", "runs/x", "--output", "f", "--splits", "vall"],
     "did you mean 'val'"),
    (["scripts/extract_features.py", "--checkpoint", "runs/x", "--output", "f", "--views", "2"], "without --augment"),
    (["predict.py", "--checkpoint", "TMP/run", "--output", "TMP/p.csv", "--images", "TMP/empty"],
     "TMP/empty is empty (no files, searched recursively)"),
    (["predict.py", "--checkpoint", "TMP/run", "--output", "TMP/p.csv", "--images", "TMP/notes"],
     "TMP/notes holds 1 file(s) but no images"),
    (["predict.py", "--checkpoint", "TMP/run", "--output", "TMP/p.csv", "--images", "TMP/no_such_folder"],
     "--images TMP/no_such_folder: no such folder, file or glob match"),
    (["predict.py", "--checkpoint", "TMP/run", "--output", "TMP/p.csv", "--images", "TMP/empty/*.jpg"],
     "no file matches --images"),
    (["train.py", "--config", "configs/quickstart.yaml", "train.output_dir=TMP/old_run"],
     "TMP/old_run already holds a run (summary.json): pass --resume auto to continue it, or --overwrite"),
    (["train.py", "--config", "configs/quickstart.yaml", "--overwrite", "train.output_dir=TMP/locked"],
     "TMP/locked is in use by another run (pid"),
    (["train.py", "--config", "configs/quickstart.yaml", "train.output_dir=TMP/old_run", "--resume", "auto",
      "--overwrite"], "contradict each other"),
    (["train.py", "--config", "configs/quickstart.yaml", "haed.name=sparsemax"], "did you mean 'head.name'"),
    (["scripts/compare_heads.py", "--config", "configs/quickstart_compare.yaml", "--heads", "softmax,sparsemax"],
     "separated by spaces, not commas: --heads softmax sparsemax"),
    (["train.py", "--config", "configs/quickstart.yaml", "--seed", "1"],
     "train.seed is a config key, set as train.seed=1"),
    (["train.py", "--config", "configs/quickstart.yml"], "did you mean configs/quickstart.yaml?"),
    (["train.py", "--config", "TMP/quickstart.yml"], "configs end in .yaml"),
    # absurd numbers and depths (issue 45): the limit named, nothing read further (TMP/deep.yaml: 20,000 deep)
    (["train.py", "--config", "TMP/deep.yaml"], "malformed YAML at TMP/deep.yaml:1: collections nested deeper than 64"),
    (["eval.py", "--checkpoint", "TMP/deep_run"], "TMP/deep_run/config.yaml:1: collections nested deeper than 64"),
    (["scripts/compare_heads.py", "--config", "TMP/deep.yaml", "--seeds", "0"], "collections nested deeper than 64"),
    (["train.py", "--config", "configs"], "config file configs is a folder, not a file; name a .yaml file in it"),
    (["scripts/compare_heads.py", "--config", "configs/quickstart_compare.yaml", "--until-settled", "--looks", "3",
      "99999999999999999999"], "--looks must be at most 1000 (seeds per variant"),
    (["scripts/compare_heads.py", "--config", "configs/quickstart_compare.yaml", "--until-settled", "--max-seeds",
      "99999999999999999999"], "--max-seeds must be at most 1000 (seeds per variant"),
    (["scripts/compare_heads.py", "--config", "configs/quickstart_compare.yaml", "--margin", "top1=1_0"],
     "--margin 'top1=1_0': write the margin in plain digits"),
    (["scripts/compare_heads.py", "--config", "configs/quickstart_compare.yaml", "--tune", "--storage",
      "sqlite:///TMP/empty.db"], "TMP/empty.db is empty (0 bytes), not an Optuna database"),
    # an override's mistake names the command line, not the run's config.yaml (TMP/trained: quickstart's run)
    (["train.py", "--config", "configs/quickstart.yaml", "data.image_size=abc"],
     "config key 'data.image_size' expects int, got 'abc' (str) on the command line"),
    (["eval.py", "--checkpoint", "TMP/trained", "data.image_size=abc"],
     "config key 'data.image_size' expects int, got 'abc' (str) on the command line"),
    (["eval.py", "--checkpoint", "TMP/trained", "head.name=sparsemax"],
     "TMP/trained was trained with head.name=softmax; head.name=sparsemax on the command line would make it"),
    (["predict.py", "--checkpoint", "TMP/trained", "--output", "TMP/p.csv", "--images", "TMP/notes", "--head",
      "entmax15"], "pass --accept-changed-model to use it anyway"),
]


def _run(argv):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", REFUSING, os.path.join(ROOT, argv[0]), *argv[1:]], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def scene(tmp_path):
    """TMP: a run folder (as far as the checks look), an empty folder, a folder without images, a file,
    a run already trained there and one a live process has locked, a trained run's config (quickstart's)
    -> (TMP, its listing)."""
    for folder in ("run", "empty", "notes", "old_run", "locked", "trained"):
        (tmp_path / folder).mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("no image")
    (tmp_path / "a_file").write_text("not a folder")
    (tmp_path / "old_run" / "summary.json").write_text("{}")
    (tmp_path / "deep.yaml").write_text("model: " + "[" * 20_000 + "]" * 20_000 + "\n")
    (tmp_path / "deep_run").mkdir()
    (tmp_path / "deep_run" / "config.yaml").write_text("model: " + "[" * 20_000 + "]" * 20_000 + "\n")
    (tmp_path / "deep_run" / "model.safetensors").write_bytes(b"")
    (tmp_path / "empty.db").write_bytes(b"")
    (tmp_path / "locked" / "run.lock").write_text(json.dumps({**process_record(), "purpose": "training"}))
    save_config(load_config(os.path.join(ROOT, "configs", "quickstart.yaml")),
                str(tmp_path / "trained" / "config.yaml"))
    return str(tmp_path), _listing(tmp_path)


def _listing(folder):
    """Every folder's subfolders and files, each file with the sha256 of its bytes (a refused command changes none)."""
    return sorted((root, sorted(dirs), sorted((name, _sha256(os.path.join(root, name))) for name in files))
                  for root, dirs, files in os.walk(folder))


def _sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _in(tmp, argv):
    return [a.replace("TMP", tmp) for a in argv]


@pytest.mark.parametrize("argv, says", MISTAKES, ids=[" ".join(a[:1] + a[-1:]) for a, _ in MISTAKES])
def test_a_mistake_is_one_line_without_the_heavy_imports(argv, says, scene):
    tmp, before = scene
    done = _run(_in(tmp, argv))
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and says.replace("TMP", tmp) in lines[0] \
        and lines[0].startswith("error: "), (done.returncode, done.stderr[-1500:])
    assert _listing(tmp) == before  # nothing created, changed or deleted


def _read_only(folder):
    """Make `folder` read-only for this process (root ignores permissions: chattr +i) -> how to undo it."""
    if os.geteuid() != 0:
        os.chmod(folder, 0o555)
        return lambda: os.chmod(folder, 0o755)
    if shutil.which("chattr") and subprocess.run(["chattr", "+i", folder], capture_output=True).returncode == 0:
        return lambda: subprocess.run(["chattr", "-i", folder], check=True)
    pytest.skip("no way to make a folder read-only for root here (chattr)")


@pytest.mark.parametrize("where, cause", [("TMP/a_file/run", "Not a directory"),
                                          ("TMP/read_only/run", "Permission denied"),
                                          ("TMP/read_only", "Permission denied")])
def test_an_unwritable_run_directory_is_exit_74_without_the_heavy_imports(where, cause, scene):
    """The run lock's own line and exit status (common/runlock.py), found by looking before torch loads: the
    run directory is not made, nothing is written. (A read-only filesystem: tests/test_run_files.py.)"""
    tmp, _ = scene
    os.mkdir(os.path.join(tmp, "read_only"))
    before = _listing(tmp)
    undo = _read_only(os.path.join(tmp, "read_only"))
    try:
        done = _run(["train.py", "--config", "configs/quickstart.yaml", f"train.output_dir={_in(tmp, [where])[0]}"])
    finally:
        undo()
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 74 and len(lines) == 1, (done.returncode, done.stderr[-1500:])
    assert lines[0] == (f"error: cannot write {_in(tmp, [where])[0]}/run.lock: {cause}; training needs a writable "
                        f"folder: choose another path, or fix its permissions or filesystem")
    assert _listing(tmp) == before


def test_the_refusing_interpreter_does_refuse(tmp_path):
    """The check above can fail: a valid command, which goes on to train, dies there at its first heavy
    import (before it writes anything)."""
    done = _run(["train.py", "--config", "configs/quickstart.yaml", f"train.output_dir={tmp_path / 'run'}"])
    assert done.returncode != 0 and "refused import of" in done.stderr and not (tmp_path / "run").exists()


def _cpu_seconds(argv):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def test_a_config_error_costs_well_under_a_second_of_cpu():
    """Measured, not only refused: the answer's CPU time beyond Python's own start (`python -c pass`,
    same run) stays under 1.5 s (about 0.1 s on an idle 2-core machine; torch and timm alone take ~4 s)."""
    _, startup = _cpu_seconds(["-c", "pass"])
    done, spent = _cpu_seconds(["train.py", "--config", "configs/quickstart.yaml", "optim.lrr=1"])
    assert done.returncode == 2 and "did you mean 'optim.lr'" in done.stderr
    print(f"config error: {spent:.2f} s CPU, python -c pass: {startup:.2f} s ({spent / max(startup, 1e-3):.0f}x)")
    assert spent - startup < 1.5, (spent, startup)
