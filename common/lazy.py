"""A module named now and imported on first use, so that a declaration table can point to the
implementations and still be read without torch: the config loader checks a command line against
the registries (heads, datasets, mappings) and answers a mistake before torch and timm load.

    losses = DeferredModule("models.losses")   # nothing imported yet
    losses.softmax_loss(...)                   # models.losses imported here (any attribute does)
    load_deferred(globals())                   # every DeferredModule global replaced by its module

Not importlib's LazyLoader: that puts a half-made module into sys.modules, and `inspect.getmodule`
(which torch runs while it imports) touches every entry there, loading one in the middle of torch's
own import. A table whose functions run inside compiled code calls `load_deferred` first, so that
torch.compile sees plain modules. Standard library only."""
import importlib


class DeferredModule:
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __getattr__(self, attr):
        return getattr(importlib.import_module(self.name), attr)

    def __repr__(self):
        return f"<deferred module {self.name!r}>"


def load_deferred(namespace):
    """Import every DeferredModule among `namespace`'s values (a module's globals()) and put the
    module itself in its place: a no-op once done."""
    for key, value in list(namespace.items()):
        if isinstance(value, DeferredModule):
            namespace[key] = importlib.import_module(value.name)
