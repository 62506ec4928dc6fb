"""Mermaid diagrams on the site, drawn in the reader's browser by the vendored mermaid, as JupyterLab draws them.

A notebook's ```` ```mermaid ```` fence (MyST turns it into this ``mermaid`` directive, see ``conf.py``)
becomes ``<pre class="mermaid">`` holding the diagram's text; a page that has one loads
``_static/vendored/mermaid-<version>.min.js`` and ``diagrams.js``, which draw each as an inline SVG once the
page has loaded. Pages without a diagram load neither.
"""

from __future__ import annotations

import html

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

from workshop.site import vendor


class mermaid_diagram(nodes.General, nodes.Element):  # noqa: N801 (docutils names its node classes so)
    """A diagram's mermaid source, written out as ``<pre class="mermaid">``."""


class MermaidDirective(SphinxDirective):
    """```` ```mermaid ```` (or ```` ```{mermaid} ````): the fence's text is the diagram."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        """One :class:`mermaid_diagram` node holding the directive's text."""
        return [mermaid_diagram(source="\n".join(self.content))]


def visit_html(translator, node: mermaid_diagram) -> None:
    """Write the diagram's text, escaped, where mermaid finds it."""
    translator.body.append(f'<pre class="mermaid">{html.escape(node["source"])}\n</pre>\n')
    raise nodes.SkipNode


def skip(translator, node: mermaid_diagram) -> None:
    """Leave the diagram out of builders other than HTML (none is used for the site)."""
    raise nodes.SkipNode


def add_scripts(app: Sphinx, pagename: str, templatename: str, context: dict, doctree: nodes.document | None) -> None:
    """On ``html-page-context``: a page with a diagram loads mermaid and ``diagrams.js``, deferred, in that order."""
    if doctree is not None and any(doctree.findall(mermaid_diagram)):
        app.add_js_file(vendor.asset_path("mermaid"), loading_method="defer")
        app.add_js_file("diagrams.js", loading_method="defer")


def setup(app: Sphinx) -> dict:
    """Register the directive, its node and the per-page scripts with Sphinx."""
    app.add_node(mermaid_diagram, html=(visit_html, None), text=(skip, None), latex=(skip, None), man=(skip, None),
                 texinfo=(skip, None))
    app.add_directive("mermaid", MermaidDirective)
    app.connect("html-page-context", add_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
