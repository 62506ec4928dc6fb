"""The lessons as a website: ``make site`` (``python -m workshop.site``) builds ``runs/site/html``.

Sphinx with myst-nb renders the README (the front page), the eight notebooks with their committed
outputs (never executed) and the guides into a static folder that loads nothing from outside it.

``build`` (the build, warnings as errors, then the check), ``conf`` (Sphinx's configuration),
``learning_path`` (the pages and their order), ``notebook_pages`` (each notebook's download and run line),
``diagrams`` (mermaid, drawn by the vendored script), ``no_math`` (math refused until a renderer is
vendored), ``offline_check`` (links, anchors and outside requests in the built files), ``vendor`` (the
vendored scripts, pinned by version and SHA-256) and ``requirements`` (the site's part of the lock, for
the Pages workflow). How and why: docs/site.md.
"""
