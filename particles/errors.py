"""The package's one family of errors (imports nothing, never starts Taichi).

Every error raised on purpose is a ``ParticlesError``. A mistake in what the user passed or
asked for (a value, a file, an arch, a run folder) is a ``ParticlesUserError``: a ValueError,
so code that catches ValueError keeps working, and the one class the command line maps to an
exit-2 paragraph (any other exception reaching the command line, a bare ValueError included,
is a bug: exit 1 with its traceback). The classes below keep the second base their callers
catch them by (TypeError, FloatingPointError, RuntimeError, FileNotFoundError, OSError).
"""


class ParticlesError(Exception):
    """An error the package raises on purpose (anything else is a bug)."""


class ParticlesUserError(ParticlesError, ValueError):
    """A value given to the engine that it cannot take; the message names the argument,
    what was given and what is allowed."""


class ParticlesTypeError(ParticlesUserError, TypeError):
    """A value of the wrong kind (a string for a number, complex for real)."""


class BlowUpError(ParticlesUserError, FloatingPointError):
    """A NaN or Inf appeared in the state; the message names the step, token and cause
    (a step too large for the run's beta, most often)."""

    def __init__(self, message: str, step: int, replica: int, token: int):
        super().__init__(message)
        self.step, self.replica, self.token = step, replica, token


class ArchError(ParticlesUserError, RuntimeError):
    """The requested arch cannot run here, or conflicts with the one already running."""


class RuleCompileError(ParticlesUserError):
    """A rule's kernel or potential does not compile on the active arch."""


class RuleFileError(ParticlesUserError):
    """A user's rule file that cannot be executed (syntax error, an exception, sys.exit)."""


class RunFileError(ParticlesUserError):
    """A run file that is missing or corrupt; the message names it."""


class MissingFileError(ParticlesUserError, FileNotFoundError):
    """A file or folder the user named (a run, a trajectory, a sweep, a rule file) is not
    there; the message names it."""


class SymlinkRefused(ParticlesUserError, OSError):
    """The target of a write is a symbolic link; nothing was written."""


__all__ = ["ParticlesError", "ParticlesUserError", "ParticlesTypeError", "BlowUpError", "ArchError",
           "RuleCompileError", "RuleFileError", "RunFileError", "MissingFileError", "SymlinkRefused"]
