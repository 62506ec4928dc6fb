"""Sphinx's configuration of the lessons' website (``make site``; :mod:`workshop.site.build` runs it).

The source folder is the repository's root, so every link in the README, the docs and the notebooks
resolves as it does in the repository: ``notebooks/04_....ipynb`` and ``docs/services.md#make-lab`` to
their pages and headings, any other file (a benchmark script, a results JSON) to a download. Which
files are pages, and in what order, is :mod:`workshop.site.learning_path`'s.
"""

from __future__ import annotations

from pathlib import Path

from workshop.site import learning_path

ROOT = Path(__file__).resolve().parents[2]

project = "Distributed ML on object storage"
root_doc = learning_path.ROOT_DOC
include_patterns = learning_path.source_patterns(ROOT)
exclude_patterns = learning_path.pruned_folders(ROOT)
extensions = [
    "myst_nb",
    "workshop.site.learning_path",  # the navigation: README, notebooks 01-08, the guides
    "workshop.site.notebook_pages",  # each notebook's download and how to run it
    "workshop.site.diagrams",  # mermaid, drawn by the vendored script
    "workshop.site.no_math",  # math stops the build until a renderer is vendored
]

# Notebooks: rendered from their committed outputs, never executed. No widget state is committed, and
# myst-nb's widget scripts come from a CDN: none.
nb_execution_mode = "off"
nb_ipywidgets_js: dict = {}
# ... so a widget (a progress bar) shows the text form its output carries, as on a code host's viewer.
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None)]
nb_merge_streams = True  # one block per cell for its stdout, as JupyterLab shows it
nb_render_markdown_format = "myst"  # a markdown output's tables (the summaries) render as tables

# Markdown: ```mermaid is the diagram directive; headings get GitHub's anchors, so README.md#section
# links resolve; $...$ is math as in JupyterLab (workshop.site.no_math).
myst_fence_as_directive = ["mermaid"]
myst_heading_anchors = 4
myst_enable_extensions = ["dollarmath"]

# HTML: every asset from the site's own folder (the theme's fonts and icons are in its package).
html_theme = "sphinx_book_theme"
html_title = "Distributed ML on object storage"
html_static_path = ["static"]
html_css_files = ["site.css"]
html_copy_source = False  # each notebook's own download link (notebook_pages) is its .ipynb; no second copy
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "home_page_in_toc": True,
    "show_navbar_depth": 2,
    "use_download_button": False,  # each notebook page has its own download line (notebook_pages)
    "use_fullscreen_button": False,
    "navigation_with_keys": False,
    "navbar_persistent": [],  # the search field is in the sidebar; no second one in a bar above the page
}
html_context = {"default_mode": "light"}
