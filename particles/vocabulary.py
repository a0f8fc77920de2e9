"""The engine's closed vocabularies, in a module that imports nothing.

The scene schema validates against these without starting Taichi; the engine modules that
own each choice (simulation, backend, attention, rules) take their lists from here.
"""
GEOMETRIES = ("sphere", "flat")
DTYPES = ("float32", "float64")
ARCHES = ("cpu", "gpu", "auto")
MASKS = ("none", "causal", "window", "causal_window")
BUILTIN_RULES = ("exp", "softmax", "relu", "sinkhorn")   # particles.rules registers exactly these at import
# where the LayerNorm sits (particles.normalisation): "post" is the paper's sphere
NORMALISATIONS = ("post", "pre", "peri", "ngpt")
