"""Imports sit at a module's top, where a reader sees a module's dependencies. An import statement inside
a function or method body (a function-level import) is the exception: outside tests/ there are at most
MAX_FUNCTION_LEVEL of them (139 before issue 43), and each gives its reason in a comment on the statement's
own line(s) or on the comment lines directly above it (one comment may head a group of consecutive
imports). A reason names one of:

    optional   an optional dependency (mlflow, tensorboard, NVIDIA DALI, onnx, pip's vendored copies):
               a package the project runs without, imported where it is used;
    cycle:     a real import cycle that moving a function or constant down a layer cannot break, named
               as `cycle: a.b -> c.d -> a.b`;
    heavy:     an import measured to cost seconds (torch, timm, Accelerate, mlflow) kept off the torch-free
               config-error path: an entry point's body after its checks, or a module that path reads
               (tests/test_config_errors_fast.py proves the path refuses them).

Every other import moves to the module's top: of a torch-free module, or into a module that is heavy
already. A module-level `try: import x / except ImportError` is a top-level import, not one of these."""
import ast
import functools
import io
import os
import re
import tokenize

from project_files import ROOT, tracked_files

MAX_FUNCTION_LEVEL = 40
REASON = re.compile(r"\boptional\b|\bheavy:\s*\S|\bcycle:\s*\S+\s*(->|→)\s*\S")
VOCABULARY = "'optional ...', 'heavy: ...' or 'cycle: a -> b -> a'"


def _comments(source):
    """{line number: the text of the comment on it}."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def function_level_imports(source, filename="<source>"):
    """[(line, statement, reason comment or '')] of the import statements inside function bodies."""
    tree = ast.parse(source, filename=filename)
    lines, comments = source.splitlines(), None
    found = []

    def reason_of(node, previous):
        nonlocal comments
        comments = _comments(source) if comments is None else comments  # (tokenized only when needed)
        text = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments]
        above = node.lineno - 1
        while above >= 1 and lines[above - 1].lstrip().startswith("#"):  # the comment lines directly above
            text.insert(0, comments.get(above, ""))
            above -= 1
        if not text and isinstance(previous, (ast.Import, ast.ImportFrom)) and previous.end_lineno == node.lineno - 1:
            return reason_of(previous, None)  # a group of imports under one comment
        return " ".join(text)

    def visit(node, in_function):
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            previous = None
            for child in block:
                if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                    found.append((child.lineno, ast.unparse(child), reason_of(child, previous)))
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))
                previous = child

    visit(tree, False)
    return found


@functools.cache
def project_imports():
    """{'path:line statement': reason} over the tracked .py files outside tests/."""
    out = {}
    for rel in tracked_files():
        if rel.endswith(".py") and not rel.startswith("tests/"):
            with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
                for line, statement, reason in function_level_imports(f.read(), rel):
                    out[f"{rel}:{line} {statement}"] = reason
    return out


def test_function_level_imports_are_few():
    found = project_imports()
    per_folder = {}
    for where in found:
        folder = where.split("/")[0] if "/" in where.split(":")[0] else "(root)"
        per_folder[folder] = per_folder.get(folder, 0) + 1
    assert len(found) <= MAX_FUNCTION_LEVEL, (len(found), per_folder)


def test_each_function_level_import_gives_its_reason():
    missing = sorted(where for where, reason in project_imports().items() if not REASON.search(reason))
    assert missing == [], f"function-level imports without a reason ({VOCABULARY}; tests/test_imports.py): {missing}"


def test_the_checker_sees_every_function_level_import_and_its_reason():
    source = (
        "import os\n"
        "try:\n"
        "    import fcntl  # a module-level try: not function-level\n"
        "except ImportError:\n"
        "    fcntl = None\n"
        "def f():\n"
        "    import json\n"                                   # no reason
        "    if os.sep:\n"
        "        import mlflow  # optional: mlflow\n"
        "    # heavy: torch (seconds), after the checks\n"
        "    import torch\n"
        "    import torch.distributed as dist\n"              # the group's comment above
        "\n"
        "    import timm\n"                                   # a blank line ends the group
        "    def inner():\n"
        "        from a import b  # cycle: a -> c -> a\n"
        "    try:\n"
        "        from x import y  # cycle: x\n"                # a cycle must be named
        "    except ImportError:\n"
        "        from z import y  # Optional dependency\n"
        "class C:\n"
        "    def m(self):\n"
        "        from pkg import mod  # heavy:\n"              # a tag without its words
    )
    found = {line: bool(REASON.search(reason)) for line, _, reason in function_level_imports(source)}
    assert found == {7: False, 9: True, 11: True, 12: True, 14: False, 16: True, 18: False, 20: False, 23: False}
