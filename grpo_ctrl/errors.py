"""The one exception type the command line turns into a clean message."""


class UserError(Exception):
    """Bad input from the user: the message names the problem and the fix.

    ``grpo-ctrl`` prints it without a traceback and exits with status 2."""


def one_line(error: BaseException) -> str:
    """A library's exception as one line (torch and onnxruntime spread
    theirs over many), for a UserError that quotes it."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
