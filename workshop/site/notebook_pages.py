"""What a notebook's page adds under its title: a download of the ``.ipynb`` and how to run it.

The notebook is rendered as committed, outputs included and nothing executed (``conf.py``); this one
line tells a reader how to go from reading to running: download the file, or, in a clone, ``make lab``
and open it, with ``make catch-up NN=..`` to run the notebooks before it first and join there.

An output can carry several forms of one result (a summary's table as markdown, and as JSON for
programs); JupyterLab shows the one it can render. myst-nb would warn about a form it cannot render even
beside one it can, so those forms are dropped from such outputs as Sphinx reads the notebook (the file is
not changed); an output with no form myst-nb renders is kept whole, and its warning stops the build.
"""

from __future__ import annotations

import json
import re

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx

NOTEBOOK_DOC = re.compile(r"^notebooks/(\d\d)_[^/]+$")
# The mime types myst-nb renders in HTML (myst_nb.core.render.NbElementRenderer.render_mime_type).
RENDERED = {"text/plain", "text/html", "text/markdown", "text/latex", "image/png", "image/jpeg", "image/gif",
            "image/svg+xml", "application/pdf", "application/javascript", "application/vnd.jupyter.widget-view+json"}


def displayed_forms_only(app: Sphinx, docname: str, source: list[str]) -> None:
    """On ``source-read`` of a notebook: drop the forms myst-nb cannot render from outputs that have one it can."""
    if app.env.doc2path(docname).suffix != ".ipynb":
        return
    notebook = json.loads(source[0])
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if data and set(data) & RENDERED:
                output["data"] = {mime: value for mime, value in data.items() if mime in RENDERED}
    source[0] = json.dumps(notebook)


def run_line(docname: str, number: str) -> nodes.container:
    """The line for notebook ``number`` (document ``docname``): the download, ``make lab``, ``make catch-up``."""
    filename = docname.rsplit("/", 1)[1] + ".ipynb"
    download = addnodes.download_reference("", "", nodes.literal("", filename), refdoc=docname,
                                           reftarget=f"/{docname}.ipynb", refexplicit=True)
    text = [nodes.strong("", "Run it yourself: "), download, nodes.Text(" (the notebook with the outputs shown here); "
                                                                        "in a clone of the repository, "),
            nodes.literal("", "make lab"), nodes.Text(f" and open notebooks/{filename}")]
    if number != "01":
        before = f"01-{int(number) - 1:02d}" if number != "02" else "01"
        text += [nodes.Text(", or "), nodes.literal("", f"make catch-up NN={number}"),
                 nodes.Text(f" first to run {before} headless and join here")]
    text.append(nodes.Text("."))
    return nodes.container("", nodes.paragraph("", "", *text), classes=["lesson-run"])


def add_run_line(app: Sphinx, doctree: nodes.document) -> None:
    """On ``doctree-read`` of a notebook: put :func:`run_line` right under the page's title.

    It runs before Sphinx collects the page's downloads (priority 400 < 500), so the ``.ipynb`` is copied
    into the site's ``_downloads/``.
    """
    found = NOTEBOOK_DOC.match(app.env.docname)
    section = doctree.next_node(nodes.section)
    if not found or section is None:
        return
    title = section.next_node(nodes.title)
    section.insert(section.index(title) + 1, run_line(app.env.docname, found.group(1)))


def setup(app: Sphinx) -> dict:
    """Register the notebook pages' outputs and run line with Sphinx."""
    app.connect("source-read", displayed_forms_only)
    app.connect("doctree-read", add_run_line, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
