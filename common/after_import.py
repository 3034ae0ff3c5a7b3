"""Run a function once a package has been imported, whenever that happens: now, if it already has,
or right after a later `import` of it finishes (a one-shot finder on sys.meta_path). Standard
library only.

    run_after_import("timm", register_variants)

Why: `import models` must register the ResMLP variants with timm in any import order (`import timm,
models` or `import models, timm`) without importing timm itself, because the config loader reads
the models package's torch-free declarations to answer a mistake before torch loads. The same idea
as wrapt's post-import hooks (the withdrawn PEP 369), written out here: twenty lines against a
dependency."""
import importlib.util
import sys
import threading

_LOCK = threading.Lock()


def _imported(name):
    """`name` is in sys.modules and done executing (not a partly made module of an import in flight)."""
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and not getattr(spec, "_initializing", False)


class _AfterImport:
    """A meta-path finder that finds nothing itself: for its one package it asks the other finders,
    then wraps the loader so that `callback` runs once the package's own code has run."""

    def __init__(self, name, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        with _LOCK:
            if self not in sys.meta_path:  # another thread's import took the hook already
                return None
            sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        except BaseException:
            sys.meta_path.insert(0, self)  # the package could not be found now: keep waiting for it
            raise
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            sys.meta_path.insert(0, self)
            return spec
        execute, callback = spec.loader.exec_module, self.callback

        def exec_module(module):
            execute(module)
            callback()

        spec.loader.exec_module = exec_module  # this spec's own loader instance: nothing shared changes
        return spec


def run_after_import(name, callback):
    """Call `callback()` now if package `name` is imported, else right after its import completes."""
    if _imported(name):
        callback()
        return
    with _LOCK:
        if not any(isinstance(f, _AfterImport) and f.name == name and f.callback is callback for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(name, callback))
