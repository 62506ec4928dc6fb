"""The lessons' website: how long ``make site`` takes, and what it builds.

Runs what ``make site`` runs (``python -m workshop.site``: Sphinx from scratch with warnings as errors,
then the link and offline check) REPEATS times, each in a fresh process into a fresh folder, and
records each build's wall and CPU seconds, and the site: its pages, files and bytes, and the parts
that make up its size. Writes ``benchmarks/results/site.json``; ``benchmarks/report.py`` writes the
section of docs/results.md from it. Needs no service.

    python benchmarks/bench_site.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import print_table, write_results

from workshop.site import build

ROOT = Path(__file__).resolve().parent.parent
# What the site's size is made of: (label, test on a file's path in the site).
PARTS = [
    ("the pages (HTML)", lambda p: p.suffix == ".html" and not p.parts[0].startswith("_")),
    ("the plots and screenshots (_images)", lambda p: p.parts[0] == "_images"),
    ("the notebooks and scripts to download (_downloads)", lambda p: p.parts[0] == "_downloads"),
    ("mermaid, vendored (_static/vendored)", lambda p: p.parts[:2] == ("_static", "vendored")),
    ("the theme's scripts, styles, fonts (_static)", lambda p: p.parts[0] == "_static" and p.parts[1] != "vendored"),
    ("the search index (searchindex.js)", lambda p: p.name == "searchindex.js"),
]


def one_build(out: Path) -> dict:
    """One ``python -m workshop.site`` into ``out``: its wall and CPU seconds (the child's user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "workshop.site", "--out", str(out)], cwd=ROOT, check=True,
                   capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def site_contents(html: Path) -> dict:
    """The built site: its pages (one per document), files, bytes, and the bytes of each of :data:`PARTS`."""
    files = {path.relative_to(html): path.stat().st_size for path in html.rglob("*") if path.is_file()}
    parts = [{"part": label, "bytes": sum(size for path, size in files.items() if test(path))} for label, test in PARTS]
    return {"pages": len(build.rendered_pages(html)), "files": len(files),
            "bytes": sum(files.values()), "parts": parts}


def main(argv: list[str] | None = None) -> int:
    """Build the site ``--repeats`` times, write ``site.json`` and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]  # other work on the machine slows the wall time, not the CPU time
    with tempfile.TemporaryDirectory(prefix="bench-site-") as tmp:
        builds = [one_build(Path(tmp) / f"build-{n}") for n in range(args.repeats)]
        contents = site_contents(Path(tmp) / "build-0" / "html")
    walls = [build["wall_s"] for build in builds]
    payload = {"repeats": args.repeats, "load_average": round(load, 1), "builds": builds,
               "median_wall_s": statistics.median(walls),
               "median_cpu_s": statistics.median(build["cpu_s"] for build in builds), **contents}
    write_results("site", payload)
    print_table("make site (python -m workshop.site), each from scratch", builds, ["wall_s", "cpu_s"])
    print_table(f"The site: {contents['pages']} pages, {contents['files']} files, {contents['bytes']:,} bytes",
                contents["parts"], ["part", "bytes"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
