"""The workshop path as a learner runs it: ``make lab``, then every notebook restarted and run in JupyterLab.

Playwright drives Debian's Chromium (``apt-get install chromium``; Playwright's own browser download
is not used). The lab runs on the session's private stack, and notebook 06 on the lakeFS test double
where no lakeFS server runs. Each notebook is opened in a fresh JupyterLab workspace, run with the
toolbar's "Restart the kernel and run all cells", saved, and checked: in the saved file (every code
cell ran, no error, no unexpected stderr, the checked cells' outputs as committed, compared as nbval compares
them) and on the page (widgets, diagrams, collapsed solutions). In ``make test`` this module runs right after
nbval, in the same test process and on the same stack: the rerun a learner makes on a reused ``.stack``,
where the registry already holds a champion, lakeFS the ``model-v1`` tag and the bucket the predictions.
The dashboard and MLflow are then checked as a learner would open them.

Without Chromium or Playwright the module is skipped with one line; with ``TUTORIAL_REQUIRE_BROWSER=1``
(set by ``.ci/run``) that is a failure. Screenshots go to ``runs/browser/`` (git-ignored).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from helpers import stack_ray
from helpers.settings import project_root
from tests.platform.chromium import REQUIRE_ENV
from tests.suite.committed_outputs import differences
from tests.suite.ray_processes import ray_processes
from workshop import stack_ports

SHOTS = project_root() / "runs" / "browser"
NOTEBOOKS = ["01_upload_mnist", "02_list_and_split", "03_ray_data_preprocessing", "04_distributed_training",
             "05_tune_sweeps", "06_lakefs_parallel_experiments", "07_batch_inference", "08_serve_the_champion"]
# stderr a notebook may print in JupyterLab, each with the reason it is expected. Anything else fails.
EXPECTED_STDERR: list[tuple[str, str]] = []

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.notebook]


@dataclass
class Lab:
    """A running ``python -m workshop.lab`` and what it printed."""

    proc: subprocess.Popen
    notebook_dir: Path
    urls: dict[str, str]
    output: list[str] = field(default_factory=list)

    @property
    def jupyter(self) -> tuple[str, str]:
        """``(base URL, token)`` of JupyterLab."""
        base, token = self.urls["JupyterLab"].split("/lab?token=")
        return base, token

    def close_notebook(self, name: str) -> None:
        """Shut down ``name``'s kernel, as a learner closes a notebook they are done with.

        A kernel that ran a notebook holds PyTorch, Ray's driver and its data: eight of them at once took
        gigabytes the other test process needed.
        """
        import json as json_module
        import urllib.request

        base, token = self.jupyter
        headers = {"Authorization": f"token {token}"}
        with urllib.request.urlopen(urllib.request.Request(f"{base}/api/sessions", headers=headers), timeout=30) as r:
            sessions = [s for s in json_module.loads(r.read()) if s["path"].endswith(f"{name}.ipynb")]
        for session in sessions:
            urllib.request.urlopen(urllib.request.Request(f"{base}/api/sessions/{session['id']}", headers=headers,
                                                          method="DELETE"), timeout=60).close()

    def stop(self, sig: int = signal.SIGINT, timeout: float = 120) -> int:
        """Send ``sig`` (Ctrl-C by default) to the lab and wait for it to clean up; its exit status.

        A learner's lab runs under ``runuser``, which does not pass Ctrl-C on: the signal goes to the lab itself.
        """

        if self.proc.poll() is None:
            labs = [p for p in psutil.Process(self.proc.pid).children(recursive=True)
                    if "workshop.lab" in " ".join(p.cmdline())]
            (labs[0] if labs else self.proc).send_signal(sig)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise
        self.output += self.proc.stdout.read().splitlines() if self.proc.stdout else []
        return self.proc.returncode


def start_lab(notebook_dir: Path, env: dict[str, str], user: str | None = None, timeout: float = 240) -> Lab:
    """``python -m workshop.lab`` on free ports (as ``user`` through ``runuser`` when given); returns once it printed
    its URLs, which it does once JupyterLab answers."""
    ports = stack_ports.free_ports(["jupyter", "dashboard", "sign_in"])
    command = [sys.executable, "-m", "workshop.lab", "--jupyter-port", str(ports["jupyter"]),
               "--dashboard-port", str(ports["dashboard"]), "--sign-in-port", str(ports["sign_in"]),
               "--notebook-dir", str(notebook_dir)]
    if user:
        command = ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *command]
    proc = subprocess.Popen(command, env=env, cwd=project_root(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, bufsize=1)
    lab = Lab(proc, notebook_dir, {})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lab.output.append(line.rstrip("\n"))
        found = re.match(r"\s{2}(JupyterLab|Ray dashboard|MLflow|lakeFS)\s+(\S+)", line)
        if found:
            lab.urls[found.group(1)] = found.group(2)
        if line.startswith("Ctrl-C stops"):
            return lab
    proc.kill()
    pytest.fail("make lab did not print its URLs:\n" + "\n".join(lab.output[-20:]))


def lab_environment(owner: str | None = None) -> dict[str, str]:
    """The session's environment for the lab, with JupyterLab's settings and workspaces in a folder of their own.

    Notebooks render every cell (no windowing), so the page can be checked cell by cell. Nothing else is set:
    no news prompt covers the page because the lab's own settings say so (checked below).
    ``owner`` gets the folder (a learner's lab runs as them).
    """
    settings = Path(tempfile.mkdtemp(prefix="lab-settings-"))
    for plugin, values in {"@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"}}.items():
        path = settings / "user" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    (settings / "workspaces").mkdir(parents=True, exist_ok=True)
    if owner is not None:
        subprocess.run(["chown", "-R", owner, str(settings)], check=True)
    return {**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings / "user"),
            "JUPYTERLAB_WORKSPACES_DIR": str(settings / "workspaces")}


def copy_notebooks(target: Path, names: list[str]) -> Path:
    """Copies of the notebooks: JupyterLab saves what it ran, and the committed ones must stay as they are."""
    target.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(project_root() / "notebooks" / f"{name}.ipynb", target)
    return target


# --- what a run in JupyterLab must show ---------------------------------------------------

def cells_of(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def tagged(cell: dict, tag: str) -> bool:
    return tag in cell.get("metadata", {}).get("tags", [])


def unexpected_stderr(cells: list[dict]) -> list[str]:
    """stderr lines no entry of :data:`EXPECTED_STDERR` explains."""
    lines = [line for cell in cells if cell["cell_type"] == "code" for out in cell.get("outputs", [])
             if out.get("name") == "stderr" for line in "".join(out["text"]).splitlines() if line.strip()]
    return [line for line in lines if not any(re.search(pattern, line) for pattern, _ in EXPECTED_STDERR)]


def wait_for_idle_kernel(page, timeout: float = 120) -> None:
    """Wait until the notebook's kernel is connected and idle.

    The toolbar's indicator says "idle" for a moment before the kernel connects; a restart clicked then
    can leave the kernel "starting" for ever. The status bar's "| Idle", twice half a second apart, is sure.
    """
    deadline, seen = time.monotonic() + timeout, 0
    while time.monotonic() < deadline and seen < 2:
        page.wait_for_timeout(500)
        idle = any("| Idle" in text for text in page.locator(".jp-StatusBar-Widget").all_inner_texts())
        seen = seen + 1 if idle else 0
    assert seen >= 2, "the notebook's kernel did not become idle"


def run_all_in_jupyterlab(page, lab: Lab, name: str, timeout: float = 480, state: Path | None = None) -> float:
    """Open ``name`` in a fresh workspace, Restart-and-run-all from the toolbar, wait for the end, save."""
    base, token = lab.jupyter
    page.goto(f"{base}/lab/workspaces/test-{uuid.uuid4().hex[:8]}/tree/{name}.ipynb?reset&token={token}")
    wait_for_idle_kernel(page)
    started = time.monotonic()
    page.click("[data-command='notebook:restart-run-all']")
    page.click(".jp-Dialog .jp-mod-accept")  # "Restart Kernel?" -> Restart
    running = page.locator(".jp-Notebook .jp-CodeCell .jp-InputPrompt", has_text="[*]")
    running.first.wait_for(timeout=120_000)  # the run began: every cell queued
    while time.monotonic() - started < timeout:
        page.wait_for_timeout(1000)
        status = page.get_attribute(".jp-Notebook-ExecutionIndicator", "data-status")
        if running.count() == 0 and status == "idle":
            break
    else:
        log = (state or Path(os.environ["STACK_STATE_DIR"])) / "logs" / "jupyterlab.log"
        pytest.fail(f"{name} did not finish within {timeout:.0f} s (kernel {status}, {running.count()} cells "
                    f"queued); JupyterLab's log ends:\n" + "\n".join(log.read_text().splitlines()[-25:]))
    seconds = time.monotonic() - started
    page.keyboard.press("Control+s")
    page.wait_for_function("() => !document.querySelector('.jp-mod-dirty')", timeout=30_000)
    return seconds


def check_run(page, path: Path) -> None:
    """What a learner must see after Restart-and-run-all: the saved file and the page."""
    cells = cells_of(path)
    code = [c for c in cells if c["cell_type"] == "code"]
    errors = [f"{o['ename']}: {o['evalue']}"[:300] for c in code for o in c.get("outputs", [])
              if o["output_type"] == "error"]
    assert not errors, f"{path.name}: error output {errors}"
    counts = [c.get("execution_count") for c in code]  # a fresh kernel numbers the cells it ran from 1
    assert counts == list(range(1, len(code) + 1)), f"{path.name}: not every code cell ran, in order: {counts}"
    assert not unexpected_stderr(cells), f"{path.name}: unexpected stderr {unexpected_stderr(cells)[:5]}"
    # progress bars are live widgets, each one rendered
    widgets = sum("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for c in code
                  for o in c.get("outputs", []))
    assert page.get_by_text("Loading widget...").count() == 0
    assert page.get_by_text("Error displaying widget").count() == 0
    assert page.locator(".jp-OutputArea-output .widget-hprogress").count() >= widgets
    # every mermaid block rendered as an SVG picture, none left as a parse warning
    diagrams = sum("".join(c["source"]).count("```mermaid") for c in cells if c["cell_type"] == "markdown")
    assert page.locator(".jp-RenderedMermaid.jp-mod-warning").count() == 0, f"{path.name}: a diagram did not parse"
    assert page.locator(".jp-RenderedMermaid img[src^='data:image/svg+xml']").count() == diagrams
    # the exercises: a cell to write in (comments only, it ran and showed nothing), the solution folded away in a
    # markdown <details> block that run all never runs and that stays closed until the learner opens it
    exercises = [c for c in code if tagged(c, "exercise")]
    solutions = [c for c in cells if tagged(c, "solution")]
    assert len(exercises) == len(solutions) >= 2 and all(c["cell_type"] == "markdown" for c in solutions)
    assert not [c for c in code if tagged(c, "solution") or tagged(c, "solution-run")], "no solution ran"
    assert all(c["execution_count"] and not c.get("outputs") for c in exercises)
    folded = page.locator(".jp-MarkdownCell details")
    assert folded.count() == len(solutions) and page.locator(".jp-MarkdownCell details[open]").count() == 0
    assert folded.first.locator("summary", has_text="Solution").count() == 1
    assert not folded.first.locator("pre").first.is_visible(), "the solution's code is hidden until opened"


def summary(path: Path) -> dict:
    """The facts the notebook's summary cell displayed."""
    cell = next(c for c in cells_of(path) if tagged(c, "summary"))
    return next(o["data"]["application/json"] for o in cell["outputs"] if "application/json" in o.get("data", {}))


# Where each notebook's screenshot looks: the section whose output shows the lesson best.
SHOT_AT = {"01": "Upload, in parallel", "02": "Faster listings", "03": "Who did the work",
           "04": "The curves, read back from MLflow", "05": "Every trial", "06": "Compare: read back from lakeFS",
           "07": "The hardest digits", "08": "Roll to another version, under load"}


def shoot(page, name: str, heading: str | None = None) -> Path:
    """A screenshot into ``runs/browser/``, the notebook scrolled to ``heading`` where it has one."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    target = page.locator("h2", has_text=heading) if heading else None
    if target is not None and target.count():
        target.first.evaluate("element => element.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(500)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path))
    return path


# --- fixtures ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def lab(browser, settings, lakefs_kind, tmp_path_factory):
    """``make lab`` on the session's stack, serving copies of the notebooks."""
    started = start_lab(copy_notebooks(tmp_path_factory.mktemp("lab"), NOTEBOOKS), lab_environment())
    yield started
    if started.proc.poll() is None:
        started.stop()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    yield context.new_page()
    context.close()


# --- the tests --------------------------------------------------------------------------------

def test_make_lab_prints_its_urls_once_jupyterlab_answers(lab):
    assert {"JupyterLab", "Ray dashboard", "MLflow"} <= set(lab.urls)
    if os.geteuid() == 0:
        assert any("Running as root: JupyterLab starts with --allow-root" in line for line in lab.output)
    import urllib.request

    with urllib.request.urlopen(lab.urls["JupyterLab"], timeout=10) as answer:  # it answers by the time it is printed
        assert answer.status == 200


NEWS_PROMPT = "Would you like to get notified about official Jupyter news?"


def test_the_lab_s_page_asks_no_host_but_the_lab_s_own_and_no_news_question(lab, browser):
    """Nothing in the room asks for the internet: the page's requests all go to JupyterLab's own address (any
    other is blocked and counted), and it neither asks about Jupyter's news nor checks for a newer version."""
    base, _ = lab.jupyter
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    elsewhere: list[str] = []

    def only_the_lab(route) -> None:
        if route.request.url.startswith((base + "/", base.replace("http", "ws") + "/")):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_lab)
    page = context.new_page()
    try:
        page.goto(lab.urls["JupyterLab"])
        page.wait_for_selector(".jp-Launcher", timeout=60_000)
        page.wait_for_timeout(8_000)  # the news question comes a few seconds after the page is up
        shoot(page, "lab-first-page")
        assert page.get_by_text(NEWS_PROMPT).count() == 0, "JupyterLab asked about Jupyter's news"
        assert page.locator(".jp-Notification-Toast-info, .Toastify__toast").count() == 0
    finally:
        context.close()
    assert elsewhere == [], f"the lab's page asked other hosts: {elsewhere[:5]}"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_restart_and_run_all_in_jupyterlab(lab, page, name, lakefs_kind, settings):
    """Each notebook as a learner runs it. 04 is first interrupted in the middle of its fit, as a learner
    presses Interrupt: its Restart-and-run-all is then the run after an interrupt, which must be clean."""
    if name.startswith("04"):
        interrupt_04_in_its_fit(lab, page, settings)
    seconds = run_all_in_jupyterlab(page, lab, name)
    path = lab.notebook_dir / f"{name}.ipynb"
    shoot(page, name, SHOT_AT.get(name[:2]))
    check_run(page, path)
    # The committed outputs, compared as nbval compares them: where nbval ran before in this process (make
    # test), this is the rerun a learner makes on a reused stack, with a champion, tags and predictions there
    assert not (differ := differences(path, project_root() / "notebooks" / f"{name}.ipynb")), "\n".join(differ)
    facts = summary(path)
    if name.startswith("03"):
        assert facts["actor processes"] == 2, "both ObjectPreprocessor actors worked"
    if name.startswith("04"):
        lab.urls["04 run"] = facts["MLflow run id"]
    print(f"{name}: {seconds:.0f} s in JupyterLab")
    if not name.startswith(("07", "08")):  # 07's and 08's kernels: the interrupt test runs their cells again
        lab.close_notebook(name)


def interrupt_04_in_its_fit(lab, page, settings) -> None:
    """The Interrupt button in the middle of 04's fit: one line saying what stopped and what to run next, no
    SystemExit and no path of the machine; Ray stops the run's workers. (Its Restart-and-run-all follows.)"""
    name = "04_distributed_training"
    path = lab.notebook_dir / f"{name}.ipynb"
    original = path.read_text()
    nb = json.loads(original)
    parameters = next(c for c in nb["cells"] if tagged(c, "parameters"))
    parameters["source"] = "".join(parameters["source"]).replace("epochs = 10", "epochs = 2000").replace(
        "cache_shard = True", "cache_shard = False")  # a fit of minutes: it is surely running when interrupted
    path.write_text(json.dumps(nb))
    try:
        base, token = lab.jupyter
        page.goto(f"{base}/lab/workspaces/test-{uuid.uuid4().hex[:8]}/tree/{name}.ipynb?reset&token={token}")
        wait_for_idle_kernel(page)
        page.click("[data-command='notebook:restart-run-all']")
        page.click(".jp-Dialog .jp-mod-accept")
        fit = page.locator(".jp-Notebook .jp-CodeCell", has_text="result = trainer.fit()")
        # The cell before the fit names this run's MLflow run (until it runs, it shows the committed run's).
        before = page.locator(".jp-Notebook .jp-CodeCell", has_text="params = check_params(")
        committed = re.search(r"/runs/([0-9a-f]{32})", json.dumps(next(
            c["outputs"] for c in nb["cells"] if "params = check_params(" in "".join(c["source"]))))[1]
        deadline, run_id = time.monotonic() + 300, committed
        while run_id == committed:
            assert time.monotonic() < deadline, "the cell before the fit named no new MLflow run in 300 s"
            page.wait_for_timeout(1000)
            shown = " ".join(before.locator(".jp-OutputArea-output").all_inner_texts())
            found = re.search(r"/runs/([0-9a-f]{32})", shown)
            run_id = found[1] if found else committed
        wait_for_epochs(settings, run_id, 2)  # the fit is in its epochs, on a machine as busy as it may be
        page.click("[data-command='notebook:interrupt-kernel']")
        started = time.monotonic()
        try:
            fit.locator(".jp-OutputArea-output", has_text="Interrupted:").wait_for(timeout=90_000)
        except Exception as error:
            shown = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
            raise AssertionError(f"no 'Interrupted:' under the fit; the notebook shows:\n{shown[-3000:]}") from error
        stopped_after = time.monotonic() - started
        print(f"the fit's cell stopped {stopped_after:.1f} s after Interrupt")
        assert stopped_after < 30, "the cell stops within seconds"
        wait_for_idle_kernel(page)
        shown = fit.locator(".jp-OutputArea-output").all_inner_texts()
        errors = [text for text in shown if "Interrupted:" in text]
        assert len(errors) == 1 and errors[0].strip().count("\n") == 0, errors
        assert re.fullmatch(r"Interrupted: Training stopped: you interrupted it\. Run this cell again: training "
                            r"(resumes from the checkpoint of epoch \d+|starts over, as no checkpoint was saved "
                            r"yet)\.", errors[0].strip()), errors[0]
        everything = "\n".join(page.locator(".jp-OutputArea-output").all_inner_texts())
        assert "SystemExit" not in everything and "To exit: use" not in everything and "/root/" not in everything
        shoot(page, "lab-04-interrupted", "Fit")
    finally:
        path.write_text(original)
    gcs_address = stack_ray.read_service(Path(os.environ["STACK_STATE_DIR"]))["address"]  # the lab's Ray, not nbval's
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and ray_processes(gcs_address, "RayTrainWorker"):
        time.sleep(1)
    assert time.monotonic() < deadline, "Ray stopped the interrupted run's workers"


def run_cell(page, text: str):
    """Select the code cell that shows ``text`` and run it from the toolbar; returns the cell and its prompt before.

    A quick cell can be done before its ``[*]`` is ever seen: the prompt's new number says it ran.
    """
    cell = page.locator(".jp-Notebook .jp-CodeCell", has_text=text).first
    before = cell.locator(".jp-InputPrompt").inner_text().strip()
    cell.locator(".jp-InputPrompt").click()
    page.click("[data-command='notebook:run-cell-and-select-next']")
    return cell, before


def run_done(page, text: str, timeout: float = 180) -> None:
    """Run the code cell that shows ``text`` and wait until it is done, without an error."""
    cell, before = run_cell(page, text)
    deadline = time.monotonic() + timeout
    while not re.fullmatch(r"\[\d+\]:", now := cell.locator(".jp-InputPrompt").inner_text().strip()) or now == before:
        assert time.monotonic() < deadline, f"the cell with {text!r} did not finish in {timeout:.0f} s ({now})"
        page.wait_for_timeout(250)
    assert cell.locator(".jp-OutputArea-output", has_text="Traceback").count() == 0, text


def interrupted_line(page, cell, after: float) -> str:
    """Press Interrupt ``after`` seconds into ``cell``'s run; the one line the cell then shows."""
    page.wait_for_timeout(after * 1000)
    assert cell.locator(".jp-InputPrompt", has_text="[*]").count() == 1, "the cell still runs when interrupted"
    page.click("[data-command='notebook:interrupt-kernel']")
    cell.locator(".jp-OutputArea-output", has_text="Interrupted:").wait_for(timeout=90_000)
    wait_for_idle_kernel(page)
    shown = [text.strip() for text in cell.locator(".jp-OutputArea-output").all_inner_texts()]
    lines = [text for text in shown if "Interrupted:" in text]
    assert len(lines) == 1 and lines[0].count("\n") == 0, shown
    assert not [text for text in shown if "Traceback" in text or "SystemExit" in text], shown
    return lines[0]


def test_interrupting_07_s_pipeline_and_08_s_roll_is_one_line_each_and_champion_stays(lab, page, settings):
    """After 07 and 08 ran in the lab (their kernels still up): Interrupt in the middle of 07's Ray Data
    prediction, and of 08's roll under load. One line each; after 08's, ``@champion`` is where the line says
    and ``@challenger`` is gone."""
    from mlflow.tracking import MlflowClient

    base, token = lab.jupyter
    page.goto(f"{base}/lab/workspaces/test-{uuid.uuid4().hex[:8]}/tree/07_batch_inference.ipynb?reset&token={token}")
    wait_for_idle_kernel(page)
    run_done(page, "resources = cluster.init_ray(settings)")  # Ray again: the notebook's last cell let it go
    line = interrupted_line(page, run_cell(page, "predict_pointers(test_keys, test_labels")[0], after=4)
    assert line == ("Interrupted: The pipeline stopped: you interrupted it. Its actors are stopped; run the cell "
                    "again to predict under a new run name."), line

    page.goto(f"{base}/lab/workspaces/test-{uuid.uuid4().hex[:8]}/tree/08_serve_the_champion.ipynb?reset&token={token}")
    wait_for_idle_kernel(page)
    for before in ("resources = cluster.init_ray(settings)", "serve.start(http_options=",
                   "for candidate in serving_support.roll_candidates("):
        run_done(page, before)  # Ray and the deployment again (the last cell let both go), a challenger to roll to
    line = interrupted_line(page, run_cell(page, 'rolled_back_if_stopped("The roll"')[0], after=3)
    where = re.fullmatch(r"Interrupted: The roll stopped: you interrupted it\. The deployment serves @champion "
                         r"\(version (\d+)\) again, and @challenger is removed\.", line)
    assert where, line
    client = MlflowClient(settings.mlflow_tracking_uri)
    aliases = client.get_registered_model("mnist-classifier").aliases
    assert aliases == {"champion": where[1]}, aliases
    shoot(page, "lab-08-roll-interrupted", "Roll to another version, under load")
    run_done(page, "serve.shutdown()  # the application")  # the summary cell, which lets Serve go: it outlives kernels
    for name in ("07_batch_inference", "08_serve_the_champion"):
        lab.close_notebook(name)


def wait_for_epochs(settings, run_id: str, count: int, timeout: float = 300) -> None:
    """Wait until MLflow holds ``count`` epochs of run ``run_id``: its fit is surely training then."""
    from mlflow.tracking import MlflowClient

    client, deadline = MlflowClient(settings.mlflow_tracking_uri), time.monotonic() + timeout
    while len(client.get_metric_history(run_id, "train_loss")) < count:
        assert time.monotonic() < deadline, f"no {count} epochs of run {run_id} in MLflow after {timeout:.0f} s"
        time.sleep(1)


def test_the_dashboard_opens_without_a_token_prompt_and_lists_the_actors(lab, page):
    page.goto(lab.urls["Ray dashboard"])  # the sign-in link make lab printed
    page.wait_for_url(re.compile(r".*#/actors"), timeout=30_000)
    for cls in ("ObjectPreprocessor", "RayTrainWorker"):  # started by notebooks 03 and 04
        page.get_by_label("Class").fill(cls)
        page.locator("tbody tr", has_text=cls).first.wait_for(timeout=30_000)
        assert page.locator("tbody tr", has_text=cls).count() >= 2
    assert page.get_by_text("Authentication Token Required").count() == 0
    shoot(page, "dashboard-actors")


def test_mlflow_shows_notebook_04s_run_with_a_train_loss_point_per_epoch(lab, browser, settings):
    from mlflow.tracking import MlflowClient

    run_id = lab.urls.get("04 run") or pytest.skip("notebook 04 did not run in this session")
    client = MlflowClient(settings.mlflow_tracking_uri)
    run = client.get_run(run_id)
    points = client.get_metric_history(run_id, "train_loss")
    assert sorted(p.step for p in points) == list(range(1, int(run.data.params["epochs"]) + 1))
    anonymous = browser.new_context()
    # MLflow asks who is there (a page would stop at the browser's login prompt: ask without one)
    assert anonymous.request.get(lab.urls["MLflow"]).status == 401
    anonymous.close()
    # Signed in as the lab says: its user, and the password `python -m workshop.stack env` prints.
    context = browser.new_context(viewport={"width": 1400, "height": 900}, http_credentials={
        "username": settings.mlflow_username, "password": settings.mlflow_password})
    page = context.new_page()
    page.goto(f"{lab.urls['MLflow']}/#/experiments/{run.info.experiment_id}/runs/{run_id}/model-metrics")
    page.get_by_text("train_loss", exact=True).first.wait_for(timeout=60_000)
    page.get_by_text(run.info.run_name).first.wait_for(timeout=30_000)
    page.get_by_placeholder("Search metric charts").fill("train_")  # the per-epoch curves only
    assistant = page.get_by_text("MLflow Assistant")
    if assistant.count():  # a side panel that hides half the charts
        page.locator("button[aria-label='Close']").last.click()
    page.wait_for_timeout(1500)
    shoot(page, "mlflow-run")
    context.close()


def test_ctrl_c_stops_jupyterlab_and_the_dashboard_and_the_stack_s_ray_runs_again(lab, settings):
    state = Path(os.environ["STACK_STATE_DIR"])
    dashboard = stack_ray.read_service(state)["dashboard"]
    assert lab.stop(signal.SIGINT) == 0, "\n".join(lab.output[-10:])
    assert "The stack's Ray is running again, without its dashboard." in lab.output
    service = stack_ray.read_service(state)
    assert service is not None and service["dashboard"] is None
    import urllib.request

    with pytest.raises(OSError):
        urllib.request.urlopen(dashboard, timeout=3)
    base, _ = lab.jupyter
    with pytest.raises(OSError):
        urllib.request.urlopen(base + "/api", timeout=3)


LEARNER = "tutorial-learner"  # a throwaway account for the run as a non-root user


def learner_account() -> tuple[str, Path, bool]:
    """The throwaway learner: ``(name, home, created now)``; skips (or fails, under ``TUTORIAL_REQUIRE_BROWSER``)
    where it cannot reach this checkout or its Python."""
    import pwd

    created = False
    try:
        home = Path(pwd.getpwnam(LEARNER).pw_dir)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", LEARNER], check=True, capture_output=True)
        home, created = Path(pwd.getpwnam(LEARNER).pw_dir), True
    probe = subprocess.run(["runuser", "-u", LEARNER, "--", sys.executable, "-c", "import workshop.lab"],
                           capture_output=True, text=True, cwd="/")
    if probe.returncode != 0:
        if created:
            subprocess.run(["userdel", "--remove", LEARNER], capture_output=True)
        why = (f"A user other than root cannot run {sys.executable} with this checkout (a folder on the way is "
               f"closed to other users: {probe.stderr.strip()[-200:]}). .ci/run opens them.")
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(why)
        pytest.skip(why)
    return LEARNER, home, created


def test_a_learner_who_is_not_root_runs_a_ray_notebook_in_the_lab(browser, tmp_path_factory):
    """The same lab as a non-root user: no --allow-root, a stack, a Ray token and a dashboard of their own."""
    if os.geteuid() != 0:
        pytest.skip("this session is not root: the lab above already ran as a learner runs it")
    user, home, created = learner_account()
    work = Path(tempfile.mkdtemp(prefix="learner-"))
    state, notebooks = work / "stack", copy_notebooks(work / "notebooks", ["03_ray_data_preprocessing"])
    settings_env = lab_environment(owner=user)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "USER": user, "LANG": "C.UTF-8",
           "STACK_STATE_DIR": str(state), **{k: settings_env[k] for k in ("JUPYTERLAB_SETTINGS_DIR",
                                                                          "JUPYTERLAB_WORKSPACES_DIR")}}
    subprocess.run(["chown", "-R", user, str(work)], check=True)
    as_learner = ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
    ports = stack_ports.free_ports(["s3", "mlflow", "base", "ray"])
    lab = None
    try:  # their own stack on free ports, its Ray left to the lab (which starts it with the dashboard)
        subprocess.run([*as_learner, sys.executable, "-m", "workshop.stack", "up", "--no-ray", "--no-lakefs",
                        "--s3-port", str(ports["s3"]), "--mlflow-port", str(ports["mlflow"]), "--port-base",
                        str(ports["base"]), "--ray-port", str(ports["ray"])], check=True, capture_output=True,
                       cwd=project_root(), timeout=180)
        lab = start_lab(notebooks, env, user=user)
        assert not any("Running as root" in line for line in lab.output)
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        page = context.new_page()
        run_all_in_jupyterlab(page, lab, "03_ray_data_preprocessing", state=state)
        shoot(page, "learner-03_ray_data_preprocessing", SHOT_AT["03"])
        check_run(page, notebooks / "03_ray_data_preprocessing.ipynb")
        assert summary(notebooks / "03_ray_data_preprocessing.ipynb")["actor processes"] == 2
        context.close()
        assert lab.stop(signal.SIGINT) == 0, "\n".join(lab.output[-10:])
        token = stack_ray.token_file(state)
        assert token.stat().st_uid == home.stat().st_uid and token.stat().st_mode & 0o077 == 0, "their own Ray token"
    finally:
        if lab is not None and lab.proc.poll() is None:
            lab.stop(signal.SIGKILL)
        subprocess.run([*as_learner, sys.executable, "-m", "workshop.stack", "down"], cwd=project_root(),
                       capture_output=True, timeout=120)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(settings_env["JUPYTERLAB_SETTINGS_DIR"].rsplit("/", 1)[0], ignore_errors=True)
        if created:
            subprocess.run(["userdel", "--remove", user], capture_output=True)
