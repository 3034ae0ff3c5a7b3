"""`import models` registers the resmlp_* variants with timm in any import order, without importing
torch or timm itself (the config loader reads the package's declarations before torch loads).

The mechanism (common/after_import.py) is checked on a throwaway package written here, in both
orders; the real order that needs the hook (`import models` first, timm later) in a fresh Python."""
import os
import subprocess
import sys
import textwrap
import uuid

import pytest

from common.after_import import _AfterImport, run_after_import

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A fresh importable package `pkg_after_<n>` whose import appends to a list; yields its name."""
    name = f"pkg_after_{uuid.uuid4().hex}"  # never imported before in this process
    (tmp_path / name).mkdir()
    (tmp_path / name / "__init__.py").write_text("EVENTS = ['package ran']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    sys.meta_path[:] = [f for f in sys.meta_path if not (isinstance(f, _AfterImport) and f.name == name)]


def test_callback_runs_after_a_later_import_once(package):
    calls = []
    run_after_import(package, lambda: calls.append(list(sys.modules[package].EVENTS)))
    assert calls == []  # nothing imported yet: the callback waits
    __import__(package)
    assert calls == [["package ran"]]  # after the package's own code, with the module complete
    sys.modules.pop(package)
    __import__(package)
    assert len(calls) == 1  # one-shot: the hook left sys.meta_path
    assert not any(isinstance(f, _AfterImport) and f.name == package for f in sys.meta_path)


def test_callback_runs_at_once_when_already_imported(package):
    __import__(package)
    calls = []
    run_after_import(package, lambda: calls.append("now"))
    assert calls == ["now"]
    assert not any(isinstance(f, _AfterImport) and f.name == package for f in sys.meta_path)


def test_a_missing_package_keeps_the_hook_waiting(package, tmp_path):
    calls = []
    missing = package + "_later"
    run_after_import(missing, lambda: calls.append("late"))
    with pytest.raises(ImportError):
        __import__(missing)
    (tmp_path / f"{missing}.py").write_text("")  # the package appears (e.g. installed) and is imported
    try:
        __import__(missing)
        assert calls == ["late"]
    finally:
        sys.modules.pop(missing, None)


def test_import_models_then_timm_registers_the_variants_in_a_fresh_python():
    code = textwrap.dedent("""
        import sys
        import models
        assert 'torch' not in sys.modules and 'timm' not in sys.modules, 'import models loaded torch'
        import timm
        model = timm.create_model('resmlp_tiny', num_classes=7)
        assert type(model).__module__ == 'models.resmlp', type(model)
        assert model.num_classes == 7
        print(sorted(timm.list_models('resmlp_*')))
    """)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "'resmlp_s12'" in out.stdout and "'resmlp_tiny'" in out.stdout
