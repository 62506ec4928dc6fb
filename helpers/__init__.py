"""Thin helpers behind the notebooks: one module per concern.

``config`` (settings from the environment), ``stack`` (the embedded local
services), ``mnist`` (the data set, offline), ``storage`` (upload, listing,
pointer lists), ``plots`` and ``notebook`` (what the notebooks show).
Import the module you need: ``from helpers import storage``.
"""

__version__ = "0.1.0"
