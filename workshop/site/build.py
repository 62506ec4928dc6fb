"""``make site``: the lessons rendered by Sphinx into ``runs/site/html``, then checked before it counts as built.

The build is Sphinx with warnings as errors (``-W``, every warning reported before it fails) and a fresh
environment (``-E``: a page deleted from the repository is gone from the site too), over the repository
as ``conf.py`` beside this file describes it. The site is then given an ``index.html`` (the front page,
the README's), and :mod:`workshop.site.offline_check` must find no broken link and nothing loaded from
outside the site's folder.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from helpers.errors import TutorialError
from workshop.site import offline_check, vendor

CONF_DIR = Path(__file__).resolve().parent
ROOT = CONF_DIR.parents[1]
OUT = ROOT / "runs" / "site"


class SiteError(TutorialError):
    """The site did not build, or it built with a broken link or something loaded from outside."""


@dataclass(frozen=True)
class Site:
    """A built site: its folder, what it holds, and how long the build took."""

    folder: Path
    pages: int
    files: int
    size_bytes: int
    seconds: float

    def summary(self) -> str:
        """One line: where it is, its pages, its size and the build's time."""
        return (f"{self.folder}: {self.pages} pages, {self.files} files, {self.size_bytes / 2**20:.1f} MiB, "
                f"built and checked in {self.seconds:.1f} s")


def rendered_pages(html: Path) -> list[Path]:
    """The site's pages, one per document: the README, each notebook, each guide.

    Not ``index.html`` (the README's copy), Sphinx's search and index pages, or the theme's files.
    """
    return sorted(path for path in html.rglob("*.html") if not path.relative_to(html).parts[0].startswith("_")
                  and path.relative_to(html).as_posix() not in ("index.html", "search.html", "genindex.html"))


def sphinx_build(out: Path, quiet: bool = True) -> int:
    """Run Sphinx's HTML builder over the repository into ``out/html``; its exit status (0: no warning)."""
    from sphinx.cmd.build import build_main

    args = ["-b", "html", "-W", "--keep-going", "-E", "-c", str(CONF_DIR), "-d", str(out / "doctrees"),
            *(["-q"] if quiet else []), str(ROOT), str(out / "html")]
    return build_main(args)


def build(out: Path = OUT, quiet: bool = True) -> Site:
    """Build the site into ``out/html`` from the repository as it is, and check it.

    Args:
        out: The folder for the build (``html/``, the site, and Sphinx's working files beside it).
        quiet: Print Sphinx's warnings only, not its progress.

    Returns:
        The built site.

    Raises:
        SiteError: Sphinx warned (each warning was printed), or the site has a broken link or loads
            something from outside its folder.
        VendorError: a vendored script is missing or changed.
    """
    started = time.monotonic()
    vendor.verify()
    shutil.rmtree(out / "html", ignore_errors=True)
    if sphinx_build(out, quiet) != 0:
        raise SiteError("Sphinx reported the warnings above; the site is built with warnings as errors.")
    html = out / "html"
    shutil.copyfile(html / "README.html", html / "index.html")  # the front page, where a server looks first
    problems = offline_check.check_site(html)
    if problems:
        raise SiteError(f"{len(problems)} problems in the built site:\n  " + "\n  ".join(problems))
    files = [path for path in html.rglob("*") if path.is_file()]
    return Site(html, len(rendered_pages(html)), len(files), sum(path.stat().st_size for path in files),
                time.monotonic() - started)
