"""Checks a built site without a browser: every internal link and anchor resolves, nothing loads from outside.

Read from the HTML and CSS files themselves:

- a link (``<a href>``, ``<link rel="next">``, ...) into the site must name a file that exists and, with a
  ``#fragment``, an ``id`` (or ``<a name>``) on that page; links to other sites are fine, a reader follows
  them on purpose;
- anything a page or a style sheet loads by itself (``<script src>``, a style sheet, ``<img src>``,
  ``srcset``, a preload, an icon, ``url(...)`` and ``@import`` in CSS) must come from the site's folder.

What scripts fetch while they run is not in the files: the browser test
(``tests/platform/test_site.py``) blocks and counts every request that leaves the local server.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlsplit

BASE = "http://site.invalid/"  # the site's folder as a web address, to tell its own paths from other sites'
LOADED_ATTRIBUTES = {"src", "srcset", "data", "poster"}  # the browser fetches these with the page
LOADED_RELS = {"stylesheet", "preload", "modulepreload", "prefetch", "icon", "shortcut", "apple-touch-icon",
               "manifest", "mask-icon"}
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]""")


@dataclass
class Page:
    """What one HTML file holds: its anchors, its links, what it loads (each with the tag it came from)."""

    ids: set[str] = field(default_factory=set)
    links: list[tuple[str, str]] = field(default_factory=list)
    loads: list[tuple[str, str]] = field(default_factory=list)


class PageParser(HTMLParser):
    """Collects a :class:`Page` from an HTML file's tags and its ``<style>`` blocks."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page, self.in_style = Page(), False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """Note the tag's ``id``, the link it makes, and what it makes the browser load."""
        values = {name: value or "" for name, value in attrs}
        if "id" in values:
            self.page.ids.add(values["id"])
        if tag == "a" and "name" in values:
            self.page.ids.add(values["name"])
        self.in_style = tag == "style"
        rels = set(values.get("rel", "").lower().split())
        if "href" in values and tag in ("a", "area", "link"):
            (self.page.loads if tag == "link" and rels & LOADED_RELS else self.page.links).append((tag, values["href"]))
        for name in LOADED_ATTRIBUTES & set(values):
            value = values[name]
            urls = [part.strip().split(" ")[0] for part in value.split(",")] if name == "srcset" else [value]
            self.page.loads += [(tag, url) for url in urls if url]
        if "style" in values:
            self.page.loads += [("style", url) for url in css_urls(values["style"])]

    def handle_data(self, data: str) -> None:
        """Inside ``<style>``: what its CSS loads."""
        if self.in_style:
            self.page.loads += [("style", url) for url in css_urls(data)]

    def handle_endtag(self, tag: str) -> None:
        """Leave a ``<style>`` block."""
        if tag == "style":
            self.in_style = False


def css_urls(css: str) -> list[str]:
    """The addresses a piece of CSS loads: its ``url(...)`` and ``@import``, data: URLs left out."""
    found = [url or imported for url, imported in CSS_URL.findall(css)]
    return [url.strip() for url in found if not url.strip().startswith("data:")]


def read_page(path: Path) -> Page:
    """Parse one HTML file into a :class:`Page`."""
    parser = PageParser()
    parser.feed(path.read_text(encoding="utf-8", errors="replace"))
    return parser.page


def resolve(site_path: str, url: str) -> tuple[str | None, str]:
    """``(path in the site, fragment)`` of ``url`` as written in ``site_path``; path ``None`` for another site.

    A link to the page itself (``#anchor``) gives ``site_path``; a folder gives its ``index.html``.
    """
    absolute = urljoin(BASE + site_path, url.strip())
    parts = urlsplit(absolute)
    if parts.scheme in ("data", "about", "blob"):
        return site_path, ""
    if f"{parts.scheme}://{parts.netloc}/" != BASE:
        return None, ""
    path = posixpath.normpath(unquote(parts.path[len("/"):])) if parts.path != "/" else "index.html"
    if parts.path.endswith("/") and path != "index.html":
        path += "/index.html"
    return path, unquote(parts.fragment)


def check_site(folder: Path) -> list[str]:
    """Every problem of the site in ``folder``, one line each (none: it is whole and offline).

    A problem is a link to a missing file or a missing anchor, or anything loaded from outside the folder
    (or from a file missing in it), by a page or by a style sheet.
    """
    pages = {path.relative_to(folder).as_posix(): read_page(path) for path in sorted(folder.rglob("*.html"))
             if not path.relative_to(folder).as_posix().startswith("_static/")}  # a theme's Jinja macros, not pages
    problems: list[str] = []
    for site_path, page in pages.items():
        for tag, url in page.links:
            target, fragment = resolve(site_path, url)
            if target is None:
                continue
            if not (folder / target).is_file():
                problems.append(f"{site_path}: <{tag}> links to {url}: no such file in the site")
            elif fragment and target in pages and fragment not in pages[target].ids:
                problems.append(f"{site_path}: <{tag}> links to {url}: {target} has no id {fragment!r}")
        problems += loads_problems(folder, site_path, page.loads)
    for css in sorted(folder.rglob("*.css")):
        site_path = css.relative_to(folder).as_posix()
        loads = [("css", url) for url in css_urls(css.read_text(encoding="utf-8", errors="replace"))]
        problems += loads_problems(folder, site_path, loads)
    return problems


def loads_problems(folder: Path, site_path: str, loads: list[tuple[str, str]]) -> list[str]:
    """The problems among what ``site_path`` loads: a request to another site, or to a file the site lacks."""
    problems = []
    for tag, url in loads:
        target, _ = resolve(site_path, url)
        if target is None:
            problems.append(f"{site_path}: <{tag}> loads {url} from outside the site")
        elif not (folder / target).is_file():
            problems.append(f"{site_path}: <{tag}> loads {url}: no such file in the site")
    return problems
