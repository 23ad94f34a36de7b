"""The one exception type the command line turns into a clean message."""


class UserError(Exception):
    """Bad input from the user: the message names the problem and the fix.

    ``grpo-ctrl`` prints it without a traceback and exits with status 2."""
