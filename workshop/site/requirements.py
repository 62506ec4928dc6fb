"""The site's requirements with their hashes: the part of ``requirements.lock`` its block of requirements.txt needs.

``requirements.txt`` ends with the site's own block (``# The site ...``: Sphinx, myst-nb, the theme), and
``requirements.lock`` pins everything the file pulls in, each version with its files' SHA-256 and, in a
``# via`` comment, what pulls it in. The Pages workflow needs only the site's part, and installs it with
hashes required, as ``make install`` installs the whole lock::

    python -m workshop.site.requirements > site-requirements.txt
    python -m pip install --require-hashes -r site-requirements.txt

A locked package belongs to the site's part when the site's block names it, or a package of the part pulls
it in. Standard library only: the workflow runs it before anything is installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCK_START = "# The site"


def normalise(name: str) -> str:
    """A package's name as the lock's ``# via`` lines spell it: lower case, runs of ``-_.`` as one ``-``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def site_block(requirements: str) -> list[str]:
    """The packages the site's block of ``requirements.txt`` pins (from its ``# The site`` line to a blank one)."""
    lines = requirements[requirements.index(BLOCK_START):].split("\n\n", 1)[0].splitlines()
    return [normalise(re.split(r"[=<>!~;\[ ]", line, maxsplit=1)[0]) for line in lines
            if line.strip() and not line.startswith("#")]


def lock_entries(lock: str) -> dict[str, tuple[str, set[str]]]:
    """Each locked package: its entry (pin, markers, hashes, comments) as the lock writes it, and what pulls it in."""
    entries: dict[str, tuple[str, set[str]]] = {}
    for entry in re.split(r"\n(?=\S)", lock):
        if entry.startswith("#") or not entry.strip():
            continue
        name = normalise(re.split(r"[=<>!~;\[ ]", entry, maxsplit=1)[0])
        # "# via pkg", or "# via" then "#   pkg" lines; "-r requirements.txt" names no package
        parents = re.findall(r"^\s+#\s+(?:via\s+)?([A-Za-z0-9][A-Za-z0-9._-]*)\s*$", entry, flags=re.M)
        entries[name] = (entry.rstrip("\n"), {normalise(parent) for parent in parents} - {"via"})
    return entries


def site_part(requirements: str, lock: str) -> list[str]:
    """The lock's entries the site needs, in the lock's order.

    Raises:
        ValueError: a package of the site's block is not in the lock (run ``make lock``).
    """
    entries, needed = lock_entries(lock), set(site_block(requirements))
    missing = sorted(needed - set(entries))
    if missing:
        raise ValueError(f"requirements.lock has no {', '.join(missing)}: run `make lock` after changing "
                         "requirements.txt")
    grew = True
    while grew:
        pulled = {name for name, (_, parents) in entries.items() if parents & needed} - needed
        needed |= pulled
        grew = bool(pulled)
    return [text for name, (text, _) in entries.items() if name in needed]


def main() -> int:
    """Print the site's part of the lock (to install with ``--require-hashes``); 1 with one line if it cannot."""
    try:
        part = site_part((ROOT / "requirements.txt").read_text(), (ROOT / "requirements.lock").read_text())
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print("# The site's part of requirements.lock (python -m workshop.site.requirements); install with hashes.")
    print("\n".join(part))
    return 0


if __name__ == "__main__":
    sys.exit(main())
