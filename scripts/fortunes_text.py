"""Quotations from Debian's ``fortunes`` package as a ``.jsonl`` held-out text.

    apt-get install fortunes
    python scripts/fortunes_text.py --out /tmp/fortunes.jsonl          # literature + wisdom
    lightning-kd evaluate --files /tmp/fortunes.jsonl -- smollm2 runs/kd/student

The README's out-of-domain perplexities are measured on this text: short English quotations and
aphorisms (Twain, Shakespeare, proverbs ...), far from the default corpus's technical prose. One
quotation a line, whitespace runs collapsed; the attribution lines stay, as the files have them.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

FORTUNES = Path("/usr/share/games/fortunes")


def quotations(path: Path) -> list[str]:
    """The quotations of one fortune file (separated by lines holding a single ``%``)."""
    text = path.read_text(encoding="utf-8")
    quotes = (re.sub(r"[ \t]+", " ", block.strip("%\n")).strip() for block in text.split("\n%\n"))
    return [quote for quote in quotes if quote]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--files", nargs="+", default=["literature", "wisdom"])
    parser.add_argument("--dir", type=Path, default=FORTUNES)
    args = parser.parse_args()
    missing = [name for name in args.files if not (args.dir / name).is_file()]
    if missing:
        raise SystemExit(f"{missing} not in {args.dir}: apt-get install fortunes (or set --dir)")
    count = 0
    with open(args.out, "w", encoding="utf-8") as handle:
        for name in args.files:
            for quote in quotations(args.dir / name):
                handle.write(json.dumps({"source": name, "text": quote}) + "\n")
                count += 1
    print(f"{count} quotations -> {args.out}")


if __name__ == "__main__":
    main()
