"""Every exception type of nlq. The command line turns a UserError into a one-line message (exit status 2;
TrainingError: 1) instead of a traceback."""


class UserError(ValueError):
    """A mistake in what the user asked for: a bad flag, value, path or file. The message says what was
    wrong and what would be right."""


class ConfigError(UserError):
    """A bad config key, type or value."""


class LockHeld(UserError):
    """Another live process holds the lock of a directory nlq writes."""


class TrainingError(UserError):
    """Training cannot go on (a non-finite loss); the message names the step and the last good checkpoint."""


class Diverged(TrainingError):
    """The loss, a gradient norm or a weight became non-finite. A study records the run as diverged
    (diverged.json in its directory) and goes on with its other chains."""


class PeerFailure(TrainingError):
    """A collective failed because another process died or hung. The process group is left as it is: its worker
    threads may still wait on the dead peer, so destroying it, or a normal interpreter exit, can hang; the command
    line ends the process with os._exit after reporting (checkpoints and records are complete files by then)."""
