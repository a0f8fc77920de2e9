"""Speed peers for the benchmark script: the same sphere/softmax Euler step written the
way a NumPy or PyTorch user would write it (dense n x n attention per head).

These are yardsticks for the engine's timings, not references for its correctness
(that is ``tests/reference.py``, float64).  Everything here is float32.

Heads are given as factors, stacked over heads:

    Q, K : (H, r, d)     score matrix  M_h = Q_h^T K_h,  s^h_ij = <Q_h x_i, K_h x_j>
    O    : (H, d, rv)    value matrix  V_h = O_h W_h
    W    : (H, rv, d)

One step (MODEL.md, rule ``softmax``, sphere geometry, explicit Euler):

    S_h   = beta (x Q_h^T)(x K_h^T)^T                     (n x n)
    P_h   = row-softmax(S_h)     (row-max shifted)
    f^h   = (P_h (x W_h^T)) O_h^T                         (n x d)
    v     = sum_h f^h;  xdot = v - <v, x> x;  x <- (x + dt xdot) / |x + dt xdot|

Memory: the NumPy peers loop over heads and hold one head's n x n float32 score
matrix at a time (4 n^2 bytes; the observables variant holds two, 8 n^2 bytes),
plus O(n (d + r + rv)) per head.  The PyTorch peer is written as a torch user writes
attention: one matmul projects every head's queries, keys and values, all heads go to
``scaled_dot_product_attention`` at once, one matmul contracts the heads' outputs.  Its
SDPA takes torch's fused flash kernel on the CPU and the memory-efficient kernel on CUDA
(float32), so no n x n matrix is stored (``torch_sdpa_backend`` checks which it takes).

This module imports nothing from the project and needs only NumPy; torch is optional.
"""

from __future__ import annotations

import math
import time
import warnings

import numpy as np

try:  # optional peer
    import torch as _torch
    import torch.nn.functional as _F
    TORCH_AVAILABLE = True
except Exception:  # pragma: no cover - depends on the machine
    _torch = None
    _F = None
    TORCH_AVAILABLE = False

__all__ = ["TORCH_AVAILABLE", "make_factors", "numpy_step", "numpy_step_with_observables",
           "numpy_velocity", "numpy_rk4_run", "torch_step", "torch_step_with_observables",
           "torch_observables_kernel", "torch_observables_layout", "torch_sdpa_backend", "torch_available", "pair_work"]


def make_factors(H, d, r=None, rv=None, scale=1.0, seed=0, dtype=np.float32):
    """Random factors Q, K (H, r, d), O (H, d, rv), W (H, rv, d) for benchmarks."""
    r = d if r is None else r
    rv = d if rv is None else rv
    rng = np.random.default_rng(seed)
    Q = rng.standard_normal((H, r, d)) * (scale / math.sqrt(d))
    K = rng.standard_normal((H, r, d)) * (scale / math.sqrt(d))
    O = rng.standard_normal((H, d, rv)) * (scale / math.sqrt(rv))
    W = rng.standard_normal((H, rv, d)) * (scale / math.sqrt(d))
    return tuple(a.astype(dtype) for a in (Q, K, O, W))


def _as32(*arrays):
    return tuple(np.ascontiguousarray(a, dtype=np.float32) for a in arrays)


def _retract_euler(x, v, dt):
    radial = np.einsum("nd,nd->n", v, x)
    xdot = v - radial[:, None] * x
    y = x + np.float32(dt) * xdot
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return y, xdot


def numpy_step(x, Q, K, O, W, beta, dt):
    """One Euler step on the sphere, rule softmax, float32, dense attention per head.

    x: (n, d); returns the new (n, d) float32 tokens.
    Memory: one n x n float32 matrix at a time (4 n^2 bytes), heads in a loop.
    """
    x, Q, K, O, W = _as32(x, Q, K, O, W)
    n, d = x.shape
    b = np.float32(beta)
    v = np.zeros((n, d), dtype=np.float32)
    for h in range(Q.shape[0]):
        qx = (x @ Q[h].T) * b                 # (n, r), beta folded in: n r instead of n^2 work
        S = qx @ (x @ K[h].T).T               # (n, n) scaled scores
        S -= S.max(axis=1, keepdims=True)
        np.exp(S, out=S)
        rowsum = S.sum(axis=1)
        u = S @ (x @ W[h].T)                  # (n, rv)
        u /= rowsum[:, None]
        v += u @ O[h].T                       # (n, d)
    return _retract_euler(x, v, dt)[0]


def numpy_velocity(x, Q, K, O, W, beta):
    """xdot = P_x sum_h f^h on the sphere (rule softmax, float32), as in numpy_step."""
    n, d = x.shape
    b = np.float32(beta)
    v = np.zeros((n, d), dtype=np.float32)
    for h in range(Q.shape[0]):
        S = ((x @ Q[h].T) * b) @ (x @ K[h].T).T
        S -= S.max(axis=1, keepdims=True)
        np.exp(S, out=S)
        u = S @ (x @ W[h].T)
        u /= S.sum(axis=1)[:, None]
        v += u @ O[h].T
    return v - np.einsum("nd,nd->n", v, x)[:, None] * x


def numpy_rk4_run(x, Q, K, O, W, beta, dt, steps, observe_every=10):
    """A plain NumPy RK4 loop (the way a user writes one at small n): ``steps`` steps on the
    sphere, renormalised after each, with the observables of every observe_every-th state
    (numpy_step_with_observables' extras; its Euler step is discarded). Returns (x, rows)."""
    x, Q, K, O, W = _as32(x, Q, K, O, W)
    h = np.float32(dt)
    rows = []
    for step in range(steps):
        if observe_every and step % observe_every == 0:
            rows.append(numpy_step_with_observables(x, Q, K, O, W, beta, dt)[1])
        k1 = numpy_velocity(x, Q, K, O, W, beta)
        k2 = numpy_velocity(x + (h / 2) * k1, Q, K, O, W, beta)
        k3 = numpy_velocity(x + (h / 2) * k2, Q, K, O, W, beta)
        k4 = numpy_velocity(x + h * k3, Q, K, O, W, beta)
        x = x + (h / 6) * (k1 + 2 * k2 + 2 * k3 + k4)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x, rows


def pair_work(n, H, r, rv):
    """(flops, exps) of one velocity evaluation's pair pass: 2 n^2 (r + rv) and n^2 per head."""
    return 2.0 * H * n * n * (r + rv), float(H) * n * n


def numpy_step_with_observables(x, Q, K, O, W, beta, dt):
    """numpy_step plus the per-step observables of the state *before* the step.

    Returns (x_new, obs) with obs keyed as the log columns (docs/LOG.md):
    energy, kinetic, gamma_bar, eps and per head energy_h, tangent_power_h,
    cross_coupling_h, radial_shadow_h, energy_rate_h, radial_mean_h, radial_absmax_h,
    radial_dominance_h, entropy_mean_h, entropy_min_h, entropy_max_h.

    Vectorised extras on top of the step: the row log-sum-exp lse_i = m_i + log N_i
    gives E_h = exp(logsumexp_i lse_i - log(2 beta n^2)) (float64 scalar) and the row
    entropy H_i = log N_i - sum_j p_ij (z_ij - m_i); everything else is O(H n d).
    Memory: two n x n float32 matrices at a time (8 n^2 bytes), plus the H head
    outputs (H n d floats).
    """
    x, Q, K, O, W = _as32(x, Q, K, O, W)
    n, d = x.shape
    H = Q.shape[0]
    b = np.float32(beta)
    F = np.empty((H, n, d), dtype=np.float32)
    log_energy = np.empty(H)
    ent = np.empty((H, n), dtype=np.float32)
    for h in range(H):
        qx = (x @ Q[h].T) * b
        Z = qx @ (x @ K[h].T).T               # scaled scores z = beta s
        m = Z.max(axis=1, keepdims=True)
        Z -= m                                # shifted, kept for the entropy
        E = np.exp(Z)
        rowsum = E.sum(axis=1)
        logN = np.log(rowsum)
        ent[h] = logN - np.einsum("ij,ij->i", E, Z) / rowsum
        lse = (m[:, 0] + logN).astype(np.float64)
        top = lse.max()
        log_energy[h] = top + math.log(np.exp(lse - top).sum()) - math.log(2.0 * beta * n * n)
        u = E @ (x @ W[h].T)
        u /= rowsum[:, None]
        F[h] = u @ O[h].T
    v = F.sum(axis=0)
    x_new, xdot = _retract_euler(x, v, dt)

    a = np.einsum("hnd,nd->hn", F, x)                         # radial shadows (H, n)
    Fsq = np.einsum("hnd,hnd->h", F, F, dtype=np.float64)     # sum_i ||f^h_i||^2
    T = (Fsq - np.einsum("hn,hn->h", a, a, dtype=np.float64)) / n       # ||P f||^2 = ||f||^2 - a^2
    C = (np.einsum("hnd,nd->h", F, v, dtype=np.float64) - Fsq) / n      # <f^h, v> - ||f^h||^2
    asum = a.sum(axis=0)
    absa = np.abs(a)
    R = (np.einsum("hn,n->h", a, asum, dtype=np.float64) - np.einsum("hn,hn->h", a, a, dtype=np.float64)) / n
    Rabs = (np.einsum("hn,n->h", absa, absa.sum(axis=0), dtype=np.float64)
            - np.einsum("hn,hn->h", absa, absa, dtype=np.float64)) / n
    energy = np.exp(log_energy)
    ssum = x.sum(axis=0, dtype=np.float64)
    gamma_bar = (float(ssum @ ssum) - n) / (n * (n - 1)) if n > 1 else float("nan")
    obs = {
        "energy": float(energy.sum()),
        "kinetic": float(np.einsum("nd,nd->", xdot, xdot, dtype=np.float64) / n),
        "gamma_bar": gamma_bar,
        "eps": 1.0 - gamma_bar,
    }
    for h in range(H):
        obs[f"energy_h{h}"] = float(energy[h])
        obs[f"tangent_power_h{h}"] = float(T[h])
        obs[f"cross_coupling_h{h}"] = float(C[h])
        obs[f"radial_shadow_h{h}"] = float(R[h])
        obs[f"energy_rate_h{h}"] = float(T[h] + C[h] - R[h])
        obs[f"radial_mean_h{h}"] = float(a[h].mean(dtype=np.float64))
        obs[f"radial_absmax_h{h}"] = float(absa[h].max())
        obs[f"radial_dominance_h{h}"] = float(Rabs[h] / T[h]) if T[h] > 0 else (
            float("inf") if Rabs[h] > 0 else 0.0)
        obs[f"entropy_mean_h{h}"] = float(ent[h].mean(dtype=np.float64))
        obs[f"entropy_min_h{h}"] = float(ent[h].min())
        obs[f"entropy_max_h{h}"] = float(ent[h].max())
    return x_new, obs


def torch_available():
    """True when torch imports (the PyTorch peer can run)."""
    return TORCH_AVAILABLE


def _torch_attention_inputs(x, Q, K, W):
    """q, k (1, H, n, r) and values (1, H, n, rv) from one matmul of x with every head's
    factors: views of its (n, H, r) column blocks, the layout nn.MultiheadAttention hands
    to SDPA and the fused CPU flash kernel reads through strides (no copy)."""
    n, d = x.shape
    H, r, _ = Q.shape
    rv = W.shape[1]
    w_in = _torch.cat([Q.reshape(H * r, d), K.reshape(H * r, d), W.reshape(H * rv, d)])
    qkv = x @ w_in.T                                           # (n, H (2 r + rv))
    return tuple(part.view(n, H, -1).transpose(0, 1).unsqueeze(0)
                 for part in qkv.split([H * r, H * r, H * rv], dim=1))


def _torch_attention(q, k, val, beta):
    try:
        return _F.scaled_dot_product_attention(q, k, val, scale=float(beta))
    except TypeError:  # torch < 2.1 has no scale=: fold beta * sqrt(r) into q
        return _F.scaled_dot_product_attention(q * (float(beta) * math.sqrt(q.shape[-1])), k, val)


def torch_sdpa_backend(x, Q, K, W, beta):
    """Which fused SDPA kernel torch_step's attention takes on these tensors' device:
    "flash" or "efficient" (the first that runs when only it is allowed), else "math"
    (H n x n matrices materialised); None where torch cannot say (before torch 2.3)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return None
    with _torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # each refusal also warns why
        q, k, val = _torch_attention_inputs(x, Q, K, W)
        for name, backend in (("flash", SDPBackend.FLASH_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    _torch_attention(q, k, val, beta)
                return name
            except RuntimeError:  # "No available kernel": this backend refused the inputs
                continue
    return "math"


def _torch_operands(device, *arrays):
    """(whether the inputs were NumPy, the operands as float32 tensors on ``device``, default
    CUDA when available, else CPU); tensors pass through on their own device."""
    if not TORCH_AVAILABLE:
        raise ImportError("torch is not installed: the PyTorch peer is unavailable "
                          "(pip install torch)")
    if not isinstance(arrays[0], np.ndarray):
        return False, arrays
    if device is None:
        device = "cuda" if _torch.cuda.is_available() else "cpu"
    return True, tuple(_torch.as_tensor(np.asarray(a, dtype=np.float32), device=device) for a in arrays)


def torch_step(x, Q, K, O, W, beta, dt, device=None):
    """The same Euler step with torch.nn.functional.scaled_dot_product_attention(scale=beta).

    Accepts NumPy arrays (moved to ``device``, default CUDA when available, else CPU;
    returns NumPy) or torch tensors (kept on their device; returns a tensor).  For
    timing, pass tensors already on the device so no host transfer is measured.
    Raises ImportError when torch is not installed.

    Memory: x W_in^T (n, H (2 r + rv)) and the attention output (n, H rv); the fused
    kernels (CPU flash, CUDA memory-efficient for float32) store no n x n matrix.
    """
    torch = _torch
    as_numpy, (x, Q, K, O, W) = _torch_operands(device, x, Q, K, O, W)
    n, d = x.shape
    H, rv, _ = W.shape
    with torch.no_grad():
        att = _torch_attention(*_torch_attention_inputs(x, Q, K, W), beta)   # (1, H, n, rv)
        # sum_h att_h O_h^T as one matmul: (n, H rv) @ (H rv, d); the CPU flash kernel's
        # output is (n, H, rv) in memory, so the reshape is a view there
        v = att[0].transpose(0, 1).reshape(n, H * rv) @ O.transpose(1, 2).reshape(H * rv, d)
        xdot = v - (v * x).sum(dim=1, keepdim=True) * x
        y = x + float(dt) * xdot
        y = y / torch.linalg.norm(y, dim=1, keepdim=True)
    return y.cpu().numpy() if as_numpy else y


def _flash_with_lse():
    """torch's fused CPU flash kernel returning (out, row log-sum-exp), or None (before torch 2.3)."""
    try:
        return _torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    except (AttributeError, RuntimeError):
        return None


_FLASH_WITH_LSE = _flash_with_lse() if TORCH_AVAILABLE else None


def torch_observables_kernel(x):
    """The attention kernel torch_step_with_observables takes for tensors on x's device:
    "flash" (the fused CPU flash kernel, its row log-sum-exp) or "math" (H n x n matrices)."""
    return "flash" if _FLASH_WITH_LSE is not None and x.device.type == "cpu" else "math"


def _attention_with_lse(q, k, val, beta):
    """(sum_j w_ij val_j (1, H, n, D), lse_i = log sum_j exp(beta <q_i, k_j>) (H, n)) for
    q, k, val of one head size D."""
    if torch_observables_kernel(q) == "flash":
        out, lse = _FLASH_WITH_LSE(q, k, val, 0.0, False, scale=float(beta))
        return out, lse[0]
    z = float(beta) * (q @ k.transpose(-1, -2))                # the math formula: n x n per head
    lse = _torch.logsumexp(z, dim=-1)
    return _torch.exp(z - lse[..., None]) @ val, lse[0]


def _observed_attention(x, Q, K, O, W, beta, name, size):
    """(q (H, n, r), lse (H, n), kbar_i = sum_j w_ij K x_j (H, n, r), U, B) from the flash
    kernel in layout ``name`` at head size ``size``: the per-head outputs are f^h = U_h B_h^T
    (H, n, d), or U itself where B is None."""
    n, d = x.shape
    H, r, _ = Q.shape
    rv = W.shape[1]

    def padded(A):                                             # (H, a, d) -> (H, size, d), zero rows
        return A if A.shape[1] == size else _F.pad(A, (0, 0, 0, size - A.shape[1]))

    stacks = [padded(Q), padded(K)] + {"tokens": [], "pair": [padded(_torch.cat([W, K], dim=1))],
                                       "two": [padded(W)]}[name]
    proj = x @ _torch.cat(stacks).reshape(-1, d).T            # (n, H size) per stack
    q, k, *values = (part.view(n, H, size).transpose(0, 1).unsqueeze(0)
                     for part in proj.split(H * size, dim=1))
    if name == "tokens":
        tokens = x if size == d else _F.pad(x, (0, size - d))
        att, lse = _attention_with_lse(q, k, tokens.expand(1, H, n, size), beta)
        # xbar_i = sum_j w_ij x_j; f^h = V xbar and kbar = K xbar in one matmul, V = O W
        out = _torch.bmm(att[0, ..., :d], _torch.cat([O @ W, K], dim=1).transpose(1, 2))
        return q[0, ..., :r], lse, out[..., d:], out[..., :d], None
    att, lse = _attention_with_lse(q, k, values[0], beta)
    if name == "pair":
        kbar = att[0, ..., rv:rv + r]
    else:
        kbar = _attention_with_lse(q, k, k, beta)[0][0, ..., :r]
    return q[0, ..., :r], lse, kbar, att[0, ..., :rv], O


def _row_sums(x, U, B):
    """v = sum_h f^h (n, d) and per row <f^h, x>, |f^h|^2, <f^h, v> (H, n), for f^h = U_h B_h^T
    (U itself where B is None): in U's width rv where it is below d (B's columns stacked once,
    |f|^2 = u^T (B^T B) u), else from the f^h."""
    H, n, rv = U.shape
    d = x.shape[1]
    if B is not None and rv < d:
        stacked = B.transpose(1, 2).reshape(H * rv, d)
        v = U.transpose(0, 1).reshape(n, H * rv) @ stacked
        back = (_torch.cat([x, v]) @ stacked.T).view(2, n, H, rv).transpose(1, 2)   # B^T x, B^T v
        gram_u = _torch.bmm(U, B.transpose(1, 2) @ B)
        return v, (U * back[0]).sum(-1), (U * gram_u).sum(-1), (U * back[1]).sum(-1)
    F = U if B is None else _torch.bmm(U, B.transpose(1, 2))
    v = F.sum(dim=0)
    return v, (F * x).sum(-1), (F * F).sum(-1), (F * v).sum(-1)


def torch_observables_layouts(d, r, rv):
    """Every (layout, head size) torch_step_with_observables can take: each layout at the
    least head size that fits and at the next multiple of 16."""
    least = {"tokens": max(r, d), "pair": r + rv, "two": max(r, rv)}
    return [(name, size) for name, D in least.items()
            for size in sorted({D, -(-D // 16) * 16})]


_LAYOUTS = {}


def torch_observables_layout(x, Q, K, O, W, beta, probe_n=2048, rounds=3):
    """The fastest of torch_observables_layouts for these shapes on x's device and torch's
    thread count, measured once (best of ``rounds`` interleaved calls at n = min(n, probe_n);
    the kernel's cost is n^2 times a function of the head size) and remembered."""
    n, d = x.shape
    H, r, _ = Q.shape
    rv = W.shape[1]
    key = (n, d, H, r, rv, str(x.device), _torch.get_num_threads())
    if key not in _LAYOUTS:
        layouts = torch_observables_layouts(d, r, rv)
        m = min(n, probe_n)
        probe = _F.normalize(_torch.randn(m, d, generator=_torch.Generator().manual_seed(0)),
                             dim=1).to(x.device)
        best = {layout: math.inf for layout in layouts}
        with _torch.no_grad():
            for _ in range(rounds):
                for layout in layouts:
                    t0 = time.perf_counter()
                    _observed_attention(probe, Q, K, O, W, beta, *layout)
                    best[layout] = min(best[layout], time.perf_counter() - t0)
        _LAYOUTS[key] = min(layouts, key=best.get)
    return _LAYOUTS[key]


def torch_step_with_observables(x, Q, K, O, W, beta, dt, device=None, layout=None):
    """torch_step plus numpy_step_with_observables' observables of the state *before* the
    step, as a torch user computes them: from the fused flash-attention kernel.

    Returns (x_new, obs), obs keyed as numpy_step_with_observables'.  The CPU flash kernel
    (``aten._scaled_dot_product_flash_attention_for_cpu``) returns each row's log-sum-exp
    lse_i beside the output, which gives the energy E_h = sum_i exp(lse_i) / (2 beta n^2) and,
    with the attention-weighted keys kbar_i = sum_j w_ij k_j, the row entropy
    H_i = lse_i - beta <q_i, kbar_i>.  The kernel wants one head size D for q, k and values,
    so the values carry what gives both sums, in one of three layouts (``layout`` =
    (name, D); by default the fastest on these shapes, ``torch_observables_layout``):
    "tokens", one call with the tokens as values (f^h = O W xbar, kbar = K xbar after it;
    full heads need no padding); "pair", one call with values [W x, K x] and q, k zero-padded;
    "two", one call with values W x and one with values K x.  D may exceed the least that
    fits: the kernel runs faster at some head sizes (on an AVX-512 CPU 16 beats 2 to 8).
    The per-head outputs f^h = O_h u^h give the radial shadows, tangent powers and cross
    terms, reduced in the value rank where it is below d (<f^h, x> = <u^h, O_h^T x>; row sums
    in float32, sums over rows in float64).  Off the CPU, or before torch 2.3, the
    attention is the math formula (H n x n matrices; ``torch_observables_kernel`` says which).

    Memory: no n x n matrix with the flash kernel; x times the stacked factors (n, 3 H D),
    the attention output (H, n, D) and, where rv >= d, the per-head outputs (H, n, d).
    """
    torch = _torch
    as_numpy, (x, Q, K, O, W) = _torch_operands(device, x, Q, K, O, W)
    n, d = x.shape
    H = Q.shape[0]
    with torch.no_grad():
        if layout is None:
            layout = torch_observables_layout(x, Q, K, O, W, beta)
        q, lse, kbar, U, B = _observed_attention(x, Q, K, O, W, beta, *layout)
        v, a, fsq, fv = _row_sums(x, U, B)
        radial = (v * x).sum(dim=1, keepdim=True)
        xdot = v - radial * x
        y = x + float(dt) * xdot
        y = y / torch.linalg.norm(y, dim=1, keepdim=True)

        f64 = torch.float64
        entropy = lse - float(beta) * (q * kbar).sum(dim=-1)  # (H, n)
        fsq, aa, absa = fsq.to(f64), (a * a).to(f64), a.abs()   # a: the radial shadows a^h_i
        tangent = (fsq - aa).sum(dim=1) / n
        cross = (fv.to(f64) - fsq).sum(dim=1) / n
        shadow = ((a * a.sum(dim=0)).to(f64) - aa).sum(dim=1) / n
        shadow_abs = ((absa * absa.sum(dim=0)).to(f64) - aa).sum(dim=1) / n
        lse64 = lse.to(f64)
        energy = torch.exp(torch.logsumexp(lse64, dim=1) - math.log(2.0 * beta * n * n))
        ssum = x.sum(dim=0, dtype=f64)
        per_head = torch.stack([energy, tangent, cross, shadow, a.to(f64).mean(dim=1),
                                absa.amax(dim=1).to(f64), shadow_abs, entropy.to(f64).mean(dim=1),
                                entropy.amin(dim=1).to(f64), entropy.amax(dim=1).to(f64)])
        scalars = torch.stack([(xdot * xdot).sum(dtype=f64) / n, ssum @ ssum])
        (E, T, C, R, mean, absmax, Rabs, ent_mean, ent_min, ent_max), (kinetic, ssq) = \
            per_head.cpu().tolist(), scalars.cpu().tolist()     # one copy to the host
    gamma_bar = (ssq - n) / (n * (n - 1)) if n > 1 else float("nan")
    obs = {"energy": math.fsum(E), "kinetic": kinetic, "gamma_bar": gamma_bar, "eps": 1.0 - gamma_bar}
    for h in range(H):
        obs[f"energy_h{h}"] = E[h]
        obs[f"tangent_power_h{h}"] = T[h]
        obs[f"cross_coupling_h{h}"] = C[h]
        obs[f"radial_shadow_h{h}"] = R[h]
        obs[f"energy_rate_h{h}"] = T[h] + C[h] - R[h]
        obs[f"radial_mean_h{h}"] = mean[h]
        obs[f"radial_absmax_h{h}"] = absmax[h]
        obs[f"radial_dominance_h{h}"] = Rabs[h] / T[h] if T[h] > 0 else (
            float("inf") if Rabs[h] > 0 else 0.0)
        obs[f"entropy_mean_h{h}"] = ent_mean[h]
        obs[f"entropy_min_h{h}"] = ent_min[h]
        obs[f"entropy_max_h{h}"] = ent_max[h]
    return (y.cpu().numpy() if as_numpy else y), obs
