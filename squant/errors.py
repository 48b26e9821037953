"""One exception type for every problem a user can fix: the CLI prints it as one line."""


class SquantError(ValueError):
    """Bad input or an unsupported model; the message names the problem and the fix."""


def first_line(e: BaseException) -> str:
    """The first line of an exception's message (its type name when empty): deep libraries
    raise multi-line traces, and squant reports one line."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
