"""Notebooks 04 and 06 at full size, one after the other in one run: 06's time as a multiple of 04's.

Notebook 06 trains each experiment through notebook 04's Ray Train loop, on Ray Data built from the
pointers a lakeFS commit lists. This measures what that costs against notebook 04 itself, both on
every image of the bucket (``smoke_test_size=0``: 60,000 training and 10,000 test images), on the
same machine in the same run. Notebook 06 runs against lakeFS where one answers, else against the
tests' API double (the JSON says which).

    python benchmarks/bench_full_size.py [--bucket bench-listing]

Writes ``benchmarks/results/full_size.json``.
"""

from __future__ import annotations

import argparse
import tempfile
import uuid
from pathlib import Path

from common import lakefs_or_double, print_table, summary_facts, write_results

from helpers import stack, upload
from helpers.runner import execute, notebook_paths

TARGET = 3.0  # notebook 06 at most this many times notebook 04, at full size
KEPT = {"04": ("test accuracy", "load seconds", "training seconds", "epochs"),
        "06": ("objects imported", "experiments", "winner", "winner accuracy", "reproduced")}


def main(argv: list[str] | None = None) -> int:
    """Run 04 then 06 at full size and write the JSON; exit 1 when a notebook fails."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bucket", default="bench-listing", help="a bucket of its own: every image goes in")
    args = parser.parse_args(argv)

    settings = stack.ensure_stack()
    upload.upload_mnist(args.bucket, 0, progress=False)  # the notebooks find it complete
    out = Path(tempfile.mkdtemp(prefix="full-size-"))
    rows = []
    with lakefs_or_double(settings) as lakefs:
        for number, extra in (("04", {}), ("06", {"repo_name": f"full-{uuid.uuid4().hex[:8]}"})):
            (notebook,) = notebook_paths(pattern=f"{number}_*.ipynb")
            run = execute(notebook, out / notebook.name, {"bucket": args.bucket, "smoke_test_size": 0, **extra},
                          cell_timeout=3600)
            facts = summary_facts(run.output) if run.output.is_file() else {}
            print(f"  {notebook.name}: {run.status} in {run.seconds:.0f} s {run.message}", flush=True)
            rows.append({"notebook": number, "status": run.status, "seconds": round(run.seconds, 1),
                         **{key: facts.get(key) for key in KEPT[number]}})
    ok = all(row["status"] == "ok" for row in rows)
    ratio = round(rows[1]["seconds"] / rows[0]["seconds"], 2) if ok else None
    path = write_results("full_size", {
        "bucket": args.bucket, "lakefs": lakefs, "rows": rows, "ratio_06_to_04": ratio, "target_ratio": TARGET,
        "met": None if ratio is None else ratio <= TARGET})
    print_table("Full size (every image), one run", rows, ["notebook", "status", "seconds"])
    print(f"\nnotebook 06 / notebook 04: {ratio} (target at most {TARGET}); {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
