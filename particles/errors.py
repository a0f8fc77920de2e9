"""The core's error classes for mistakes in what a user passed (imports nothing).

``ParticlesUserError`` is a ValueError, so code that catches ValueError keeps working; the
command line maps it to an exit-2 paragraph. ``ParticlesTypeError`` is also a TypeError, for
values of the wrong kind (a string where a number goes, complex tokens).
"""
from __future__ import annotations


class ParticlesUserError(ValueError):
    """A value given to the engine that it cannot take; the message names the argument,
    what was given and what is allowed."""


class ParticlesTypeError(ParticlesUserError, TypeError):
    """A value of the wrong kind (a string for a number, complex for real)."""


__all__ = ["ParticlesUserError", "ParticlesTypeError"]
