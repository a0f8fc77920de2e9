"""Rendering of particle runs: streamed videos (`Animation`) and summary figures.

    from render import Animation, RenderConfig, RunInfo, plot_summary, plot_quantity

Everything draws on matplotlib `Figure` objects with the Agg canvas; pyplot's global state
(and the user's chosen backend) is never touched.
"""

from .animation import Animation
from .config import RenderConfig, RunInfo
from .figures import plot_quantity, plot_summary

__all__ = ["Animation", "RenderConfig", "RunInfo", "plot_summary", "plot_quantity"]
