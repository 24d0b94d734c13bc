"""Render the rule files: `python -m alerts --write` writes them, `--check` says whether they are current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alerts.render import render_all

REPO = Path(__file__).resolve().parent.parent


def stale_files() -> list[str]:
    return [path for path, text in render_all().items() if _read(REPO / path) != text]


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except FileNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m alerts", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="write the generated rule files")
    mode.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    args = parser.parse_args(argv)
    if args.write:
        for path, text in render_all().items():
            (REPO / path).write_text(text)
            print(f"wrote {path}")
        return 0
    stale = stale_files()
    for path in stale:
        print(f"{path} is out of date: run python -m alerts --write", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
