"""YAML loading that remembers line numbers, so every error can name file:line.

Mappings load as ``LineDict``: a dict that also knows the line of the mapping and of
each of its keys.  Duplicate keys (which plain YAML loaders silently resolve to the last
one) are reported as errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


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


class _LineLoader(yaml.SafeLoader):
    def __init__(self, stream: str, filename: str) -> None:
        super().__init__(stream)
        self.filename = filename
        self.problems: list[str] = []


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> LineDict:
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


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)  # type: ignore[arg-type]


def load_yaml_file(path: Path) -> Any:
    """The file's content, with LineDicts for mappings; YamlFileError if it cannot be had."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise YamlFileError([f"{path}: cannot read: {reason}"]) from None
    return load_yaml_text(text, str(path))


def load_yaml_text(text: str, filename: str) -> Any:
    loader = _LineLoader(text, filename)
    try:
        data = loader.get_single_data()
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
