"""TfmError: the one exception type for problems the user can fix (bad input, bad options)."""


class TfmError(Exception):
    """A user-facing error: the message is one line saying what, where, and what to do.

    The CLI turns it into one red line on stderr and exit code 1; it never becomes a traceback.
    """
