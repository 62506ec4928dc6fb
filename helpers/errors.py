"""The one base of every error a learner can cause and fix.

Its message says what went wrong and what to do, so a notebook shows that message in one line instead
of a traceback (:func:`helpers.notebook.show_errors_in_one_line`). Each module's own errors derive from
it, and from the built-in error they are (a ``ValueError`` for a bad value), so that ``except`` clauses
written for either keep working.
"""


class TutorialError(Exception):
    """An error a learner can fix: its message says what to do, and notebooks show it in one line."""
