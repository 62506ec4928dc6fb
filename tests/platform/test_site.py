"""The lessons' website (``make site``): built with warnings as errors, whole, offline, and read in Chromium.

The site is built once for the module, as ``make site`` builds it (``python -m workshop.site``), into a
temporary folder. Without a browser: the pages and their order, each notebook's download and run line,
its folded solutions and exercises, the README's links turned into pages, anchors and downloads, and the
link checker, which must also catch a broken link, a missing anchor, a missing image and an outside
script planted in a copy of the site. In Chromium (Debian's, through ``tests/platform/chromium.py``),
with the site served by ``http.server`` on 127.0.0.1 and every other request aborted and counted: each
page loads nothing from outside and logs no error, each notebook page shows each of its plots and each
of its diagrams as an SVG, and the search finds notebook 04. Screenshots go to ``runs/site-shots/``
(the ones in docs/ come from there).
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from helpers.settings import project_root
from workshop.site import build, learning_path, offline_check, vendor
from workshop.site import requirements as site_requirements

ROOT = project_root()
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SHOTS = ROOT / "runs" / "site-shots"


def cells(notebook: Path, kind: str) -> list[dict]:
    return [cell for cell in json.loads(notebook.read_text())["cells"] if cell["cell_type"] == kind]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def plots_in(notebook: Path) -> int:
    """The images among a notebook's committed outputs."""
    return sum(1 for cell in cells(notebook, "code") for out in cell.get("outputs", [])
               if set(out.get("data", {})) & {"image/png", "image/jpeg", "image/svg+xml"})


def diagrams_in(notebook: Path) -> int:
    return sum(source(cell).count("```mermaid") for cell in cells(notebook, "markdown"))


# --- the build --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """``python -m workshop.site`` (what ``make site`` runs) into a temporary folder: its ``html/``."""
    out = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "workshop.site", "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"make site failed:\n{done.stdout}\n{done.stderr}"
    print(f"make site: {time.monotonic() - started:.1f} s; {done.stdout.splitlines()[0]}")
    return out / "html"


def test_the_build_has_the_readme_the_notebooks_in_order_and_every_guide(site):
    assert (site / "index.html").read_bytes() == (site / "README.html").read_bytes()
    notebooks, guides = learning_path.notebook_pages(ROOT), learning_path.guide_pages(ROOT)
    assert notebooks == [f"notebooks/{path.stem}" for path in NOTEBOOKS] and len(notebooks) == 8
    readme = (ROOT / "README.md").read_text()
    listed = list(dict.fromkeys(re.findall(r"\]\((docs/[^)#]+)\.md", readme[readme.index("## Documentation"):])))
    assert [page for page in guides if page in listed] == listed, "the README's Documentation list sets the order"
    assert "deploy/kuberay/README" in guides, "a page the README links to outside docs/ is a page too"
    assert {f"docs/{path.stem}" for path in (ROOT / "docs").glob("*.md")} <= set(guides)
    nav = re.search(r'<nav class="bd-links bd-docs-nav".*?</nav>', (site / "index.html").read_text(), re.S).group(0)
    in_sidebar = [href.removesuffix(".html") for href in re.findall(r'href="([^"#]+\.html)"', nav)]
    assert in_sidebar == notebooks + guides, "the sidebar follows the learning path"
    for page in notebooks + guides:
        assert (site / f"{page}.html").is_file(), page
    assert [path.relative_to(site).as_posix() for path in build.rendered_pages(site)] == sorted(
        f"{page}.html" for page in ["README", *notebooks, *guides])


def test_the_built_site_has_no_broken_link_or_anchor_and_loads_nothing_from_outside(site):
    assert offline_check.check_site(site) == []
    front = (site / "index.html").read_text()
    for notebook in NOTEBOOKS:  # the README's table links each notebook's page, not its .ipynb
        assert f'href="notebooks/{notebook.stem}.html"' in front
    quickstart = (site / "docs" / "quickstart.html").read_text()  # a heading's GitHub anchor, from another page
    assert 'href="services.html#a-shared-machine-what-protects-each-port"' in quickstart
    assert 'id="a-shared-machine-what-protects-each-port"' in (site / "docs" / "services.html").read_text()
    assert 'href="../README.html"' in (site / "docs" / "tests.html").read_text()  # Back to the README
    # A file that is not a page (a benchmark script) is a download of the repository's file.
    downloads = re.findall(r'class="reference download internal" download="" href="\.\./([^"]+)"',
                           (site / "docs" / "results.html").read_text())
    scripts = {Path(href).name: site / href for href in downloads}
    assert scripts["bench_serve.py"].read_bytes() == (ROOT / "benchmarks" / "bench_serve.py").read_bytes()


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem[:2])
def test_a_notebook_page_has_its_download_its_run_line_its_exercises_and_folded_solutions(site, notebook):
    page = (site / "notebooks" / f"{notebook.stem}.html").read_text()
    number = notebook.stem[:2]
    run_line = re.search(r'<div class="lesson-run.*?</div>', page, re.S).group(0)
    download = re.search(r'download="" href="\.\./(_downloads/[^"]+)"', run_line).group(1)
    assert (site / download).read_bytes() == notebook.read_bytes(), "the download is the committed notebook"
    words = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", run_line))
    assert "make lab and open notebooks/" + notebook.name in words
    assert (f"make catch-up NN={number} first" in words) == (number != "01")
    assert run_line.index("lesson-run") < page.index('class="cell'), "the line comes before the first cell"
    markdown = [source(cell) for cell in cells(notebook, "markdown")]
    solutions = [text for text in markdown if "<details>" in text]
    folds = re.findall(r"<details>\s*<summary>Solution</summary>(.*?)</details>", page, re.S)
    assert solutions and len(folds) == len(solutions), "every solution folded, closed (no `open`)"
    for fold, text in zip(folds, solutions, strict=True):
        if "```python" in text:
            assert '<div class="highlight-python' in fold, "the solution's code renders as code inside the fold"
    exercises = [cell for cell in cells(notebook, "code") if "exercise" in cell["metadata"].get("tags", [])]
    assert exercises and page.count("cell tag_exercise") == len(exercises)
    assert page.count('<pre class="mermaid">') == diagrams_in(notebook) >= 1
    assert len(re.findall(r'<div class="cell_output.*?<img ', page, re.S)) >= 1 if plots_in(notebook) else True


# --- the checks can fail ------------------------------------------------------------------------

def test_the_link_checker_reports_a_planted_broken_link_anchor_image_and_outside_script(site, tmp_path):
    copy = tmp_path / "html"
    shutil.copytree(site, copy)
    page = copy / "notebooks" / "04_distributed_training.html"
    image = re.search(r'<img [^>]*src="\.\./(_images/[^"]+)"', page.read_text()).group(1)
    (copy / image).unlink()
    page.write_text(page.read_text().replace("</body>", '<a href="05_tune_sweeps.html#no-such-heading">x</a>'
                                             '<a href="../docs/gone.html">y</a>'
                                             '<script src="https://cdn.jsdelivr.net/npm/mathjax@4/tex-mml-chtml.js">'
                                             '</script></body>'))
    (copy / "_static" / "site.css").write_text('@import "https://fonts.googleapis.com/css?family=Inter";')
    problems = "\n".join(offline_check.check_site(copy))
    assert "05_tune_sweeps.html has no id 'no-such-heading'" in problems
    assert "links to ../docs/gone.html: no such file" in problems
    assert f"loads ../{image}: no such file in the site" in problems
    assert "loads https://cdn.jsdelivr.net/npm/mathjax@4/tex-mml-chtml.js from outside the site" in problems
    assert "_static/site.css: <css> loads https://fonts.googleapis.com/css?family=Inter from outside" in problems
    assert len(problems.splitlines()) == 5, problems


def test_the_link_checker_reads_srcset_styles_and_icons_and_lets_readers_follow_links_out(tmp_path):
    (tmp_path / "a.html").write_text(
        '<html><head><link rel="icon" href="//cdn.example/favicon.ico"><style>body{background:url(x.png)}</style>'
        '</head><body id="top"><img srcset="ok.png 1x, https://img.example/2x.png 2x" src="ok.png">'
        '<a href="https://docs.ray.io/">Ray</a><a href="#top">up</a><a href="mailto:x@example.org">m</a>'
        '<a href="b/">folder</a><div style="background-image: url(\'data:image/png;base64,AAAA\')"></div>'
        '</body></html>')
    (tmp_path / "ok.png").write_bytes(b"png")
    problems = sorted(offline_check.check_site(tmp_path))
    assert problems == sorted(["a.html: <link> loads //cdn.example/favicon.ico from outside the site",
                        "a.html: <img> loads https://img.example/2x.png from outside the site",
                        "a.html: <style> loads x.png: no such file in the site",
                        "a.html: <a> links to b/: no such file in the site"]), problems


def sphinx_on(tmp_path: Path, pages: dict[str, str]) -> subprocess.CompletedProcess:
    """A small Sphinx project with the site's configuration, warnings as errors, built from ``pages``."""
    source = tmp_path / "src"
    source.mkdir(parents=True)
    conf = (ROOT / "workshop" / "site" / "conf.py").read_text()
    settings = conf[conf.index("# Notebooks:"):conf.index("# HTML:")]  # how notebooks and markdown are read
    (source / "conf.py").write_text('extensions = ["myst_nb", "workshop.site.notebook_pages", "workshop.site.no_math"]'
                                    '\n' + settings)
    for name, text in pages.items():
        (source / name).write_text(text)
    return subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-W", "-q", str(source),
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_math_stops_the_build_until_a_renderer_is_vendored(tmp_path):
    done = sphinx_on(tmp_path, {"index.md": "# Area\n\nA circle's area is $\\pi r^2$.\n"})
    assert done.returncode != 0 and "this page has math ('\\\\pi r^2')" in done.stderr, done.stderr


def notebook_with(*outputs: dict) -> str:
    """A one-code-cell notebook whose cell has ``outputs`` (display data, each a dict of forms)."""
    cell = {"cell_type": "code", "id": "b", "metadata": {}, "execution_count": 1, "source": "x",
            "outputs": [{"output_type": "display_data", "metadata": {}, "data": data} for data in outputs]}
    return json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {"language_info": {"name": "python"}},
                       "cells": [{"cell_type": "markdown", "id": "a", "metadata": {}, "source": "# Outputs"}, cell]})


def test_each_output_shows_the_form_a_reader_can_see_and_one_it_cannot_stops_the_build(tmp_path):
    shown = notebook_with({"text/html": "<b>x squared</b>", "text/latex": "$x^2$", "text/plain": "x**2"},
                          {"application/vnd.jupyter.widget-view+json": {"model_id": "m"}, "text/plain": "50%|#####"},
                          {"application/json": {"machine": 1}, "text/markdown": "**for people**"})
    done = sphinx_on(tmp_path / "shown", {"index.ipynb": shown})
    assert done.returncode == 0, done.stderr  # LaTeX beside HTML is no math; JSON beside markdown is no warning
    page = (tmp_path / "shown" / "out" / "index.html").read_text()
    assert "<b>x squared</b>" in page and "50%|#####" in page and "<strong>for people</strong>" in page
    done = sphinx_on(tmp_path / "unseen", {"index.ipynb": notebook_with({"application/vnd.example": "?"})})
    assert done.returncode != 0 and "unknown output mime type: application/vnd.example" in done.stderr


def test_a_vendored_script_that_changed_stops_the_build(tmp_path, monkeypatch):
    vendor.verify()  # the committed files are the recorded ones
    entry = vendor.manifest()["mermaid"]
    assert entry["file"] == f"mermaid-{entry['version']}.min.js" and entry["license"] == "MIT"
    copy = tmp_path / "vendor"
    shutil.copytree(vendor.VENDOR_DIR, copy)
    monkeypatch.setattr(vendor, "VENDOR_DIR", copy)
    monkeypatch.setattr(vendor, "MANIFEST", copy / "vendor.json")
    (copy / entry["license_file"]).write_text("changed")
    with pytest.raises(vendor.VendorError, match="SHA-256 differs"):
        vendor.verify()
    (copy / entry["file"]).unlink()
    with pytest.raises(vendor.VendorError, match="is missing"):
        vendor.verify()


def test_the_pages_workflow_installs_the_site_s_part_of_the_lock_with_hashes():
    requirements, lock = (ROOT / "requirements.txt").read_text(), (ROOT / "requirements.lock").read_text()
    part = site_requirements.site_part(requirements, lock)
    pins = {re.match(r"[A-Za-z0-9._-]+", entry).group(0).lower(): entry for entry in part}
    assert {"sphinx", "myst-nb", "myst-parser", "sphinx-book-theme", "pydata-sphinx-theme"} <= set(pins)
    assert {"docutils", "jinja2", "nbformat", "pygments"} <= set(pins), "what they pull in, through the lock"
    assert not {"torch", "ray", "mlflow", "jupyterlab"} & set(pins), "nothing the lessons need and the site does not"
    assert all("--hash=sha256:" in entry for entry in part)
    workflow = (ROOT / ".github" / "workflows" / "site.yml").read_text()
    assert "python -m workshop.site.requirements >" in workflow and "--require-hashes" in workflow


def test_the_site_s_part_of_a_lock_follows_what_pulls_in_what():
    requirements = "torch==1\n\n# The site: ...\nsphinx==9  # the builder\n"
    lock = ("# header\nalpha==1 \\\n    --hash=sha256:a\n    # via sphinx\n"
            "beta==1 \\\n    --hash=sha256:b\n    # via\n    #   alpha\n    #   torch\n"
            "sphinx==9 \\\n    --hash=sha256:s\n    # via -r requirements.txt\n"
            "torch==1 \\\n    --hash=sha256:t\n    # via -r requirements.txt\n"
            "gamma==1 ; sys_platform == 'darwin' \\\n    --hash=sha256:g\n    # via torch\n")
    assert [entry.split("==")[0] for entry in site_requirements.site_part(requirements, lock)] == [
        "alpha", "beta", "sphinx"]
    with pytest.raises(ValueError, match="has no sphinx: run `make lock`"):
        site_requirements.site_part(requirements, lock.replace("sphinx==9", "sphinx-old==9"))


# --- in Chromium, offline ------------------------------------------------------------------------

@dataclass
class Served:
    """A folder served on 127.0.0.1, and what the browser asked of anyone else (each request aborted)."""

    base: str
    blocked: list[str] = field(default_factory=list)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the standard library's name
        pass


@contextmanager
def serving(folder: Path) -> Iterator[str]:
    """``folder`` served by ``http.server`` on a free port of 127.0.0.1: its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=folder))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Visit:
    """One page as Chromium loaded it: the requests it made elsewhere (blocked), its console errors."""

    page: object
    blocked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def open_offline(context, base: str, path: str, wait_until: str = "load") -> Visit:
    """Open ``base + path`` in a new page where every request not to ``base`` is aborted and counted.

    The pages share one browser context, as a reader's tabs share a cache: mermaid is fetched once.
    ``wait_until="commit"`` returns as soon as the page starts to arrive, to open several at once.
    """
    visit = Visit(context.new_page())

    def route(request_route):
        if request_route.request.url.startswith(base):
            request_route.continue_()
        else:
            visit.blocked.append(request_route.request.url)
            request_route.abort()

    visit.page.route("**/*", route)
    visit.page.on("console", lambda message: visit.errors.append(message.text) if message.type == "error" else None)
    visit.page.on("pageerror", lambda error: visit.errors.append(str(error)))
    visit.page.goto(base + path, wait_until=wait_until)
    return visit


@pytest.fixture(scope="module")
def context(browser):
    started = browser.new_context(viewport={"width": 1400, "height": 900})
    yield started
    started.close()


@pytest.fixture(scope="module")
def served(site):
    with serving(site) as base:
        yield base


def images_loaded(page) -> list[dict]:
    """Every image on the page once all have finished: its address, and its natural width (0: not shown)."""
    page.wait_for_function("[...document.images].every(image => image.complete)", timeout=20_000)
    return page.eval_on_selector_all("img", "images => images.map(i => ({src: i.currentSrc, width: i.naturalWidth,"
                                             " output: !!i.closest('.cell_output')}))")


def diagrams_drawn(page, expected: int) -> list[dict]:
    """Each ``<pre class="mermaid">`` once mermaid has drawn ``expected`` of them: its SVG's kind and text."""
    page.wait_for_function("n => document.querySelectorAll('pre.mermaid > svg').length >= n", arg=expected,
                           timeout=30_000)
    return page.eval_on_selector_all("pre.mermaid", "pres => pres.map(p => { const svg = p.querySelector('svg');"
                                     " return {kind: svg && svg.getAttribute('aria-roledescription'),"
                                     " text: svg ? svg.textContent.trim() : '', height: svg ? "
                                     "svg.getBoundingClientRect().height : 0}; })")


def shoot(page, name: str, selector: str | None = None, block: str = "start") -> None:
    """A screenshot into ``runs/site-shots/``, scrolled to ``selector`` where given (``block``: where it lands)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    if selector:
        page.locator(selector).first.evaluate("(element, block) => element.scrollIntoView({block})", block)
        page.wait_for_timeout(300)
    page.screenshot(path=str(SHOTS / f"{name}.png"))


@pytest.mark.browser
@pytest.mark.slow  # Chromium: make test runs it, make test-quick leaves it out
@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda path: path.stem[:2])
def test_each_notebook_page_shows_its_plots_and_diagrams_offline_with_no_error(context, served, notebook):
    visit = open_offline(context, served, f"notebooks/{notebook.stem}.html")
    try:
        drawn = diagrams_drawn(visit.page, diagrams_in(notebook))
        assert len(drawn) == diagrams_in(notebook) >= 1
        for diagram in drawn:
            assert diagram["kind"] not in (None, "error") and diagram["text"] and diagram["height"] > 50, diagram
        images = images_loaded(visit.page)
        plots = [image for image in images if image["output"]]
        assert len(plots) == plots_in(notebook), "each committed plot is on the page"
        assert [image for image in images if image["width"] == 0] == [], "every image loaded"
        assert visit.page.locator("details:not([open]) > summary", has_text="Solution").count() >= 1
        if notebook.stem.startswith("04"):
            shoot(visit.page, "site-04", "pre.mermaid", block="center")
        if notebook.stem.startswith("08"):
            shoot(visit.page, "site-08", "#try-it")
        assert visit.blocked == [], "requests outside the site"
        assert visit.errors == [], "console errors"
    finally:
        visit.page.close()


@pytest.mark.browser
@pytest.mark.slow
def test_every_other_page_loads_offline_with_no_error_and_its_images_shown(context, served, site):
    pages = ["index.html", "search.html", *(f"{page}.html" for page in learning_path.guide_pages(ROOT))]
    visits = {path: open_offline(context, served, path, wait_until="commit") for path in pages}  # in tabs at once
    try:
        for path, visit in visits.items():
            visit.page.wait_for_load_state("load")
            assert [image for image in images_loaded(visit.page) if image["width"] == 0] == [], path
            if path == "index.html":
                shoot(visit.page, "site-front")
            assert (visit.blocked, visit.errors) == ([], []), path
    finally:
        for visit in visits.values():
            visit.page.close()


@pytest.mark.browser
@pytest.mark.slow
def test_the_search_finds_notebook_04_for_checkpoint_offline(context, served):
    visit = open_offline(context, served, "search.html?q=checkpoint")
    try:
        visit.page.wait_for_selector("ul.search li a", timeout=20_000)
        found = visit.page.eval_on_selector_all("ul.search li a", "links => links.map(a => a.getAttribute('href'))")
        assert any(href.startswith("notebooks/04_distributed_training.html") for href in found), found
        assert (visit.blocked, visit.errors) == ([], [])
    finally:
        visit.page.close()


@pytest.mark.browser
@pytest.mark.slow
def test_chromium_blocks_and_counts_a_planted_outside_script_and_image(context, tmp_path):
    (tmp_path / "planted.html").write_text('<html><body><img src="https://img.example/x.png">'
                                           '<script src="https://cdn.jsdelivr.net/npm/mermaid/dist/mermaid.min.js">'
                                           '</script></body></html>')
    with serving(tmp_path) as base:
        visit = open_offline(context, base, "planted.html")
        try:
            assert sorted(visit.blocked) == ["https://cdn.jsdelivr.net/npm/mermaid/dist/mermaid.min.js",
                                             "https://img.example/x.png"]
            assert [image["width"] for image in images_loaded(visit.page)] == [0]
        finally:
            visit.page.close()
