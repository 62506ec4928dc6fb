"""Execute the numbered notebooks with papermill and summarise the run (``make run``).

``python -m helpers.runner`` runs every ``notebooks/NN_*.ipynb`` at its
default (smoke) parameters into ``runs/<timestamp>/`` and prints one line
per notebook with its status and time. ``--in-place`` refreshes the
committed notebooks' outputs instead, with papermill's machine-specific
metadata removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from helpers.config import project_root

# A notebook that needs a service the machine lacks raises this in its
# first cell; the runner reports it as skipped, not as a crash.
SKIP_MARKER = "NotebookSkipped"


@dataclass(frozen=True)
class NotebookRun:
    """Outcome of one executed notebook."""

    name: str
    status: str  # "ok", "skipped" or "failed"
    seconds: float
    output: Path
    message: str = ""


def notebook_paths(root: Path | None = None, pattern: str = "[0-9][0-9]_*.ipynb") -> list[Path]:
    """The numbered notebooks, in order."""
    return sorted(((root or project_root()) / "notebooks").glob(pattern))


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _has_content(output: dict) -> bool:
    if output.get("output_type") == "stream":
        return bool("".join(output.get("text", "")).strip())
    data = {k: v for k, v in output.get("data", {}).items() if k != WIDGET_VIEW}
    return output.get("output_type") == "error" or any("".join(v).strip() if isinstance(v, (str, list)) else v
                                                       for v in data.values())


def strip_machine_metadata(path: Path) -> None:
    """Remove papermill's paths, per-cell timings, widget state and empty outputs from a notebook.

    A committed notebook then holds no machine facts, nothing blank and no frozen widget.
    """
    nb = json.loads(path.read_text())
    nb.get("metadata", {}).pop("papermill", None)
    nb.get("metadata", {}).pop("widgets", None)
    for cell in nb["cells"]:
        cell.get("metadata", {}).pop("papermill", None)
        cell.get("metadata", {}).pop("execution", None)
        if "outputs" in cell:
            for output in cell["outputs"]:
                output.get("data", {}).pop(WIDGET_VIEW, None)
            cell["outputs"] = [o for o in cell["outputs"] if _has_content(o)]
    path.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def local_kernel_manager():
    """A kernel manager that talks to the kernel over Unix sockets in a private folder where it can.

    Over TCP (Jupyter's default) the kernel warns that its traffic is unencrypted; a local run needs
    no network at all.
    """
    import tempfile

    from jupyter_client.manager import AsyncKernelManager
    from traitlets import Unicode, default

    if os.name != "posix":
        return AsyncKernelManager

    class LocalKernelManager(AsyncKernelManager):
        transport = Unicode("ipc")

        @default("ip")
        def _socket_path(self) -> str:
            return str(Path(tempfile.mkdtemp(prefix="kernel-")) / "ipc")

    return LocalKernelManager


def execute(notebook: Path, output: Path, parameters: dict | None = None,
            cell_timeout: int = 900) -> NotebookRun:
    """Run one notebook with papermill (cwd = its folder) and classify the result."""
    import papermill

    from helpers.notebook import HEADLESS_ENV

    os.environ.setdefault(HEADLESS_ENV, "1")  # the kernel inherits it: progress bars print one final line
    started = time.perf_counter()
    status, message = "ok", ""
    try:
        papermill.execute_notebook(
            str(notebook), str(output), parameters=parameters or {}, cwd=str(notebook.parent),
            progress_bar=False, execution_timeout=cell_timeout, kernel_name="python3",
            kernel_manager_class=local_kernel_manager(),
        )
    except papermill.PapermillExecutionError as err:
        status = "skipped" if err.ename == SKIP_MARKER else "failed"
        message = f"{err.ename}: {err.evalue}"
    except Exception as err:  # noqa: BLE001 - a dead kernel, a cell past the timeout: a row, not a crash
        status = "failed"
        first_line = (str(err).strip().splitlines() or [""])[0][:300]
        message = f"{type(err).__name__}: {first_line}"
    return NotebookRun(notebook.name, status, time.perf_counter() - started, output, message)


def main(argv: list[str] | None = None) -> int:
    """Execute every notebook, print the summary; exit 1 if any failed."""
    parser = argparse.ArgumentParser(prog="python -m helpers.runner", description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="run only notebooks whose name contains this text")
    parser.add_argument("--before", metavar="NN", help="run only the notebooks numbered below NN (e.g. 04): what "
                                                        "a learner joining at NN would have run")
    parser.add_argument("--in-place", action="store_true", help="refresh the committed notebooks' outputs")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                        help="papermill parameter for every notebook (value parsed as JSON when it can be)")
    args = parser.parse_args(argv)

    parameters = {}
    for name, raw in args.parameter:
        try:
            parameters[name] = json.loads(raw)
        except json.JSONDecodeError:
            parameters[name] = raw
    root = project_root()
    numbers = [path.name[:2] for path in notebook_paths(root)]
    if args.before is not None and (not args.before.isdigit() or args.before.zfill(2) not in numbers):
        parser.error(f"--before (make catch-up NN=...) must be a notebook's number, one of {', '.join(numbers)}; "
                     f"not {args.before!r}")
    if args.only and not any(args.only in path.name for path in notebook_paths(root)):
        parser.error(f"--only {args.only!r} matches no notebook in notebooks/")
    out_dir = root / "runs" / datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for notebook in notebook_paths(root):
        skipped_by_choice = args.before and notebook.name[:2] >= args.before.zfill(2)
        if (args.only and args.only not in notebook.name) or skipped_by_choice:
            continue
        print(f"running {notebook.name} ...", flush=True)
        try:
            run = execute(notebook, out_dir / notebook.name, parameters)
        except KeyboardInterrupt:  # Ctrl-C: still say what ran, then stop
            runs.append(NotebookRun(notebook.name, "failed", 0.0, out_dir / notebook.name, "interrupted"))
            _print_summary(runs, root, out_dir, args.in_place)
            return 130
        if args.in_place and run.status == "ok":  # a skipped or failed run never replaces the committed outputs
            shutil.copyfile(run.output, notebook)
            strip_machine_metadata(notebook)
        runs.append(run)
        print(f"  {run.status} in {run.seconds:.1f} s {run.message}", flush=True)

    _print_summary(runs, root, out_dir, args.in_place)
    return 1 if any(r.status == "failed" for r in runs) else 0


def _print_summary(runs: list[NotebookRun], root: Path, out_dir: Path, in_place: bool) -> None:
    where = "notebooks/ (in place)" if in_place else str(out_dir.relative_to(root)) + "/"
    print(f"\n{'notebook':<40} {'status':<8} {'seconds':>8}  why")
    for run in runs:
        print(f"{run.name:<40} {run.status:<8} {run.seconds:>8.1f}  {run.message if run.status != 'ok' else ''}")
    print(f"{'total':<40} {'':<8} {sum(r.seconds for r in runs):>8.1f}")
    print(f"Executed notebooks are in {where}")


if __name__ == "__main__":
    sys.exit(main())
