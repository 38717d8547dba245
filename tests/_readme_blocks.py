"""The README's marked shell blocks, so CI runs the README's lines and not a copy of them.

A block is the fenced ```bash block right after a line ``<!-- ci: NAME -->``.

    python tests/_readme_blocks.py NAME      # prints the block (tests/vllm_plugin/run.sh runs it)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def block(name: str, text: str | None = None) -> str:
    """The block marked ``name``. Raises ``KeyError`` naming the marker when the README has none."""
    text = README.read_text() if text is None else text
    match = re.search(rf"^<!-- ci: {re.escape(name)} -->\n```bash\n(.*?)^```$", text, flags=re.S | re.M)
    if match is None:
        raise KeyError(f"README.md has no block marked '<!-- ci: {name} -->' followed by a ```bash fence")
    return match.group(1)


if __name__ == "__main__":
    sys.stdout.write(block(sys.argv[1]))
