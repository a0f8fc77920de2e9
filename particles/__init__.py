"""Tokens of a transformer as particles: multi-head self-attention dynamics in Taichi."""
from .heads import Head
from .rules import Rule, register_rule, get_rule, registered_rules, load_rule_file, BUILTIN_RULES
from .simulation import Simulation, BlowUpError
from .backend import ArchError

__version__ = "0.1.0"
__all__ = ["Head", "Rule", "register_rule", "get_rule", "registered_rules", "load_rule_file",
           "BUILTIN_RULES", "Simulation", "BlowUpError", "ArchError", "__version__"]
