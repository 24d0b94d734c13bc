"""YAML loading that remembers line numbers, so every error can name file:line.

Mappings load as ``LineDict``: a dict that also knows the line of the mapping and of
each of its keys.  Duplicate keys (which plain YAML loaders silently resolve to the last
one) are reported as errors.

A config file is edited by people and tools while the daemon runs, and a bad edit must be
rejected, not obeyed: loading is bounded in size (``MAX_FILE_BYTES``, which also bounds the
time PyYAML takes), in nesting depth (``MAX_DEPTH``: 5,000 levels would overflow Python's
stack) and in the number of values once aliases are expanded (``MAX_VALUES``: a "billion
laughs" alias bomb is a few lines long).  A FIFO or device in place of the file is refused
without blocking.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lockstep.agent.files import read_regular_file

if TYPE_CHECKING:
    import yaml
    import yaml.nodes

MAX_FILE_BYTES = 128 * 1024
MAX_DEPTH = 64
MAX_VALUES = 10_000


class LineDict(dict):  # type: ignore[type-arg]
    line: int = 0
    key_lines: dict[Any, int]

    def line_of(self, key: Any) -> int:
        return self.key_lines.get(key, self.line)


class YamlFileError(Exception):
    """The file cannot be read or parsed; ``problems`` are 'file:line: message' strings."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@functools.cache
def _line_loader() -> Any:
    """PyYAML's safe loader that bounds nesting and keeps lines: made, and PyYAML loaded, with the
    first file read (a node configured by flags alone never loads it: 1.7 MiB, issue 47)."""
    import yaml
    import yaml.composer

    class _LineLoader(yaml.SafeLoader):
        def __init__(self, stream: str, filename: str) -> None:
            super().__init__(stream)
            self.filename = filename
            self.problems: list[str] = []
            self._depth = 0

        def compose_node(self, parent: yaml.nodes.Node | None, index: int) -> yaml.nodes.Node | None:
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise yaml.composer.ComposerError(
                        None, None, f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark
                    )
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    _LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
    return _LineLoader


def _expanded_values(root: yaml.nodes.Node, limit: int) -> int:
    """How many values the document holds with every alias expanded, counting no further
    than past ``limit``; -1 if an alias refers to a node that contains it."""
    import yaml.nodes

    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    # Iterative post-order walk: expanded, aliases can nest far deeper than the stack allows.
    stack: list[tuple[yaml.nodes.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        children: list[yaml.nodes.Node] = []
        if isinstance(node, yaml.nodes.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.nodes.MappingNode):
            children = [part for pair in node.value for part in pair]
        if children_done:
            on_path.discard(key)
            sizes[key] = min(limit + 1, 1 + sum(sizes[id(child)] for child in children))
            continue
        if key in sizes:
            continue
        if key in on_path:
            return -1
        on_path.add(key)
        stack.append((node, True))
        for child in children:
            if id(child) in on_path:
                return -1
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _construct_mapping(loader: Any, node: yaml.MappingNode) -> LineDict:
    loader.flatten_mapping(node)
    mapping = LineDict()
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        try:
            hash(key)
        except TypeError:
            loader.problems.append(f"{loader.filename}:{line}: a mapping key must be a plain value")
            continue
        if key in mapping:
            loader.problems.append(
                f"{loader.filename}:{line}: key {key!r} repeats the one on line {mapping.key_lines[key]}"
            )
            continue
        mapping[key] = loader.construct_object(value_node, deep=True)
        mapping.key_lines[key] = line
    return mapping


def read_yaml_bytes(path: Path) -> bytes:
    """The file's bytes, within MAX_FILE_BYTES, never blocking; YamlFileError if it cannot be had."""
    try:
        return read_regular_file(path, MAX_FILE_BYTES)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise YamlFileError([f"{path}: cannot read: {reason}"]) from None


def load_yaml_file(path: Path) -> Any:
    """The file's content, with LineDicts for mappings; YamlFileError if it cannot be had."""
    data = read_yaml_bytes(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise YamlFileError([f"{path}:{line}: not valid UTF-8 (byte {data[exc.start]:#04x})"]) from None
    return load_yaml_text(text, str(path))


def load_yaml_text(text: str, filename: str) -> Any:
    import yaml

    try:
        # The reader checks for control characters as it is made, so this is inside the try.
        loader = _line_loader()(text, filename)
    except yaml.reader.ReaderError as exc:
        raise YamlFileError([_reader_problem(exc, text, filename)]) from None
    try:
        node = loader.get_single_node()
        if node is not None:
            values = _expanded_values(node, MAX_VALUES)
            if values < 0:
                raise YamlFileError([f"{filename}: an alias refers to a value that contains it"])
            if values > MAX_VALUES:
                raise YamlFileError([f"{filename}: holds more than {MAX_VALUES} values once its aliases are expanded"])
        data = loader.construct_document(node) if node is not None else None
    except yaml.reader.ReaderError as exc:
        raise YamlFileError([_reader_problem(exc, text, filename)]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}" if mark else filename
        raise YamlFileError([f"{where}: not valid YAML: {exc.problem or exc.context}"]) from None
    except yaml.YAMLError as exc:
        raise YamlFileError([f"{filename}: not valid YAML: {exc}"]) from None
    finally:
        loader.dispose()
    if loader.problems:
        raise YamlFileError(loader.problems)
    return data


def _reader_problem(exc: yaml.reader.ReaderError, text: str, filename: str) -> str:
    """'file:line:column: ...' for a character YAML does not allow (a control character)."""
    before = text[: exc.position]
    line = before.count("\n") + 1
    column = exc.position - (before.rfind("\n") + 1) + 1
    character = chr(exc.character) if isinstance(exc.character, int) else exc.character
    return f"{filename}:{line}:{column}: not valid YAML: control character {character!r} is not allowed"
