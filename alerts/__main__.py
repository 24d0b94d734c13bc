"""Render the rule files: `python -m alerts --write` writes them, `--check` says whether they are current."""

from __future__ import annotations

import sys

from alerts.generated import Generator, main
from alerts.render import render_all

RULES = Generator(
    prog="python -m alerts",
    description=__doc__,
    files="the generated rule files",
    render_all=render_all,
)

if __name__ == "__main__":
    sys.exit(main(RULES))
