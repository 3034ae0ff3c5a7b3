"""tests/other_user.py: what `nobody` cannot reach is found by nobody's own shell (a folder above that only
root may enter counts), so a test that runs a Python as nobody skips, naming the path, instead of failing."""
import os
import shutil
import sys
import tempfile

import pytest

from other_user import skip_unless_nobody_can_run_python, unreachable

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="switching a child process to nobody needs root")


@pytest.fixture
def home():
    """A folder as a root user's home is in many containers (mode 700), with bin/python (755), lib/ (755)
    and a file only its owner reads."""
    base = tempfile.mkdtemp(dir="/tmp")  # mode 700, as /root
    os.makedirs(os.path.join(base, "bin"))
    os.makedirs(os.path.join(base, "lib"))
    shutil.copy(sys.executable, os.path.join(base, "bin", "python"))
    with open(os.path.join(base, "secret"), "w") as f:
        f.write("x")
    os.chmod(os.path.join(base, "secret"), 0o600)
    yield base
    shutil.rmtree(base)


def test_a_folder_only_root_may_enter_hides_what_is_under_it(home):
    python = os.path.join(home, "bin", "python")
    assert unreachable([f"x:{python}"]) == python  # /root-like: 700
    os.chmod(home, 0o755)
    assert unreachable([f"x:{python}", f"d:{home}/lib"]) is None
    os.chmod(python, 0o644)
    assert unreachable([f"d:{home}/lib", f"x:{python}"]) == python  # not runnable
    os.chmod(os.path.join(home, "lib"), 0o711)
    assert unreachable([f"d:{home}/lib"]) == f"{home}/lib"  # entered, not listed
    assert unreachable([f"r:{home}/secret"]) == f"{home}/secret"


def test_a_test_skips_naming_what_nobody_cannot_run_or_import(home, monkeypatch):
    skip_unless_nobody_can_run_python("/tmp", ["json"])  # reachable here: no skip
    with pytest.raises(pytest.skip.Exception, match=f"nobody cannot reach {home}: "):
        skip_unless_nobody_can_run_python(home)
    with pytest.raises(pytest.skip.Exception, match="nobody cannot start this Python with no_such_package_x "
                                                     r"\(ModuleNotFoundError: No module named 'no_such_package_x'\)"):
        skip_unless_nobody_can_run_python("/tmp", ["no_such_package_x"])
    monkeypatch.setattr(sys, "executable", os.path.join(home, "bin", "python"))
    with pytest.raises(pytest.skip.Exception, match=f"nobody cannot reach {sys.executable}: "):
        skip_unless_nobody_can_run_python("/tmp")
