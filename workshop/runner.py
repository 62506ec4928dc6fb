"""Execute the numbered notebooks with papermill and summarise the run (``make run``).

``python -m workshop.runner`` runs every ``notebooks/NN_*.ipynb`` at its
default (smoke) parameters into ``runs/<timestamp>/`` and prints one line
per notebook with its status and time. ``--solutions`` runs each notebook
with its exercises' solutions inserted and run (``make solutions``, for an
instructor). ``--in-place`` refreshes the committed notebooks' outputs
(``make notebooks``): only from a clean working tree, and only once every
notebook ran, with papermill's machine-specific metadata removed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from helpers.settings import project_root
from helpers.worker_env import use_room_environment

# A notebook that needs a service the machine lacks raises this in its
# first cell; the runner reports it as skipped, not as a crash.
SKIP_MARKER = "NotebookSkipped"


# Floating-point results that do not depend on the machine's vector instructions: Intel MKL (PyTorch's BLAS on
# x86) and PyTorch's own kernels would otherwise pick AVX-512 paths where the CPU has them, whose sums round
# differently from AVX2's, and a seeded training run would end one test image apart on another machine. Set
# where outputs are compared with committed ones (the tests, `make notebooks`), inherited by the stack's Ray.
REPRODUCIBLE_NUMERICS = {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def reproducible_numerics(machine: str | None = None) -> dict[str, str]:
    """:data:`REPRODUCIBLE_NUMERICS` on an x86-64 machine; nothing on another (Apple silicon, aarch64 Linux).

    Both settings name x86 instruction sets: an ARM PyTorch has no AVX2 to pin and warns about the value. Its
    seeded accuracies come out a few images apart from the committed outputs, which are made on x86-64.
    """
    return dict(REPRODUCIBLE_NUMERICS) if (machine or platform.machine()).lower() in ("x86_64", "amd64") else {}


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

    A committed notebook then holds no machine facts, nothing blank and no frozen widget, and each
    exercise's cell shows ``[ ]``, as a cell the learner has yet to run.
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
        if "exercise" in cell.get("metadata", {}).get("tags", []):
            cell["execution_count"] = None
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


def with_solutions_file(notebook: Path, folder: Path) -> Path:
    """A copy of ``notebook`` in ``folder`` with its exercises' solutions inserted as code cells.

    See :mod:`workshop.solutions`; the copy is hidden (a dot file) and the caller deletes it.
    """
    from workshop.solutions import with_solutions

    copy = folder / f".{notebook.stem}.solutions.ipynb"
    copy.write_text(json.dumps(with_solutions(json.loads(notebook.read_text())), indent=1))
    return copy


def execute(notebook: Path, output: Path, parameters: dict | None = None,
            cell_timeout: int = 900, solutions: bool = False) -> NotebookRun:
    """Run one notebook with papermill (cwd = its folder) and classify the result.

    ``solutions`` runs it with every exercise's solution inserted after its folded block.
    """
    import papermill

    from helpers.notebook import HEADLESS_ENV

    os.environ.setdefault(HEADLESS_ENV, "1")  # the kernel inherits it: progress bars print one final line
    use_room_environment()  # ... and this: no usage stats, no telemetry, no pickled models
    output.parent.mkdir(parents=True, exist_ok=True)
    source = with_solutions_file(notebook, output.parent) if solutions else notebook
    started = time.perf_counter()
    status, message = "ok", ""
    try:
        papermill.execute_notebook(
            str(source), str(output), parameters=parameters or {}, cwd=str(notebook.parent),
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
    finally:
        if solutions:
            source.unlink(missing_ok=True)
    return NotebookRun(notebook.name, status, time.perf_counter() - started, output, message)


def main(argv: list[str] | None = None) -> int:
    """Execute every notebook, print the summary; exit 1 if any failed."""
    parser = argparse.ArgumentParser(prog="python -m workshop.runner", description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="run only notebooks whose name contains this text")
    parser.add_argument("--before", metavar="NN", help="run only the notebooks numbered below NN (e.g. 04): what "
                                                        "a learner joining at NN would have run")
    parser.add_argument("--in-place", action="store_true",
                        help="refresh the committed notebooks' outputs (a clean working tree only)")
    parser.add_argument("--solutions", action="store_true",
                        help="run every exercise's solution too (make solutions), into runs/solutions-<time>/")
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
    if args.in_place and args.solutions:
        parser.error("--in-place writes the notebooks as a learner gets them: without --solutions")
    if args.in_place and not _clean_tree(root):
        return 2
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    out_dir = root / "runs" / (f"solutions-{stamp}" if args.solutions else stamp)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    for notebook in notebook_paths(root):
        skipped_by_choice = args.before and notebook.name[:2] >= args.before.zfill(2)
        if (args.only and args.only not in notebook.name) or skipped_by_choice:
            continue
        print(f"running {notebook.name} ...", flush=True)
        try:
            run = execute(notebook, out_dir / notebook.name, parameters, solutions=args.solutions)
        except KeyboardInterrupt:  # Ctrl-C: still say what ran, then stop
            runs.append(NotebookRun(notebook.name, "failed", 0.0, out_dir / notebook.name, "interrupted"))
            _print_summary(runs, root, out_dir, in_place=False)
            return 130
        runs.append(run)
        print(f"  {run.status} in {run.seconds:.1f} s {run.message}", flush=True)

    replaced = args.in_place and _replace_outputs(runs, root)
    _print_summary(runs, root, out_dir, replaced)
    if args.in_place:
        return 0 if replaced else 1
    return 1 if any(r.status == "failed" for r in runs) else 0


def _clean_tree(root: Path) -> bool:
    """Whether the working tree is clean, as the committed outputs must come from; one line when it is not."""
    from helpers import code_version

    version = code_version.current(root)
    if version is None or version.dirty:
        where = "not a git checkout" if version is None else f"changes in {', '.join(version.changed[:5])}"
        print(f"error: the committed outputs come from a clean working tree, and this one is not ({where}). "
              "Commit or stash the changes, then run `make notebooks` again.", file=sys.stderr)
        return False
    print(f"Outputs from git commit {version.commit[:12]} (a clean tree)")
    return True


def _replace_outputs(runs: list[NotebookRun], root: Path) -> bool:
    """Copy every run into ``notebooks/`` if every notebook ran; else nothing (one run makes all outputs, or none)."""
    if not all(run.status == "ok" for run in runs):
        print("Not every notebook ran: the committed outputs are left as they were.", file=sys.stderr)
        return False
    for run in runs:
        target = root / "notebooks" / run.name
        shutil.copyfile(run.output, target)
        strip_machine_metadata(target)
    return True


def _print_summary(runs: list[NotebookRun], root: Path, out_dir: Path, in_place: bool) -> None:
    where = "notebooks/ (in place)" if in_place else str(out_dir.relative_to(root)) + "/"
    print(f"\n{'notebook':<40} {'status':<8} {'seconds':>8}  why")
    for run in runs:
        print(f"{run.name:<40} {run.status:<8} {run.seconds:>8.1f}  {run.message if run.status != 'ok' else ''}")
    print(f"{'total':<40} {'':<8} {sum(r.seconds for r in runs):>8.1f}")
    print(f"Executed notebooks are in {where}")


if __name__ == "__main__":
    sys.exit(main())
