"""The one exception type the command line turns into a one-line message instead of a traceback."""


class UserError(ValueError):
    """A mistake in what the user asked for: a bad flag, value, path or file. The message says what was
    wrong and what would be right."""
