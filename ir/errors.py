"""One error type for bad input: the CLI prints its message on one line, no traceback."""


class PlannerError(Exception):
    """Bad input or an impossible request. The message names what is wrong and the fix."""
