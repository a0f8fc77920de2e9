"""Tokens of a transformer as particles: multi-head self-attention dynamics in Taichi."""
import os as _os

__version__ = "0.1.0"
# Taichi's import banner is noise on a researcher's terminal; run.json records its version.
_os.environ.setdefault("ENABLE_TAICHI_HEADER_PRINT", "False")

from .heads import Head  # noqa: E402
from .rules import Rule, register_rule, get_rule, registered_rules, load_rule_file, BUILTIN_RULES  # noqa: E402
from .simulation import Simulation, BlowUpError  # noqa: E402
from .backend import ArchError  # noqa: E402
from .output import load_log, load_trajectory  # noqa: E402

__all__ = ["Head", "Rule", "register_rule", "get_rule", "registered_rules", "load_rule_file",
           "BUILTIN_RULES", "Simulation", "BlowUpError", "ArchError", "load_log", "load_trajectory",
           "__version__"]
