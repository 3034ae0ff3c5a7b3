"""The import graph reads bottom-up: common <- models, data <- configs <- engine, evaluation <- train.py,
eval.py, predict.py, scripts. Every import statement of every module is parsed (ast), including the ones
inside functions, and relative imports are resolved to their package."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT = ("common", "models", "data", "configs", "engine", "evaluation", "scripts", "train", "eval", "predict",
           "tests")

# package -> top-level project names its modules must not import
FORBIDDEN = {
    "common": set(PROJECT) - {"common"},
    "models": {"engine", "evaluation", "data", "configs", "scripts", "train", "eval", "predict", "tests"},
    "data": {"models", "engine", "evaluation", "configs", "scripts", "train", "eval", "predict", "tests"},
    "configs": {"engine", "evaluation", "scripts", "train", "eval", "predict", "tests"},
    "engine": {"evaluation", "scripts", "train", "eval", "predict", "tests"},
    "evaluation": {"engine", "scripts", "train", "eval", "predict", "tests"},
}


def project_imports(path, package):
    """Top-level project names imported by the module at `path` (a module of `package`)."""
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            names.add(package if node.level else (node.module or "").split(".")[0])
    return names & set(PROJECT)


def modules(package):
    for folder, _, files in os.walk(os.path.join(ROOT, package)):
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(folder, name)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_from_below(package):
    found = list(modules(package))
    assert found, f"no modules found in {package}/"
    bad = {os.path.relpath(p, ROOT): sorted(project_imports(p, package) & FORBIDDEN[package]) for p in found}
    assert {p: names for p, names in bad.items() if names} == {}


def test_the_checker_sees_relative_and_function_level_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from . import x\ndef f():\n    import engine.checkpoint\n    from configs.loader import y\n")
    assert project_imports(str(path), "models") == {"models", "engine", "configs"}
