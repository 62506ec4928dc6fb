"""Which pages the site has and in what order: the README, the notebooks by number, then the guides.

The site is the repository as a reader meets it: the README is the front page; the eight notebooks
follow in the learning path's order (their numbers); then every markdown page the README's
*Documentation* list links to, in that list's order, with the pages they link to in turn (the KubeRay
manifests' README) and any other ``docs/*.md``. The navigation is two hidden tables of contents
appended to the README's text as Sphinx reads it; the README on disk is not changed.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from sphinx.application import Sphinx

ROOT_DOC = "README"
NOTEBOOKS = "notebooks/[0-9][0-9]_*.ipynb"
# A markdown link's target: [text](path.md) or [text](path.md#anchor), not a web address.
MARKDOWN_LINK = re.compile(r"\]\((?![a-z]+://)([^)\s#]+\.md)(?:#[^)\s]*)?\)")


def notebook_pages(root: Path) -> list[str]:
    """The notebooks' document names (``notebooks/01_upload_mnist``, ...), in the learning path's order."""
    return [path.relative_to(root).with_suffix("").as_posix() for path in sorted(root.glob(NOTEBOOKS))]


def linked_pages(root: Path, page: str) -> list[str]:
    """The markdown pages of the repository that ``page`` (a path under ``root``) links to, in order, once each.

    In the README, the links of its *Documentation* section come first: that list is the reading order.
    """
    text = (root / page).read_text(encoding="utf-8")
    section = re.search(r"^## Documentation\n(.*?)(?=^## |\Z)", text, flags=re.M | re.S)
    ordered = (section.group(1) + text) if page == f"{ROOT_DOC}.md" and section else text
    found: list[str] = []
    for target in MARKDOWN_LINK.findall(ordered):
        path = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
        if not path.startswith("../") and (root / path).is_file() and path not in found:
            found.append(path)
    return found


def guide_pages(root: Path) -> list[str]:
    """Every markdown page after the notebooks, as document names: those the README leads to, then the other docs.

    A page is reached if the README links to it or a reached page does; those come in the order the
    README's *Documentation* list (then each page) names them. ``docs/*.md`` that nothing links to come last.
    """
    found, waiting = [f"{ROOT_DOC}.md"], [f"{ROOT_DOC}.md"]
    while waiting:
        for path in linked_pages(root, waiting.pop(0)):
            if path not in found:
                found.append(path)
                waiting.append(path)
    found += sorted(p.relative_to(root).as_posix() for p in (root / "docs").glob("*.md")
                    if p.relative_to(root).as_posix() not in found)
    return [path[: -len(".md")] for path in found[1:]]


def source_patterns(root: Path) -> list[str]:
    """Sphinx's ``include_patterns``: the README, the notebooks and every guide page, nothing else."""
    return [f"{ROOT_DOC}.md", NOTEBOOKS, *(f"{page}.md" for page in guide_pages(root))]


def pruned_folders(root: Path) -> list[str]:
    """Sphinx's ``exclude_patterns``: every top-level folder no page lives in (``.venv``, ``.stack``, ``runs``, ...).

    Sphinx walks every folder of its source tree, and include patterns do not stop it: this keeps it
    out of the virtual environment's many thousand files.
    """
    keep = {"notebooks", *(page.split("/", 1)[0] for page in guide_pages(root) if "/" in page)}
    return sorted(path.name for path in root.iterdir() if path.is_dir() and path.name not in keep)


def toctree(caption: str, pages: list[str]) -> str:
    """A hidden MyST table of contents: the sidebar's section ``caption`` with ``pages``."""
    return "\n\n```{toctree}\n:hidden:\n:caption: " + caption + "\n\n" + "\n".join(pages) + "\n```\n"


def add_navigation(app: Sphinx, docname: str, source: list[str]) -> None:
    """On ``source-read`` of the front page: append the notebooks' and the guides' tables of contents."""
    if docname == app.config.root_doc:
        root = Path(app.srcdir)
        source[0] += toctree("The notebooks", notebook_pages(root)) + toctree("Guides", guide_pages(root))


def setup(app: Sphinx) -> dict:
    """Register the navigation with Sphinx."""
    app.connect("source-read", add_navigation)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
