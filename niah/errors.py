"""Domain errors. Library code raises these; the CLI turns them into one line at the edge.

`BadInput` (and subclasses) mean the user asked for something that cannot work:
the CLI prints one clear line and exits with code 2.
"""


class NiahError(Exception):
    """Base class of every error niah raises on purpose."""

    exit_code = 1


class BadInput(NiahError):
    """The user's input is wrong (arguments, files, unreachable endpoint): exit code 2."""

    exit_code = 2


class ServerError(NiahError):
    """A server we talk to or launched misbehaved (died, never became ready)."""

    exit_code = 1


class LengthDrift(NiahError):
    """A trial's server-counted length is not what was asked: the counter is not exact for
    this server. The sweep stops (exit 2) unless --approximate-lengths."""

    exit_code = 2
