"""What the notebooks import: the code each notebook teaches, exported from it, and what it calls.

Generated from the notebooks' ``#@save`` cells by ``python -m workshop.export`` (edit the notebook,
not the module): one module per notebook, named in ``workshop.export.EXPORTS``, the one list of them.

Hand-written, called by the lessons in one visible line: a ``*_support`` module per lesson that needs
one; the clients and settings (``settings``, ``storage``, ``tracking``, ``versioning``, ``cluster``,
``stack_ray``); ``errors`` (the one base of every error a learner can fix); the notebook display
(``notebook``, ``interrupts``, ``plots``); and ``stack``, the one door to the local platform that starts
the services (the :mod:`workshop` package beside this one, which nothing else here imports, and this
door only inside its functions).
"""

__version__ = "0.1.0"
