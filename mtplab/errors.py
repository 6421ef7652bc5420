"""One error type for bad input, so callers (CLI, widgets) can show its message instead of a traceback."""


class MtplabError(ValueError):
    """Bad input to mtplab. The message says what was wrong and how to fix it."""
