"""Initial token configurations on the unit sphere S^{d-1}.

Every function returns a float64 array of shape (n, d) whose rows are unit
vectors, and every random choice comes from ``numpy.random.default_rng(seed)``
with an integer seed, so a configuration is reproducible from (function, args).

- ``random``       independent uniform points (normalised Gaussians)
- ``equiangular``  <x_i, x_j> = gamma exactly for all i != j
- ``orthogonal``   orthonormal tokens (n <= d)
- ``clusters``     k clusters of a given angular spread around given/random centres
- ``from_file``    points read from .npy / .npz / .csv, projected onto the sphere
- ``perturb``      add Gaussian noise and renormalise
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from particles.pretrained import text_tokens
from particles.errors import ParticlesUserError

__all__ = [
    "random", "equiangular", "check_equiangular", "equiangular_min_dim", "equiangular_range",
    "orthogonal", "clusters", "from_file", "perturb", "random_frame", "seeded_rng",
    "equiangular_coordinates",
]

_BOUNDARY_TOL = 1e-12


def seeded_rng(seed, stream: int | None = None) -> np.random.Generator:
    """The generator of ``seed`` (every random choice of the scenes comes from one); ``stream``
    gives an independent generator of the same seed (the noise, the values)."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ParticlesUserError(f"seed must be an integer >= 0, got {seed!r}")
    if stream is None:
        return np.random.default_rng(int(seed))
    return np.random.default_rng([int(seed), stream])


def _check_size(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ParticlesUserError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _normalise_rows(x: np.ndarray, what: str = "configuration") -> np.ndarray:
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    if np.any(norms == 0) or not np.all(np.isfinite(norms)):
        bad = np.argwhere((norms[..., 0] == 0) | ~np.isfinite(norms[..., 0]))
        raise ParticlesUserError(f"{what}: row {tuple(int(i) for i in bad[0])} is zero or not finite; "
                                 "it cannot be projected onto the sphere")
    return x / norms


def random_frame(d: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """A uniformly random d x k matrix with orthonormal columns (k <= d)."""
    if k > d:
        raise ParticlesUserError(f"cannot have {k} orthonormal vectors in dimension {d}")
    if k == 0:
        return np.zeros((d, 0))
    q, r = np.linalg.qr(rng.standard_normal((d, k)))
    signs = np.sign(np.diag(r))
    signs[signs == 0] = 1.0
    return q * signs


def random(n: int, d: int, seed: int = 0) -> np.ndarray:
    """n independent uniform points on S^{d-1} (normalised standard Gaussians)."""
    n = _check_size("n", n, 1)
    d = _check_size("d", d, 1)
    return _normalise_rows(seeded_rng(seed).standard_normal((n, d)))


# ----------------------------------------------------------------------------- equiangular

def equiangular_range(n: int) -> tuple[float, float]:
    """The allowed pairwise inner products of n equiangular unit vectors: [-1/(n-1), 1]."""
    n = _check_size("n", n, 2)
    return (-1.0 / (n - 1), 1.0)


def _equiangular_rank(n: int, gamma: float) -> int:
    lo, hi = equiangular_range(n)
    if not (math.isfinite(gamma) and lo - _BOUNDARY_TOL <= gamma <= hi + _BOUNDARY_TOL):
        raise ParticlesUserError(
                    f"equiangular gamma must lie in [-1/(n-1), 1] = [{lo:.6g}, 1] for n = {n}, "
                    f"got {gamma!r}")
    if abs(gamma - hi) <= _BOUNDARY_TOL:
        return 1
    if abs(gamma - lo) <= _BOUNDARY_TOL:
        return n - 1
    return n


def equiangular_min_dim(n: int, gamma: float) -> int:
    """Smallest d holding n unit vectors with all pairwise inner products gamma.

    It is the rank of the Gram matrix G = (1 - gamma) I + gamma 11^T: n - 1 at
    gamma = -1/(n-1) (the regular simplex), 1 at gamma = 1, n otherwise.
    """
    return _equiangular_rank(n, float(gamma))


def equiangular_coordinates(n: int, gamma: float) -> np.ndarray:
    """n x r coordinates X with X X^T = (1 - gamma) I + gamma 11^T, r = rank.

    Uses the Helmert basis: its first column 1/sqrt(n) spans the eigenvector of
    eigenvalue 1 + (n-1) gamma, the others span 1^perp (eigenvalue 1 - gamma).
    """
    rank = _equiangular_rank(n, gamma)
    if abs(gamma - 1.0) <= _BOUNDARY_TOL:
        return np.ones((n, 1))
    helmert = np.zeros((n, n - 1))
    for k in range(1, n):
        norm = math.sqrt(k * (k + 1))
        helmert[:k, k - 1] = 1.0 / norm
        helmert[k, k - 1] = -k / norm
    along_one = np.full((n, 1), math.sqrt(max(1.0 + (n - 1) * gamma, 0.0) / n))
    across = math.sqrt(max(1.0 - gamma, 0.0)) * helmert
    if rank == n - 1:                      # gamma = -1/(n-1): no component along 1
        return across
    return np.hstack([along_one, across])


def check_equiangular(n: int, d: int, gamma: float) -> tuple[int, int, float]:
    """Raise ValueError (naming the allowed gamma range or the minimum d) unless
    ``equiangular(n, d, gamma)`` can be built."""
    n = _check_size("n", n, 2)
    d = _check_size("d", d, 1)
    gamma = float(gamma)
    need = equiangular_min_dim(n, gamma)
    if d < need:
        raise ParticlesUserError(f"equiangular configuration of n = {n} tokens with gamma = {gamma:g} "
                                 f"needs d >= {need} (minimum d = {need}), got d = {d}")
    return n, d, gamma


def equiangular(n: int, d: int, gamma: float = 0.0, seed: int = 0) -> np.ndarray:
    """n unit vectors in R^d with <x_i, x_j> = gamma exactly for every i != j.

    gamma must lie in [-1/(n-1), 1]; d must be at least ``equiangular_min_dim(n, gamma)``
    (n in general, n - 1 for the regular simplex gamma = -1/(n-1), 1 for gamma = 1).
    The configuration is embedded in R^d by a random orthonormal frame drawn from ``seed``.
    """
    n, d, gamma = check_equiangular(n, d, gamma)
    coords = equiangular_coordinates(n, gamma)
    frame = random_frame(d, coords.shape[1], seeded_rng(seed))
    return _normalise_rows(coords @ frame.T)


def orthogonal(n: int, d: int, seed: int = 0) -> np.ndarray:
    """n orthonormal tokens (rows) in a random orientation; needs n <= d."""
    n = _check_size("n", n, 1)
    d = _check_size("d", d, 1)
    if n > d:
        raise ParticlesUserError(f"orthogonal configuration needs n <= d (at most d orthonormal vectors), "
                                 f"got n = {n} > d = {d}")
    return np.ascontiguousarray(random_frame(d, n, seeded_rng(seed)).T)


def clusters(n: int, d: int, k: int = 3, spread: float = 0.1, seed: int = 0,
             centers=None) -> np.ndarray:
    """n tokens in k clusters; token i belongs to cluster i % k (round-robin).

    Each token is the centre moved along a random tangent direction: the tangent
    perturbation is Gaussian with standard deviation ``spread`` (radians) per
    tangent coordinate, applied through the exponential map of the sphere. Centres
    are uniform random unless ``centers`` (k x d, normalised here) is given.
    """
    n = _check_size("n", n, 1)
    d = _check_size("d", d, 1)
    k = _check_size("clusters k", k, 1)
    spread = float(spread)
    if not (math.isfinite(spread) and spread >= 0):
        raise ParticlesUserError(f"spread must be a finite number >= 0 (radians), got {spread!r}")
    if k > n:
        raise ParticlesUserError(f"cannot make k = {k} clusters from n = {n} tokens (need k <= n)")
    rng = seeded_rng(seed)
    if centers is None:
        c = _normalise_rows(rng.standard_normal((k, d)), "cluster centres")
    else:
        c = np.asarray(centers, dtype=np.float64)
        if c.shape != (k, d):
            raise ParticlesUserError(f"centers must have shape (k, d) = ({k}, {d}), got {c.shape}")
        c = _normalise_rows(c, "cluster centres")
    base = c[np.arange(n) % k]
    t = spread * rng.standard_normal((n, d))
    t -= np.sum(t * base, axis=1, keepdims=True) * base        # tangent at the centre
    theta = np.linalg.norm(t, axis=1, keepdims=True)
    safe = np.where(theta > 0, theta, 1.0)
    x = np.cos(theta) * base + np.sin(theta) * (t / safe)
    return _normalise_rows(x)


def from_file(path, n: int | None = None, d: int | None = None) -> np.ndarray:
    """Tokens read from a file and projected onto the sphere.

    ``.npy``: one array; ``.npz``: the array named ``tokens``, else the first one;
    ``.csv``: comma-separated numbers only, one token per line. The array must be
    2-D (n x d); when ``n`` or ``d`` is given the shape must match. Zero rows are an error.
    """
    p = Path(path)
    if not p.is_file():
        raise ParticlesUserError(f"token file '{p}' not found")
    suffix = p.suffix.lower()
    try:
        if suffix == ".npy":
            a = np.load(p, allow_pickle=False)
        elif suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                if not z.files:
                    raise ParticlesUserError(f"token file '{p}' holds no arrays")
                a = z["tokens"] if "tokens" in z.files else z[z.files[0]]
        elif suffix == ".csv":
            a = np.loadtxt(p, delimiter=",", dtype=np.float64, ndmin=2)
        else:
            raise ParticlesUserError(f"token file '{p}': unsupported extension '{p.suffix}' "
                                     "(expected .npy, .npz or .csv)")
        a = np.asarray(a, dtype=np.float64)
    except ValueError as exc:
        if str(exc).startswith("token file"):
            raise
        raise ParticlesUserError(f"token file '{p}' could not be read as numbers: {exc}") from None
    except OSError as exc:
        raise ParticlesUserError(f"token file '{p}' could not be read: {exc}") from None
    want = f"({n if n is not None else 'n'}, {d if d is not None else 'd'})"
    if a.ndim != 2:
        raise ParticlesUserError(f"token file '{p}': expected a 2-D array of shape {want}, "
                                 f"found shape {a.shape}")
    if (n is not None and a.shape[0] != n) or (d is not None and a.shape[1] != d):
        raise ParticlesUserError(f"token file '{p}': expected shape {want}, found shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise ParticlesUserError(f"token file '{p}' contains NaN or Inf")
    norms = np.linalg.norm(a, axis=1)
    if np.any(norms == 0):
        raise ParticlesUserError(f"token file '{p}': row {int(np.argmin(norms))} is zero and cannot be "
                                 "projected onto the sphere")
    return a / norms[:, None]


def perturb(x, noise: float, seed: int = 0) -> np.ndarray:
    """x plus Gaussian noise of standard deviation ``noise`` per coordinate, renormalised.

    The noise comes from its own stream of ``seed`` (not the stream the other
    constructors use), so ``perturb(random(n, d, s), eps, s)`` is not degenerate.
    Works on (n, d) and (R, n, d) arrays.
    """
    x = np.asarray(x, dtype=np.float64)
    noise = float(noise)
    if not (math.isfinite(noise) and noise >= 0):
        raise ParticlesUserError(f"noise must be a finite number >= 0, got {noise!r}")
    if noise == 0:
        return _normalise_rows(x.copy())
    return _normalise_rows(x + noise * seeded_rng(seed, stream=1).standard_normal(x.shape),
                           "perturbed configuration")


# ----------------------------------------------------------------------------- text

def text(model, sentence: str, layernorm: bool = True, layer: int = 0) -> np.ndarray:
    """The embeddings of ``sentence`` as the model adds them (its tokenizer; BERT: word +
    position + token type, then the embedding LayerNorm if ``layernorm``), on the unit sphere;
    ``layer = l > 0``: the hidden state entering layer l (the model's own forward).
    The token strings: ``particles.pretrained.text_tokens(model, sentence).strings``."""
    return text_tokens(model, sentence, layernorm=layernorm, layer=layer).x
