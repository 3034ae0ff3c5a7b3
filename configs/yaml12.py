"""YAML as configs read it: PyYAML's safe loader with YAML 1.2 booleans, no aliases, no duplicate keys.
Standard library and PyYAML only, so a command can check its config before it imports torch."""
import re

import yaml

MAX_DEPTH = 64  # nested collections a document may hold (a config holds 3: section, key, list)


class SafeLoaderYaml12Bools(yaml.SafeLoader):
    """yaml.SafeLoader (no object construction) whose booleans are YAML 1.2's: only true/false,
    and which refuses aliases and duplicate keys.

    PyYAML follows YAML 1.1, where `no`, `yes`, `on`, `off` are booleans, so
    `train.mixed_precision=no` (Accelerate's own spelling) would arrive as False.
    Aliases (`*name`) are refused where they are met, before anything is expanded: a few hundred
    bytes of nested aliases expand to billions of nodes ("billion laughs"), and a config has no
    need for them (`base:` shares settings between files).

    Keys given twice in one mapping (at any depth) are refused (`DuplicateKeyError`), where
    yaml.safe_load silently keeps the last one: `optim: {lr: 1.0e-4, lr: 5.0e-2}` is a mistake.

    Collections nested deeper than MAX_DEPTH are refused where the first one too deep opens: PyYAML
    composes them by recursion, and a few thousand levels of `[[[...` overflow Python's stack.
    """

    def __init__(self, stream):
        super().__init__(stream)
        self._paths = {}  # id(mapping node) -> its dotted key, for duplicate-key messages
        self._depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "YAML aliases (*name) are not allowed in a config; write "
                                              "the value out or share it with base:", self.peek_event().start_mark)
        if self._depth >= MAX_DEPTH:
            raise yaml.composer.ComposerError(None, None, f"collections nested deeper than {MAX_DEPTH} levels; a "
                                              "config is sections of keys, a few levels deep",
                                              self.peek_event().start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            self._check_duplicates(node)
        return super().construct_mapping(node, deep=deep)

    def _check_duplicates(self, node):
        prefix = self._paths.get(id(node), "")
        first_line = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue  # complex keys are refused by the config's type checks; merge keys merge
            key = self.construct_object(key_node)
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise DuplicateKeyError(f"{prefix}{key}", first_line[key], line, key_node.start_mark)
            first_line[key] = line
            if isinstance(value_node, yaml.MappingNode):
                self._paths[id(value_node)] = f"{prefix}{key}."


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A key given twice in one YAML mapping: names the dotted key and both lines."""

    def __init__(self, key, first_line, line, mark):
        super().__init__(None, None, f"duplicate key '{key}' (lines {first_line} and {line})", mark)
        self.key, self.lines = key, (first_line, line)


_BOOL_TAG = "tag:yaml.org,2002:bool"
SafeLoaderYaml12Bools.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != _BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
SafeLoaderYaml12Bools.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def safe_load(stream):
    """yaml.safe_load with YAML 1.2 booleans (see SafeLoaderYaml12Bools)."""
    return yaml.load(stream, Loader=SafeLoaderYaml12Bools)  # a SafeLoader subclass: safe


def show_value(value, limit=60):
    """repr(value) cut to `limit` characters: an error line stays one short line whatever the value."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."
