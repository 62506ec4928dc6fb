"""``make submit NB=04 ARGS="-p epochs 3"``: a notebook as a Ray Job, from a laptop or CI to any Ray cluster.

The Jobs API is how a cluster is used from outside it. This sends the project (the job's working folder,
without the virtual environment, the stack's state or earlier runs) to the cluster's dashboard with
``JobSubmissionClient``, runs ``python -m workshop.notebook_job`` there (papermill, as ``make run``), and
streams the job's log here. The executed notebook comes back into ``runs/submitted/`` where the bucket
can be read from here, or its ``s3://`` address is printed. The exit status is the job's: 0 when the
notebook ran, 1 when it failed, 130 after Ctrl-C (which stops the job too).

Where: ``--address`` (``ADDRESS=`` for make), else ``RAY_API_SERVER_ADDRESS`` (Ray's own variable for
the Jobs API), else the dashboard of the lab's Ray (``make lab``). Ray's token goes along where Ray asks
for one: the lab's Ray's own, else ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``.
The cluster's nodes need the settings themselves (the stack's Ray has them; compose and KubeRay pass
them from their secrets): no key or password travels with the job.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import sys
import time
from pathlib import Path

from helpers.errors import TutorialError
from helpers.settings import project_root

# Not sent with the job: the environment and state of this machine, earlier results, pictures.
EXCLUDES = [".venv/", ".stack/", "runs/", ".git/", "docs/", "benchmarks/results/", "**/__pycache__/",
            ".ruff_cache/", ".pytest_cache/", "*.png", ".env"]


class SubmitError(TutorialError, RuntimeError):
    """The job could not be submitted: no cluster, a refused token (the message says what to do)."""


def dashboard_address(given: str | None = None) -> str:
    """The Jobs API's address: ``given``, ``RAY_API_SERVER_ADDRESS``, or the lab's dashboard."""
    from helpers import stack_ray
    from helpers.settings import state_dir

    address = given or os.environ.get("RAY_API_SERVER_ADDRESS")
    if not address:
        service = stack_ray.read_service(state_dir())
        address = service and service.get("dashboard")
    if not address:
        raise SubmitError("No Ray dashboard to submit to: start `make lab` (its Ray has one), or name a "
                          "cluster's: make submit NB=04 ADDRESS=http://<head>:8265")
    return address if "://" in address else f"http://{address}"


def _same_local_address(address: str, dashboard: str) -> bool:
    """Whether ``address`` names the lab's ``dashboard`` (``localhost`` and ``127.0.0.1`` alike)."""
    from urllib.parse import urlsplit

    given, lab = urlsplit(address if "://" in address else f"http://{address}"), urlsplit(dashboard)
    local = ("127.0.0.1", "localhost")
    return given.hostname in local and lab.hostname in local and given.port == lab.port


def _client(address: str):
    """A ``JobSubmissionClient`` that sends Ray's token where there is one."""
    from ray.job_submission import JobSubmissionClient

    from helpers import stack_ray
    from helpers.cluster import TOKEN_HINT
    from helpers.settings import state_dir

    service = stack_ray.read_service(state_dir())
    if service is not None and service.get("dashboard") and _same_local_address(address, service["dashboard"]):
        stack_ray.send_its_token(service)  # the lab's Ray: its token of this start
    elif os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH") or (
            Path.home() / ".ray" / "auth_token").is_file():
        stack_ray.use_token_auth()
    try:
        return JobSubmissionClient(address)
    except Exception as err:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError here
        text = " ".join(str(err).split())[:300]
        hint = TOKEN_HINT if "401" in text or "token" in text.lower() else "is it running, and is this its dashboard?"
        raise SubmitError(f"The Ray dashboard at {address} refused or did not answer ({text}): {hint}") from None


async def _follow(client, job_id: str) -> None:
    async for lines in client.tail_job_logs(job_id):
        print(lines, end="", flush=True)


def fetch_result(log: str, job_id: str, root: Path) -> str:
    """The executed notebook the job kept in the bucket, copied into ``runs/submitted/<job>/``; one line."""
    from helpers.storage import get_client
    from workshop.notebook_job import RESULT_LINE

    where = next((line.split(RESULT_LINE, 1)[1].strip() for line in reversed(log.splitlines())
                  if RESULT_LINE in line), None)
    if where is None:
        return "The job kept no executed notebook (it stopped before papermill ended); its log is above."
    bucket, key = where.removeprefix("s3://").split("/", 1)
    target = root / "runs" / "submitted" / job_id / key.rsplit("/", 1)[1]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        get_client(retries=0).fget_object(bucket, key, str(target))
    except Exception as err:  # noqa: BLE001 - the cluster's bucket may not be reachable from here
        return f"The executed notebook is at {where} (not readable from here: {type(err).__name__})."
    return f"The executed notebook: {target.relative_to(root)} (also at {where})."


def submit(notebook: str, parameters: list[list[str]], address: str | None = None) -> int:
    """Submit notebook ``notebook`` with papermill ``parameters``; stream its log; the job's exit status."""
    from ray.job_submission import JobStatus

    from workshop.notebook_job import find_notebook

    root = project_root()
    path = find_notebook(notebook, root)
    address = dashboard_address(address)
    client = _client(address)
    arguments = " ".join(f"-p {shlex.quote(name)} {shlex.quote(value)}" for name, value in parameters)
    job_id = client.submit_job(
        entrypoint=f"python -m workshop.notebook_job {path.name} {arguments}".strip(),
        runtime_env={"working_dir": str(root), "excludes": EXCLUDES},
        submission_id=f"notebook-{path.name[:2]}-{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(2).hex()}",
        metadata={"notebook": path.name})
    print(f"Submitted {path.name} to {address} as job {job_id}; its log follows (Ctrl-C stops the job).",
          flush=True)
    try:
        asyncio.run(_follow(client, job_id))
        status = client.get_job_status(job_id)
        while not status.is_terminal():  # the log can end a moment before the status does
            time.sleep(0.5)
            status = client.get_job_status(job_id)
    except KeyboardInterrupt:
        client.stop_job(job_id)
        print(f"\nStopped job {job_id} (Ctrl-C).")
        return 130
    print(fetch_result(client.get_job_logs(job_id), job_id, root))
    print(f"Job {job_id}: {status.value}.")
    return 0 if status == JobStatus.SUCCEEDED else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m workshop.submit NB [-p NAME VALUE ...] [--address URL]``."""
    parser = argparse.ArgumentParser(prog="python -m workshop.submit", description=__doc__.split("\n")[0])
    parser.add_argument("notebook", help="its number, e.g. 04")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="a papermill parameter (value read as JSON where it is JSON)")
    parser.add_argument("--address", help="the cluster's dashboard, http://<head>:8265 (default: see above)")
    args = parser.parse_args(argv)
    try:
        return submit(args.notebook, args.parameter, args.address)
    except SubmitError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
