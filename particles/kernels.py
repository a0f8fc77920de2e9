"""Taichi kernels, specialised per (rule, geometry, dtype, head shapes) by a cached factory.

Layout (b = replica, h = head, i/j = token, c = component):
    x      (R, n, d)        tokens
    q, k   (R, H, n, r)     score factors  q_i = Q_h x_i,  k_j = K_h x_j   (s_ij = <q_i, k_j>)
    u      (R, H, n, rv)    value inputs   u_j = W_h x_j
    g      (R, H, n, rv)    normalised pulls g_i = sum_j w_ij u_j  (f_i = O_h g_i)
    f      (R, H, n, d)     head outputs f^h_i
    row    (R, H, n, 4)     per-row statistics of the pair pass: running max m_i of z, weight
                            sum l_i, entropy H_i, row energy (log-sum for exponential rules)
Every thread owns one row i and writes only it (gather, no atomics), and no n x n
matrix is ever stored: softmax is normalised with a running maximum.
"""

import functools

import taichi as ti

from .rules import Rule

# Per-token observable slots (last axis of the `tok` buffer), per head h:
SLOT_TANGENT, SLOT_CROSS, SLOT_RADIAL_PAIR, SLOT_RADIAL_ABS_PAIR, SLOT_RADIAL, SLOT_ENTROPY, \
    SLOT_ROW_ENERGY, SLOT_ENTROPY_RATE = range(8)
SLOTS_PER_HEAD = 8
SLOT_KINETIC = 0  # then head h's slot s lives at 1 + h * SLOTS_PER_HEAD + s


def tok_slot(h: int, s: int) -> int:
    return 1 + h * SLOTS_PER_HEAD + s


def n_tok_slots(n_heads: int) -> int:
    return 1 + n_heads * SLOTS_PER_HEAD


# Reduction outputs per slot: sum, min, max, log-sum-exp.
RED_SUM, RED_MIN, RED_MAX, RED_LSE = range(4)


@functools.lru_cache(maxsize=None)
def build(rule: Rule, geometry: str, dtype: str, d: int, n_heads: int, r: int, rv: int) -> "KernelSet":
    return KernelSet(rule, geometry, dtype, d, n_heads, r, rv)


class KernelSet:
    """The compiled kernels for one specialisation; arrays are passed as arguments."""

    def __init__(self, rule: Rule, geometry: str, dtype: str, d: int, H: int, r: int, rv: int):
        real = ti.f32 if dtype == "float32" else ti.f64
        sphere = geometry == "sphere"
        exponential = rule.exponential
        softmax_norm = rule.normalization == "softmax"
        has_potential = rule.has_potential
        kernel_fn = None if exponential else ti.func(rule.kernel)
        potential_fn = ti.func(rule.potential) if (rule.potential is not None and not exponential) else None
        with_potential = potential_fn is not None
        NEG_BIG = -3.0e38 if dtype == "float32" else -1.0e300
        n_slots = n_tok_slots(H)
        arr2 = ti.types.ndarray(dtype=real, ndim=2)
        arr1 = ti.types.ndarray(dtype=real, ndim=1)
        arr3 = ti.types.ndarray(dtype=real, ndim=3)
        arr4 = ti.types.ndarray(dtype=real, ndim=4)
        f64arr4 = ti.types.ndarray(dtype=ti.f64, ndim=4)

        @ti.func
        def c(value):
            return ti.cast(value, real)

        @ti.kernel
        def project(x: arr3, Qf: arr3, Kf: arr3, Wf: arr3, q: arr4, k: arr4, u: arr4):
            """q = Q_h x, k = K_h x, u = W_h x for every replica, head and token."""
            for b, h, i in ti.ndrange(x.shape[0], H, x.shape[1]):
                for a in range(r):
                    sq = c(0)
                    sk = c(0)
                    for e in range(d):
                        sq += Qf[h, a, e] * x[b, i, e]
                        sk += Kf[h, a, e] * x[b, i, e]
                    q[b, h, i, a] = sq
                    k[b, h, i, a] = sk
                for a in range(rv):
                    su = c(0)
                    for e in range(d):
                        su += Wf[h, a, e] * x[b, i, e]
                    u[b, h, i, a] = su

        @ti.kernel
        def pair(q: arr4, k: arr4, u: arr4, beta: arr1, g: arr4, row: arr4, observe: ti.template()):
            """g_i = sum_j w_ij u_j, normalised; with observe, row energies and entropies."""
            n = q.shape[2]
            for b, h, i in ti.ndrange(q.shape[0], H, n):
                qi = ti.Vector.zero(real, r)
                for a in ti.static(range(r)):
                    qi[a] = q[b, h, i, a] * beta[b]
                acc = ti.Vector.zero(real, rv)
                m = c(NEG_BIG)       # running maximum of z (exponential rules)
                wsum = c(0)          # sum of (shifted) kernel weights
                ent = c(0)           # entropy accumulator
                pot = c(0)           # row sum of the potential (non-exponential rules)
                for j in range(n):
                    z = c(0)
                    for a in ti.static(range(r)):
                        z += qi[a] * k[b, h, j, a]
                    w = c(0)
                    if ti.static(exponential):
                        if z > m:
                            scale = ti.exp(m - z)
                            if ti.static(observe):
                                # sum e^{z-m}(z-m) re-based on the new maximum
                                ent = scale * (ent + (m - z) * wsum)
                            wsum *= scale
                            acc *= scale
                            m = z
                        w = ti.exp(z - m)
                        if ti.static(observe):
                            ent += w * (z - m)
                    else:
                        w = c(kernel_fn(z))
                        if ti.static(observe):
                            if w > 0:
                                ent += w * ti.log(w)
                            if ti.static(with_potential):
                                pot += c(potential_fn(z))
                    wsum += w
                    for a in ti.static(range(rv)):
                        acc[a] += w * u[b, h, j, a]
                norm = c(0)
                if ti.static(softmax_norm):
                    if wsum > 0:
                        norm = c(1) / wsum
                else:
                    if ti.static(exponential):
                        norm = ti.exp(m) / c(n)
                    else:
                        norm = c(1) / c(n)
                for a in ti.static(range(rv)):
                    g[b, h, i, a] = acc[a] * norm
                if ti.static(observe):
                    row[b, h, i, 0] = m
                    row[b, h, i, 1] = wsum
                    entropy = c(0)
                    if wsum > 0:
                        entropy = ti.log(wsum) - ent / wsum
                    row[b, h, i, 2] = entropy
                    if ti.static(exponential):
                        # log of the row's energy sum: sum_j e^{z} = e^m * wsum
                        row[b, h, i, 3] = m + ti.log(wsum)
                    else:
                        row[b, h, i, 3] = pot

        @ti.kernel
        def head_out(g: arr4, Of: arr3, f: arr4):
            """f^h_i = O_h g^h_i (head h's pull on token i)."""
            for b, h, i, e in ti.ndrange(g.shape[0], H, g.shape[2], d):
                s = c(0)
                for a in range(rv):
                    s += Of[h, e, a] * g[b, h, i, a]
                f[b, h, i, e] = s

        @ti.kernel
        def combine(x: arr3, f: arr4, xdot: arr3, row: arr4, tok: arr3, observe: ti.template()):
            """v_i = sum_h f^h_i; xdot_i = P_i v_i; with observe, the per-token observables.

            Per head h: a^h = <f^h, x> (radial shadow), T = ||P f^h||^2, C = sum_{h'!=h} <f^h, f^h'>,
            R = a^h sum_{h'!=h} a^h' (zero in flat space), and |a^h| sum_{h'!=h} |a^h'|.
            """
            for b, i in ti.ndrange(x.shape[0], x.shape[1]):
                radial = ti.Vector.zero(real, H)
                gram = ti.Matrix.zero(real, H, H)
                for e in range(d):
                    xe = x[b, i, e]
                    for h in ti.static(range(H)):
                        radial[h] += f[b, h, i, e] * xe
                        if ti.static(observe):
                            for h2 in ti.static(range(h + 1, H)):
                                gram[h, h2] += f[b, h, i, e] * f[b, h2, i, e]
                v_radial = radial.sum() if ti.static(sphere) else c(0)
                kinetic = c(0)
                tangent = ti.Vector.zero(real, H)
                for e in range(d):
                    xe = x[b, i, e]
                    ve = c(0)
                    for h in ti.static(range(H)):
                        fe = f[b, h, i, e]
                        ve += fe
                        if ti.static(observe):
                            pe = fe - radial[h] * xe if ti.static(sphere) else fe
                            tangent[h] += pe * pe
                    xde = ve - v_radial * xe
                    xdot[b, i, e] = xde
                    kinetic += xde * xde
                if ti.static(observe):
                    tok[b, i, 0] = kinetic
                    abs_sum = c(0)
                    for h in ti.static(range(H)):
                        abs_sum += ti.abs(radial[h])
                    for h in ti.static(range(H)):
                        cross = c(0)
                        for h2 in ti.static(range(H)):
                            if ti.static(h2 > h):
                                cross += gram[h, h2]
                            elif ti.static(h2 < h):
                                cross += gram[h2, h]
                        ah = radial[h]
                        base = 1 + h * SLOTS_PER_HEAD
                        tok[b, i, base + SLOT_TANGENT] = tangent[h]
                        tok[b, i, base + SLOT_CROSS] = cross
                        if ti.static(sphere):
                            tok[b, i, base + SLOT_RADIAL_PAIR] = ah * (v_radial - ah)
                            tok[b, i, base + SLOT_RADIAL_ABS_PAIR] = ti.abs(ah) * (abs_sum - ti.abs(ah))
                        else:
                            tok[b, i, base + SLOT_RADIAL_PAIR] = c(0)
                            tok[b, i, base + SLOT_RADIAL_ABS_PAIR] = c(0)
                        tok[b, i, base + SLOT_RADIAL] = ah
                        tok[b, i, base + SLOT_ENTROPY] = row[b, h, i, 2]
                        tok[b, i, base + SLOT_ROW_ENERGY] = row[b, h, i, 3]

        @ti.kernel
        def entropy_rate(q: arr4, k: arr4, qd: arr4, kd: arr4, beta: arr1, row: arr4, tok: arr3):
            """-beta^2 Cov_p(s_i., sdot_i.) per row (Theorem 27), p the softmax weights.

            sdot_ij = <qdot_i, k_j> + <q_i, kdot_j>, where qdot = Q xdot, kdot = K xdot.
            """
            n = q.shape[2]
            for b, h, i in ti.ndrange(q.shape[0], H, n):
                m = row[b, h, i, 0]
                inv_l = c(1) / row[b, h, i, 1]
                bt = beta[b]
                s_ref = m / bt  # centre scores on the row maximum to limit cancellation
                es = c(0)
                esd = c(0)
                essd = c(0)
                for j in range(n):
                    s = c(0)
                    sd = c(0)
                    for a in ti.static(range(r)):
                        s += q[b, h, i, a] * k[b, h, j, a]
                        sd += qd[b, h, i, a] * k[b, h, j, a] + q[b, h, i, a] * kd[b, h, j, a]
                    p = ti.exp(bt * s - m) * inv_l
                    ds = s - s_ref
                    es += p * ds
                    esd += p * sd
                    essd += p * ds * sd
                cov = essd - es * esd
                tok[b, i, 1 + h * SLOTS_PER_HEAD + SLOT_ENTROPY_RATE] = -bt * bt * cov

        @ti.kernel
        def reduce(tok: arr3, x: arr3, out: f64arr4, sumx: f64arr4, slot: ti.i32):
            """Column reductions over tokens, one thread per (replica, slot), fixed order."""
            n = tok.shape[1]
            for b, s in ti.ndrange(tok.shape[0], n_slots):
                total = ti.cast(0, ti.f64)
                lo = ti.cast(tok[b, 0, s], ti.f64)
                hi = lo
                for i in range(n):
                    val = ti.cast(tok[b, i, s], ti.f64)
                    total += val
                    lo = ti.min(lo, val)
                    hi = ti.max(hi, val)
                lse = ti.cast(0, ti.f64)
                for i in range(n):
                    lse += ti.exp(ti.cast(tok[b, i, s], ti.f64) - hi)
                out[slot, b, s, 0] = total
                out[slot, b, s, 1] = lo
                out[slot, b, s, 2] = hi
                out[slot, b, s, 3] = hi + ti.log(lse)
            for b, e in ti.ndrange(x.shape[0], d):
                # sum of the normalised tokens (they are unit already on the sphere)
                total = ti.cast(0, ti.f64)
                for i in range(x.shape[1]):
                    norm2 = ti.cast(0, ti.f64)
                    for e2 in range(d):
                        norm2 += ti.cast(x[b, i, e2], ti.f64) ** 2
                    if norm2 > 0:
                        total += ti.cast(x[b, i, e], ti.f64) / ti.sqrt(norm2)
                sumx[slot, b, e, 0] = total

        @ti.kernel
        def axpy(out: arr3, x: arr3, a: real, y: arr3):
            """out = x + a * y."""
            for b, i, e in out:
                out[b, i, e] = x[b, i, e] + a * y[b, i, e]

        @ti.kernel
        def accumulate(acc: arr3, a: real, y: arr3, first: ti.i32):
            """acc = a * y (first) or acc += a * y."""
            for b, i, e in acc:
                if first:
                    acc[b, i, e] = a * y[b, i, e]
                else:
                    acc[b, i, e] += a * y[b, i, e]

        @ti.kernel
        def retract(x: arr3):
            """Back onto the sphere by renormalising each token (no-op in flat space)."""
            if ti.static(sphere):
                for b, i in ti.ndrange(x.shape[0], x.shape[1]):
                    s = c(0)
                    for e in ti.static(range(d)):
                        s += x[b, i, e] * x[b, i, e]
                    inv = c(1) / ti.sqrt(s)
                    for e in ti.static(range(d)):
                        x[b, i, e] *= inv

        @ti.kernel
        def finite_check(x: arr3) -> ti.i32:
            """Index b * n + i of a token with a non-finite component, or -1."""
            bad = -1
            n = x.shape[1]
            for b, i in ti.ndrange(x.shape[0], n):
                for e in ti.static(range(d)):
                    if ti.math.isnan(x[b, i, e]) or ti.math.isinf(x[b, i, e]):
                        ti.atomic_max(bad, b * n + i)
            return bad

        self.project, self.pair, self.head_out, self.combine = project, pair, head_out, combine
        self.entropy_rate, self.reduce = entropy_rate, reduce
        self.axpy, self.accumulate, self.retract, self.finite_check = axpy, accumulate, retract, finite_check
        self.has_potential = has_potential
        self.exponential = exponential
