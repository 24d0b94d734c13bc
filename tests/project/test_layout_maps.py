"""The maps of the repository's folders stay true: README.md's (under "## Development") and
docs/development.md's (the layout, and where the tests live).  Every file and folder a map names
exists, and every top-level folder (every folder of tests/, in the tests' map) is named."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support import REPO, TESTS

# (page, the "## " section holding the map): each map is the section's first ``` block without a language.
MAPS = {
    "README layout": ("README.md", "## Development"),
    "development layout": ("docs/development.md", "## The layout, and why the folders are the package"),
    "development tests": ("docs/development.md", "## Tests: where they live and their tiers"),
}
# Folders of a checkout that are no part of the repository (.gitignore), nor on any map.
NOT_MAPPED = {"build", "__pycache__"}
# A name in a map: a path with a slash, or a file's name (a Python module).
PATH = re.compile(r"^[\w.<>-]+(/[\w.<>-]+)*/?$")


def map_block(page: str, section: str) -> str:
    text = (REPO / page).read_text()
    assert f"\n{section}\n" in text, f"{page}: no {section!r}"
    body = text[text.index(f"\n{section}\n") :].split("\n## ", 2)[1]
    blocks = re.findall(r"^```\n(.*?)^```$", body, re.MULTILINE | re.DOTALL)
    assert blocks, f"{page}: {section!r} has no map (a ``` block)"
    return blocks[0]


def rows(block: str) -> list[tuple[list[str], list[str]]]:
    """Each row of a map: the paths of its first column (before a gap of two spaces or more; a
    line that is all paths has no description), and the names its description holds (its
    continuation lines' too)."""
    found: list[tuple[list[str], list[str]]] = []
    for line in block.splitlines():
        if line.startswith(" "):
            column, description = "", line
        else:
            column, description = (re.split(r"\s{2,}", line, maxsplit=1) + [""])[:2]
        names = [token.strip("`(),;:") for token in description.split()]
        names = [n for n in names if PATH.match(n) and ("/" in n or n.endswith(".py"))]
        if column:
            found.append((column.split(), names))
        elif found:
            found[-1][1].extend(names)
    return found


def exists(name: str, bases: list[Path]) -> bool:
    """The name exists under one of the bases (<placeholder> segments match any folder)."""
    pattern = re.sub(r"<[^>]+>", "*", name.rstrip("/"))
    return any(any(base.glob(pattern)) if "*" in pattern else (base / pattern).exists() for base in bases)


@pytest.mark.parametrize("name", MAPS)
def test_every_file_and_folder_a_map_names_exists(name: str) -> None:
    missing = []
    for paths, names in rows(map_block(*MAPS[name])):
        missing += [path for path in paths if not exists(path, [REPO])]
        # A name in the description: of the row's folder (or its parent, for a placeholder such
        # as tests/collectors/<collector>/: "gpu/"), or of the repository.
        bases = [REPO]
        for path in paths:
            folder = Path(re.sub(r"/?<[^>]+>.*$", "", path.rstrip("/")))
            bases += [REPO / folder] if "<" in path else [REPO / path]
        missing += [n for n in names if not exists(n, bases)]
    assert missing == []


def named(name: str) -> set[str]:
    """The folders a map names: its rows' paths and the names in their descriptions, and the
    folders those are in (tests/collectors/<collector>/ names tests/collectors)."""
    found = set()
    for paths, names in rows(map_block(*MAPS[name])):
        for path in [*paths, *names]:
            parts = path.rstrip("/").split("/")
            found |= {"/".join(parts[:n]) for n in range(1, len(parts) + 1)}
    return found


def folders(top: Path) -> set[str]:
    return {
        p.name
        for p in top.iterdir()
        if p.is_dir() and not p.name.startswith(".") and not p.name.endswith(".egg-info") and p.name not in NOT_MAPPED
    }


@pytest.mark.parametrize("name", ["README layout", "development layout"])
def test_every_top_level_folder_is_on_the_layout_maps(name: str) -> None:
    assert sorted(folders(REPO) - named(name)) == []


def test_every_folder_of_the_tests_is_on_the_tests_map() -> None:
    on_map = named("development tests")
    assert sorted(f"tests/{folder}" for folder in folders(TESTS) if f"tests/{folder}" not in on_map) == []
