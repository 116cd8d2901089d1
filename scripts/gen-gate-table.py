#!/usr/bin/env python3
"""Write koordlet/features.py's gate table into docs/feature-gates.md (between its markers).

    .venv/bin/python scripts/gen-gate-table.py     (tests/koordlet/test_features.py checks the two agree)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from koordlet import features  # noqa: E402

PAGE = ROOT / "docs" / "feature-gates.md"
BLOCK = re.compile(r"(<!-- feature-gates:begin -->\n).*?(\n<!-- feature-gates:end -->)", re.S)


def main() -> int:
    text = PAGE.read_text()
    if not BLOCK.search(text):
        print(f"{PAGE}: no feature-gates markers", file=sys.stderr)
        return 1
    PAGE.write_text(BLOCK.sub(lambda m: m.group(1) + features.readme_table() + m.group(2), text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
