"""Scenes: validated TOML descriptions of a run, initial configurations, head builders.

    from scenes import load_scene, Scene, SceneError, bundled_scenes
    scene = load_scene("quickstart", overrides=["dynamics.beta=3.0"])

Every key of a scene file is documented in ``scenes/README.md``.
"""
from .errors import SceneError
from .scene import Scene, bundled_scenes, load_scene

__all__ = ["load_scene", "Scene", "SceneError", "bundled_scenes"]
