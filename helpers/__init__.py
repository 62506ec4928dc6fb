"""Plumbing behind the notebooks, plus the code each notebook teaches, exported from it.

Hand-written plumbing a learner need not read: ``errors`` (the one base of every
error a learner can fix), ``config`` (settings from the environment), ``stack``
(the embedded local services), ``mnist`` (the data set, offline), ``storage``
(an S3 client and clear errors), ``cluster`` (Ray start-up), ``tracking``
(MLflow client checks), ``versioning`` (a lakeFS client and clear errors),
``plots``, ``notebook``, ``runner`` and ``export``.

Generated from the notebooks' ``#@save`` cells by ``python -m helpers.export``
(edit the notebook, not the module): one module per notebook, named in
``helpers.export.EXPORTS``, the one list of them.
"""

__version__ = "0.1.0"
