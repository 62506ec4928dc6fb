"""Math on the site: recognised, and refused until a renderer is vendored.

No lesson writes math today. JupyterLab would render ``$...$`` in a markdown cell, so the site parses it
too (MyST's ``dollarmath``), and a page that has any stops the build with one warning (an error under
``-W``) naming the fix, instead of Sphinx fetching MathJax from a CDN, which the site must never do, or
the page showing the dollar signs. The fix: vendor MathJax with :mod:`workshop.site.vendor` and point
``mathjax_path`` in ``conf.py`` at it (docs/site.md).
"""

from __future__ import annotations

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)


def refuse_math(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """On ``doctree-resolved``: one warning for a page that holds math (inline, a block, or a LaTeX output).

    Resolved, not read: by then myst-nb has kept one form of each output, so a LaTeX form beside the HTML
    or image form a page shows is not math on the page.
    """
    found = next(iter(doctree.findall(lambda node: isinstance(node, (nodes.math, nodes.math_block)))), None)
    if found is not None:
        logger.warning("this page has math (%r), and the site has no math renderer of its own: vendor one "
                       "(docs/site.md, 'Math') instead of loading MathJax from a CDN", found.astext()[:40],
                       location=found, type="site", subtype="math")


def setup(app: Sphinx) -> dict:
    """Register the check with Sphinx."""
    app.connect("doctree-resolved", refuse_math)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
