"""The one place that puts the repository root on sys.path, for the scripts in this folder.

`python scripts/NAME.py` starts Python with scripts/ on sys.path, not the repository root where the
packages (common, models, data, configs, engine, evaluation) live. Every script imports this module
before any project import:

    import _root  # noqa: F401  (the repository root on sys.path)
    from _root import ROOT  # when the script needs the root's path itself

Nothing else in the repository edits sys.path (tests/test_layering.py checks it; the tests' own
conftest.py puts the root and scripts/ on it for the test run).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
