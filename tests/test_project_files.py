"""The tests read the project through git's list of tracked files, never by walking the working tree:
checked on a tree laid out as a newcomer's is after `make` (an isolated `.venv` inside it, with the
`lib64 -> lib` link venv makes on 64-bit Linux, a large file, a site-packages module that is not
UTF-8) plus a user's `runs/`, `features/` and `reports/`."""
import os
import subprocess

from project_files import copy_project, python_files, tracked_files


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def _newcomers_tree(tmp_path):
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "data" / "loaders.py").write_text("X = 1\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_x.py").write_text("def test_x():\n    pass\n")
    (repo / "train.py").write_text("print('train')\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    # what is not the project: a real venv's shape, as `make` leaves it inside the clone
    site = repo / ".venv" / "lib" / "python3.11" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "big.so").touch()
    os.truncate(site / "torch" / "big.so", 2 << 30)  # 2 GiB, sparse: costs no disk, only a copier's time
    (site / "zh_big5.py").write_bytes("# 中文\n".encode("big5"))
    os.symlink("lib", repo / ".venv" / "lib64")
    os.symlink("..", site / "loop")  # a link cycle, as some packages ship
    for folder in ("runs/quickstart", "features/qs", "reports", "data/extra"):
        (repo / folder).mkdir(parents=True)
        (repo / folder / "x.py").write_bytes(b"\xff\xfe not a module\n")
    return repo


def test_only_tracked_files_are_listed_and_copied(tmp_path):
    repo = _newcomers_tree(tmp_path)
    assert tracked_files(repo) == ["data/loaders.py", "tests/test_x.py", "train.py"]
    assert python_files("data", repo) == [str(repo / "data" / "loaders.py")]
    copy_project(tmp_path / "copy", root=repo)
    copied = sorted(str(p.relative_to(tmp_path / "copy")) for p in (tmp_path / "copy").rglob("*") if p.is_file())
    assert copied == ["data/loaders.py", "train.py"]


def test_the_real_project_is_listed_from_git():
    files = tracked_files()
    assert "train.py" in files and "tests/project_files.py" in files
    assert not [p for p in files if p.startswith((".venv/", "runs/", "features/", "reports/"))]
