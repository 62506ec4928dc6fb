"""The local platform that runs the lessons: not part of what the notebooks teach.

``stack`` (the embedded S3, MLflow, lakeFS and Ray: ``python -m workshop.stack up|down|status|env``),
with ``state_files`` (its folder and lock), ``processes`` (its process records), ``credentials`` (its keys
and logins), ``ray_service`` (the stack's Ray), ``seaweedfs_security`` (the store's keys and TLS) and
``lakefs_binary`` (lakeFS found or fetched); ``lab`` (``make lab``: JupyterLab and the dashboard's
sign-in); ``runner`` (``make run``, ``make catch-up``), ``solutions`` (the exercises' folded solutions),
``export`` (``make export``: the notebooks' ``#@save`` cells into ``helpers``), ``submit`` and
``notebook_job`` (``make submit``: a notebook as a Ray Job); the ``site`` package (``make site``: the
lessons as a website, docs/site.md).

It may import ``helpers``; ``helpers`` reaches it only through :mod:`helpers.stack`, while a notebook
runs (tests/lessons/test_lessons.py checks both). Code taken to a real cluster needs ``helpers`` only.
"""
