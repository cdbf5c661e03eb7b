"""Errors that reach the user as one line (job scripts print them without a traceback)."""


class WxrayError(Exception):
    """Base class: the message names the file, variable or key and what was expected."""


class ConfigError(WxrayError):
    """A config key that does not exist, a value of the wrong type, or an invalid combination."""


class DataError(WxrayError):
    """A source or store that cannot be read or does not hold what was asked for."""


class CheckpointError(WxrayError):
    """A checkpoint that is corrupt or does not belong to this model."""
