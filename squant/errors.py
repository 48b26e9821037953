"""One exception type for every problem a user can fix: the CLI prints it as one line."""


class SquantError(ValueError):
    """Bad input or an unsupported model; the message names the problem and the fix."""
