"""A notebook as a Ray Job's entrypoint: run it with papermill, keep the executed notebook in the bucket.

``python -m workshop.notebook_job 04 -p epochs 3`` is what ``make submit`` (:mod:`workshop.submit`) asks a
cluster to run, in a copy of this project (the job's working folder). The notebook runs as ``make run``
runs it (:func:`workshop.runner.execute`); the executed notebook, outputs or the error it stopped at, then
goes to ``s3://ray/notebook-runs/<time>-<notebook>`` (a job's folder is gone once it ends) and one line
says where. The exit status is the notebook's: 1 when a cell failed, else 0 (a skipped notebook says why).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from workshop.runner import execute, notebook_paths

RESULTS_BUCKET = "ray"  # the bucket the compose and KubeRay stacks create for Ray's results
RESULTS_PREFIX = "notebook-runs"
RESULT_LINE = "executed notebook: "  # followed by s3://<bucket>/<key>; make submit reads it from the job's log


def find_notebook(number: str, root: Path | None = None) -> Path:
    """``notebooks/<number>_*.ipynb``; a name that is not one gets one line listing the notebooks."""
    paths = notebook_paths(root)
    found = [p for p in paths if p.name.startswith(f"{number.zfill(2)}_") or p.name == number]
    if len(found) != 1:
        names = ", ".join(p.name[:2] for p in paths)
        raise SystemExit(f"error: no notebook {number!r}: NB must be one of {names}")
    return found[0]


def parameters(pairs: list[list[str]]) -> dict[str, object]:
    """``-p NAME VALUE`` pairs as papermill parameters, each value read as JSON where it is JSON."""
    out: dict[str, object] = {}
    for name, raw in pairs:
        try:
            out[name] = json.loads(raw)
        except json.JSONDecodeError:
            out[name] = raw
    return out


def keep_in_bucket(path: Path) -> str:
    """Upload the executed notebook to the results bucket; its ``s3://`` address."""
    from helpers.storage import ensure_bucket, get_client

    key = f"{RESULTS_PREFIX}/{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-{path.name}"
    client = get_client()
    ensure_bucket(client, RESULTS_BUCKET)
    client.fput_object(RESULTS_BUCKET, key, str(path), content_type="application/x-ipynb+json")
    return f"s3://{RESULTS_BUCKET}/{key}"


def main(argv: list[str] | None = None) -> int:
    """Run one notebook, keep it in the bucket, print where; the notebook's exit status."""
    parser = argparse.ArgumentParser(prog="python -m workshop.notebook_job", description=__doc__.split("\n")[0])
    parser.add_argument("notebook", help="its number (04) or file name")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    args = parser.parse_args(argv)
    notebook = find_notebook(args.notebook)
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / notebook.name
        print(f"running {notebook.name} with {parameters(args.parameter) or 'its defaults'} ...", flush=True)
        run = execute(notebook, output, parameters(args.parameter))
        print(f"{notebook.name}: {run.status} in {run.seconds:.1f} s {run.message}".rstrip(), flush=True)
        if output.is_file():
            print(RESULT_LINE + keep_in_bucket(output), flush=True)
    return 1 if run.status == "failed" else 0  # skipped: the notebook said why (no lakeFS, say)


if __name__ == "__main__":
    sys.exit(main())
