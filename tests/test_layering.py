"""The import graph reads bottom-up: common <- models, data <- configs <- evaluation <- training <- inference
<- comparison, exporting <- train.py, eval.py, predict.py, scripts (the entry points). Every import statement
of every module is parsed (ast), including the ones inside functions, and relative imports are resolved to
their package.

evaluation/ evaluates one model on one dataset: it imports nothing that reads many runs, i.e. nothing from
comparison/ (the statistics over seeds in comparison/analysis/, the comparison's report in comparison/report/)."""
import ast
import os
import sys

import pytest

from project_files import python_files, tracked_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("common", "models", "data", "configs", "evaluation", "training", "inference", "comparison", "exporting")
# Modules a Python without the project loads by their path (scripts/onnx_predict.py: the export sidecar's
# one definition): the standard library only.
STANDALONE = ("common/sidecar_format.py",)
ENTRIES = ("scripts", "train", "eval", "predict", "tests")
PROJECT = PACKAGES + ENTRIES

# package -> top-level project names its modules must not import
FORBIDDEN = {
    "common": set(PROJECT) - {"common"},
    "models": set(PROJECT) - {"common", "models"},
    "data": set(PROJECT) - {"common", "data"},
    # each later package may import the ones before it, never one after it nor an entry point
    **{package: set(PACKAGES[PACKAGES.index(package) + 1:]) | set(ENTRIES) for package in PACKAGES[3:]},
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
    return python_files(package)  # tracked files: never a walk of the working tree


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_from_below(package):
    found = list(modules(package))
    assert found, f"no modules found in {package}/"
    bad = {os.path.relpath(p, ROOT): sorted(project_imports(p, package) & FORBIDDEN[package]) for p in found}
    assert {p: names for p, names in bad.items() if names} == {}


# What reads many runs (the statistics over seeds, the comparison's report): never imported by evaluation/.
MANY_RUNS = ("comparison",)


def test_evaluation_imports_nothing_that_reads_many_runs():
    """One model on one dataset (evaluation/) never imports the analysis of many runs (comparison/), whatever the
    package order above says: code of one evaluation that needs a declaration of the comparison's gets it moved
    down (as evaluation/ece_bins.py, which the comparison's statistics import)."""
    found = {os.path.relpath(p, ROOT): sorted(project_imports(p, "evaluation") & set(MANY_RUNS))
             for p in modules("evaluation")}
    assert {p: names for p, names in found.items() if names} == {}


def test_the_checker_sees_relative_and_function_level_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from . import x\ndef f():\n    import training.checkpoint.files\n"
                    "    from configs.loader import y\n")
    assert project_imports(str(path), "models") == {"models", "training", "configs"}


@pytest.mark.parametrize("path", STANDALONE)
def test_a_standalone_module_imports_only_the_standard_library(path):
    with open(os.path.join(ROOT, path)) as f:
        tree = ast.parse(f.read(), filename=path)
    imports = [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]
    tops = {alias.name.split(".")[0] for n in imports if isinstance(n, ast.Import) for alias in n.names}
    tops |= {"." if n.level else (n.module or "").split(".")[0] for n in imports if isinstance(n, ast.ImportFrom)}
    assert tops <= set(sys.stdlib_module_names), (path, tops - set(sys.stdlib_module_names))


# ------------------------------------------------------------------------------------------ entry points
def _is_command(path):
    """A module run as a command: it has an `if __name__ == "__main__":` block."""
    with open(path) as f:
        return '__name__ == "__main__"' in f.read()


# The commands: train.py, eval.py, predict.py and every script with a main block (a module of
# scripts/ without one, e.g. _root.py, is a helper of the scripts beside it).
SCRIPTS = sorted(os.path.basename(p)[:-3] for p in python_files("scripts") if _is_command(p))
ENTRY_POINTS = {"train.py": "train", "eval.py": "eval", "predict.py": "predict",
                **{f"scripts/{name}.py": name for name in SCRIPTS}}


def imported_names(path):
    """Every module name an import statement of `path` names (`a.b` for `import a.b`, `from a.b import c`)."""
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.add(node.module or "")
    return names


def entry_points_imported_by(path):
    out = set()
    for name in imported_names(path):
        top = name.split(".")[0]
        if top in ("train", "eval", "predict") or top in SCRIPTS:
            out.add(top)
        elif top == "scripts" and "." in name:
            out.add(name.split(".")[1])
    return out


def test_no_entry_point_imports_another():
    """Opening a run, evaluating and training are library code (training/, inference/, evaluation/); the commands
    call it, never one another (a command that runs another starts it as a child process)."""
    found = {(rel, name) for rel in ENTRY_POINTS for name in entry_points_imported_by(os.path.join(ROOT, rel))}
    assert not found, sorted(found)
    for package in FORBIDDEN:  # nor does any library module (the package rules above say it for eval/predict)
        for path in modules(package):
            assert not entry_points_imported_by(path) & set(SCRIPTS), path


def test_the_entry_point_checker_sees_every_form(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import eval as e\ndef f():\n    from compare_worker import x\n    import scripts.export\n"
                    "    from inference.trained_run import open_run\n")
    assert entry_points_imported_by(str(path)) == {"eval", "compare_worker", "export"}


# ------------------------------------------------------------------------------------------ sys.path
PATH_HELPER = "scripts/_root.py"  # the one module of the repository that edits sys.path


def sys_path_edits(path):
    """Calls of sys.path.insert/append/extend/remove and assignments to sys.path in `path`."""
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in ("insert", "append", "extend", "remove") and \
                ast.unparse(node.func.value) == "sys.path":
            count += 1
        elif isinstance(node, (ast.Assign, ast.AugAssign)) and any(
                ast.unparse(t).startswith("sys.path")
                for t in getattr(node, "targets", [getattr(node, "target", None)])):
            count += 1
    return count


def test_only_the_path_helper_edits_sys_path():
    """Outside tests/, sys.path is edited in one place: scripts/_root.py, which every script imports
    before any project import (train.py, eval.py and predict.py run from the root and need none)."""
    paths = [os.path.join(ROOT, p) for p in tracked_files() if "/" not in p and p.endswith(".py")]
    paths += [p for package in ("scripts",) + tuple(FORBIDDEN) for p in modules(package)]
    edits = {os.path.relpath(p, ROOT): sys_path_edits(p) for p in paths}
    # timm_run.py runs a timm script as `python SCRIPT` would, with the script's own folder first
    assert {rel: n for rel, n in edits.items() if n} == {PATH_HELPER: 1, "scripts/timm_run.py": 1}
    for rel, name in ENTRY_POINTS.items():
        if rel.startswith("scripts/") and project_imports(os.path.join(ROOT, rel), "scripts") - {"scripts"}:
            assert "_root" in imported_names(os.path.join(ROOT, rel)), f"{rel} imports the project without _root"


def test_the_sys_path_checker_sees_every_form(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import sys\nsys.path.insert(0, 'a')\ndef f():\n    sys.path.append('b')\nsys.path[:0] = ['c']\n")
    assert sys_path_edits(str(path)) == 3


# ------------------------------------------------------------------------------------------ circles
def module_name(path):
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def module_edges(path, modules):
    """The project modules (names in `modules`) that the module at `path` imports, at any depth of
    the file (function-level imports too: a circle broken at run time is still a circle)."""
    name = module_name(path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            for alias in node.names:  # `from pkg import module` imports that module
                out.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in out if m in modules and m != name}


def import_circles(paths):
    """The strongly connected components of more than one module in the import graph of `paths`."""
    modules = {module_name(p): p for p in paths}
    graph = {name: module_edges(path, modules) for name, path in modules.items()}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_no_import_circles():
    """No module of the packages imports, directly or through others, a module that imports it
    (data/features.py and its loaders were one: the loaders now live in data/feature_loaders.py)."""
    paths = [p for package in PACKAGES for p in python_files(package)]
    assert import_circles(paths) == []


def test_the_circle_checker_sees_one(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("def f():\n    from pkg import c\n")
    (pkg / "c.py").write_text("from . import a\n")
    (pkg / "d.py").write_text("import pkg.a\n")
    global ROOT
    saved, ROOT = ROOT, str(tmp_path)
    try:
        assert import_circles([str(p) for p in sorted(pkg.glob("*.py"))]) == [["pkg.a", "pkg.b", "pkg.c"]]
    finally:
        ROOT = saved
