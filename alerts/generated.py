"""The command line of the generated files, shared by `python -m alerts` and `python -m dashboards`:
`--write` writes the files a generator renders, `--check` says whether the checked-in ones are
current.  It lives in alerts/ because dashboards/ already builds on alerts/ (thresholds, rule
names), never the other way round."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Generator:
    """What one `python -m <package>` renders, and how its command line describes it."""

    prog: str  # the command, as --check tells to run it: "python -m alerts"
    description: str
    files: str  # what --write writes, for its help: "the generated rule files"
    render_all: Callable[[], dict[str, str]]  # path relative to the repository -> content
    # Globs (relative to the repository) of files that are all generated: one the generator no
    # longer renders (a dashboard renamed or removed) is stale, and --write removes it.
    owned: tuple[str, ...] = ()


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def _leftovers(generator: Generator, generated: dict[str, str]) -> list[Path]:
    """Files in the generator's globs that it does not render (any more)."""
    return [
        path
        for pattern in generator.owned
        for path in sorted(REPO.glob(pattern))
        if str(path.relative_to(REPO)) not in generated
    ]


def stale_files(generator: Generator) -> list[str]:
    generated = generator.render_all()
    stale = [path for path, text in generated.items() if _read(REPO / path) != text]
    stale += [str(path.relative_to(REPO)) for path in _leftovers(generator, generated)]
    return stale


def write(generator: Generator) -> None:
    generated = generator.render_all()
    for old in _leftovers(generator, generated):
        old.unlink()
        print(f"removed {old.relative_to(REPO)}")
    for path, text in generated.items():
        (REPO / path).write_text(text)
        print(f"wrote {path}")


def main(generator: Generator, argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=generator.prog, description=generator.description)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"write {generator.files}")
    mode.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    args = parser.parse_args(argv)
    if args.write:
        write(generator)
        return 0
    stale = stale_files(generator)
    for path in stale:
        print(f"{path} is out of date: run {generator.prog} --write", file=sys.stderr)
    return 1 if stale else 0
