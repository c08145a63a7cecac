"""A YAML SafeLoader for the patch table that refuses pathological or ambiguous documents fast.

``yaml.safe_load`` accepts documents whose aliases expand exponentially (a 1.5 KB file can stand
for millions of nodes), nests until Python's recursion limit, and lets a duplicate key silently
replace the first one. The table is small and hand-written, so generous fixed limits cost nothing.
"""

from __future__ import annotations

import yaml

MAX_DOCUMENT_BYTES = 256 * 1024
MAX_ALIASES = 32
MAX_DEPTH = 32
# Nodes after expanding aliases: what validation and error messages will walk.
MAX_EXPANDED_NODES = 20_000


class YamlLimitError(yaml.YAMLError):
    """The document exceeds one of this module's limits."""


class BoundedSafeLoader(yaml.SafeLoader):
    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0
        self._depth = 0

    def fetch_flow_collection_start(self, token_class):
        # The scanner reads a whole flow collection ahead (a '[' may start a key), with a cost
        # quadratic in its nesting: refuse deep nesting here, before the composer sees anything.
        if self.flow_level >= MAX_DEPTH:
            raise YamlLimitError(f"nested deeper than {MAX_DEPTH} levels (at line {self.line + 1})")
        super().fetch_flow_collection_start(token_class)

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise YamlLimitError(f"more than {MAX_ALIASES} aliases (at line {self.peek_event().start_mark.line + 1})")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise YamlLimitError(f"nested deeper than {MAX_DEPTH} levels (at line {self.peek_event().start_mark.line + 1})")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self):
        node = super().compose_document()
        _check_expanded_size(node)
        return node

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # '<<' merges may override on purpose
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:
                    continue  # unhashable: the stock constructor reports it
                if first is not key_node:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first at line {first.start_mark.line + 1})", key_node.start_mark
                    )
        return super().construct_mapping(node, deep=deep)


def _check_expanded_size(root) -> None:
    """Counts nodes as if every alias were copied; refuses recursive aliases."""
    if root is None:
        return
    sizes: dict[int, int] = {}
    in_progress: set[int] = set()
    stack = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            children = _children(node)
            sizes[key] = 1 + sum(sizes[id(c)] for c in children)
            in_progress.discard(key)
            if sizes[key] > MAX_EXPANDED_NODES:
                raise YamlLimitError(f"more than {MAX_EXPANDED_NODES} nodes once aliases are expanded")
            continue
        if key in sizes:
            continue
        if key in in_progress:
            raise YamlLimitError(f"recursive alias (at line {node.start_mark.line + 1})")
        in_progress.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in in_progress:
                raise YamlLimitError(f"recursive alias (at line {child.start_mark.line + 1})")
            if id(child) not in sizes:
                stack.append((child, False))


def _children(node) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def load(text: str):
    """Parse one YAML document within the limits; raises yaml.YAMLError (or a subclass)."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_DOCUMENT_BYTES:
        raise YamlLimitError(f"larger than {MAX_DOCUMENT_BYTES // 1024} KiB")
    loader = BoundedSafeLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
