"""The two kinds of mistakes the command line reports without a traceback."""

USAGE_ERROR = 2  # the command line itself is wrong: unknown model, flag or value
USER_ERROR = 1  # the command is well formed but cannot be done: missing file, bad model


class UsageError(Exception):
    """A mistake in the command line; one line on stderr, exit code 2."""


class UserError(Exception):
    """A command that cannot be carried out (a file that is missing, corrupt or not a model
    kiln can take); one line on stderr, exit code 1, the traceback only with --debug."""
