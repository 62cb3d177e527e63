"""TfmError: the one exception type for problems the user can fix (bad input, bad options), and ModelFileError,
the kind of it that a running command's model file causes."""


class TfmError(Exception):
    """A user-facing error: the message is one line saying what, where, and what to do.

    The CLI turns it into one red line on stderr and exit code 1; it never becomes a traceback.
    """


class ModelFileError(TfmError):
    """The model's checkpoint failed a command already running: changed on disk or unreadable since the load.

    The text being translated is not at fault: `tfm serve` answers it as a server error (503) and says on
    /health that it must be restarted, where a plain TfmError is the request's problem (400).
    """
