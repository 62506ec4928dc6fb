"""``python -m workshop.site`` (``make site``): build the lessons' website into ``runs/site/html`` and check it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from workshop.site import build, vendor


def main(argv: list[str] | None = None) -> int:
    """Build and check the site; 0 and one summary line, or 1 and what was wrong."""
    parser = argparse.ArgumentParser(prog="python -m workshop.site", description=__doc__)
    parser.add_argument("--out", type=Path, default=build.OUT,
                        help=f"build folder; the site is its html/ (default: {build.OUT.relative_to(build.ROOT)})")
    parser.add_argument("--verbose", action="store_true", help="show Sphinx's progress, not only its warnings")
    args = parser.parse_args(argv)
    try:
        site = build.build(args.out, quiet=not args.verbose)
    except (build.SiteError, vendor.VendorError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(site.summary())
    print(f"Preview it: python -m http.server --bind 127.0.0.1 -d {site.folder} 8000, then open http://127.0.0.1:8000/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
