"""The project's own files, as git tracks them: what a test copies, lists or reads of the repository.

Never a walk of the working tree: it holds what is not the project, such as the `.venv` that `make`
creates inside it (several GB with a CUDA torch, a `lib64 -> lib` link, files in other encodings),
a user's `runs/`, `features/` and `reports/`.
"""
import os
import shutil
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tracked_files(root=ROOT):
    """Paths (relative to `root`, sorted) of the files git tracks there that exist on disk."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True, text=True)
    if listed.returncode:
        raise RuntimeError(f"the tests read the project's files from git, and {root} is not a git checkout "
                           f"({listed.stderr.strip()}): run them from a clone")
    return sorted(p for p in listed.stdout.split("\0") if p and os.path.isfile(os.path.join(root, p)))


def python_files(package, root=ROOT):
    """The tracked .py files of one top-level folder, as absolute paths."""
    return [os.path.join(root, p) for p in tracked_files(root) if p.startswith(package + "/") and p.endswith(".py")]


def copy_project(dst, root=ROOT, leave_out=("tests/",)):
    """Copy the tracked files of `root` (less those under `leave_out`) into `dst`, which is created."""
    for rel in tracked_files(root):
        if rel.startswith(tuple(leave_out)):
            continue
        target = os.path.join(dst, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(root, rel), target)
