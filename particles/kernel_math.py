"""The mathematics the pair passes share, written once as Taichi functions; the pass modules
(kernels, kernels_fused, kernels_wide, kernels_gpu) keep the layout and the scheduling.

Each factory returns ``ti.func``s for one real type (and lane count, for vectors compiled
unscalarised): the passes inline them, so a function moved here compiles to what its copies
did.

- the two float32 exps, side by side with their error bounds: ``exp_le0`` (scalar code that
  LLVM's loop vectoriser takes; 2.2e-7 relative) and ``exp_clamped`` (L-lane vectors, which
  have no bit casts in Taichi; 3.4e-6 relative where a weight counts);
- the online-softmax rebase of a row's sums on a new maximum (``online_rebase``), one key's
  update of a row's sums in the scalar passes (``key_by_key``), and the row finish (entropy,
  row energy; ``row_finish``);
- the rule lift: k(z) or k(z, i, j, n) and the potential, for kernel rules, and their
  entropy accumulated relative to the row's largest weight (no cancellation in float32);
- the retraction onto the sphere after a step;
- the per-token observables of a state (kinetic, and per head T, C, R, |R|, a, entropy, row
  energy), over one token or L tokens in lanes, the layout's reads and writes passed in;
- the column reduction of a per-token observable over tokens (float64, fixed order), and the
  sum of directions x_i / |x_i| beside it (``direction_sum``).
"""

import math

import taichi as ti

from .layout import SLOT_CROSS, SLOT_ENTROPY, SLOT_KINETIC, SLOT_RADIAL, SLOT_RADIAL_ABS_PAIR, \
    SLOT_RADIAL_PAIR, SLOT_ROW_ENERGY, SLOT_TANGENT, SLOTS_PER_HEAD

CLAMP = -30.0  # float32 weights below e^-30 relative to the row maximum are rounded up to it
EXP_SQUARINGS = 5  # the float32 vector exp squares e^(z / 32): |z / 32| <= 0.94 for z >= CLAMP
EXP_DEGREE = 7     # Taylor degree of e^y there: truncation below the squarings' rounding for z >= -10
# Loops over the d components are unrolled at compile time up to this d (every path and test
# size; the fused path's limit too); above, runtime loops: unrolled at d = 384 (MiniLM) the
# observables' combine, the reduction and each integrator kernel took 30-150 s each to compile.
UNROLL_MAX_D = 64


# -- the float32 exps ---------------------------------------------------------------------------
def exp_le0(real):
    """A ti.func e^x for x <= 0 on scalars (float64: ti.exp). float32: x = n ln2 + y (one
    constant: the fused multiply-add does not round n ln2), e^y by a degree-5 polynomial fitted
    for relative error, 2^n by the exponent bits: within 2.2e-7 relative for x > -20 (4e-7
    down to -87), below the rounding of x itself, and vectorisable (ti.exp is a libm call). x
    is clamped to -87, where e^x is 2^-126, a weight negligible against the row maximum's 1."""
    f32 = real == ti.f32

    @ti.func
    def c(value):
        return ti.cast(value, real)

    @ti.func
    def exp(x):
        result = c(0)
        if ti.static(f32):
            xc = ti.select(x > c(-87.0), x, c(-87.0))  # one maxps (ti.max also tests NaN)
            nf = ti.floor(xc * c(1.4426950408889634) + c(0.5))
            y = xc - nf * c(0.6931471805599453)  # fused: the product is not rounded
            p = c(8.3337789401e-3)   # 1 + y + y^2 p(y): degree 5, fitted for relative error
            p = p * y + c(4.1898537427e-2)
            p = p * y + c(1.6666887701e-1)
            p = p * y + c(4.9999141693e-1)
            p = p * y * y + y + c(1.0)
            result = p * ti.bit_cast((ti.cast(nf, ti.i32) + 127) << 23, real)
        else:
            result = ti.exp(x)
        return result

    return exp


def vector_helpers(real, L: int):
    """(c, splat, vabs, exp_clamped) for L-lane Taichi vectors compiled unscalarised (the
    fused and wide passes)."""
    f32 = real == ti.f32
    vec = ti.types.vector(L, real)
    taylor = [1.0 / math.factorial(k) for k in range(EXP_DEGREE + 1)]

    @ti.func
    def c(value):
        return ti.cast(value, real)

    @ti.func
    def splat(value):
        return vec([c(value)] * L)

    @ti.func
    def vabs(v):
        return ti.max(v, v * c(-1))  # Taichi vectors have no abs (nor negation) unscalarised

    @ti.func
    def exp_clamped(zc):
        """e^zc for CLAMP <= zc <= 0, lane-wise. float32: e^zc = (e^(zc / 2^S))^(2^S), the inner
        exp by its Taylor polynomial of degree EXP_DEGREE on [-30 / 2^S, 0] (exact at 0), then S
        squarings: 20 vector operations, against ~48 for a Cody-Waite reduction whose 2^n has to
        be built by selects (Taichi vectors have no bit casts). The squarings double the
        rounding error five times: absolute error <= 1.4e-6, relative <= 3.4e-6 for zc >= -10
        (weights that count), within the float32 tolerance of a step (1e-5). float64: libm per lane."""
        result = zc
        if ti.static(f32):
            y = zc * c(1.0 / 2 ** EXP_SQUARINGS)
            p = splat(taylor[EXP_DEGREE])
            for k in ti.static(range(EXP_DEGREE - 1, -1, -1)):
                p = p * y + c(taylor[k])
            for _ in ti.static(range(EXP_SQUARINGS)):
                p = p * p
            result = p
        else:
            for k in range(L):
                result[k] = ti.exp(zc[k])
        return result

    return c, splat, vabs, exp_clamped


def ndarrays(dtype):
    """The ndarray argument types of 1 to 4 dimensions with elements ``dtype`` (a real type
    or a lane vector type): the passes' kernel signatures."""
    return tuple(ti.types.ndarray(dtype=dtype, ndim=k) for k in range(1, 5))


def lane_columns(real, L: int):
    """A ti.func (F, h, e, cc, rank) -> the L-lane vector F[h, cc L + k, e] over k (zero past
    rank): column e of a head's factor with its rank in lanes (the fused and wide passes)."""
    vec = ti.types.vector(L, real)

    @ti.func
    def column(F: ti.template(), h, e, cc, rank):
        v = vec([ti.cast(0, real)] * L)
        for k in ti.static(range(L)):
            if cc * L + k < rank:
                v[k] = F[h, cc * L + k, e]
        return v

    return column


def lane_tiles(real, L: int, TR: int, JB: int, AC: int, query, key, value):
    """The register tiles of the lane passes (kernels_wide, kernels_fused; rows in lanes, TR row
    vectors a tile) over the caller's register lists (templates, updated in place), each layout
    passing its reads: query(q, b, h, a, row) -> beta q_a of a row group's lanes, key / value
    (k, b, h, j, a) -> k_j[a] / u_j[a], broadcast. scores: TR x JB scores of columns j0 + jj
    (keys kj + jj) into zs[slot], NEG_BIG from column ``live`` on, and their running maximum
    top; weigh: column j's scores become e^(z - m) (clamped), summed into wsum and, with
    observe, w (z - m) into ent; weighted_sum: part[t][cc] += sum_(j < jn) w_j u_(j_first + j)."""
    c, splat, _, exp_clamped = vector_helpers(real, L)
    f32 = real == ti.f32
    NEG_BIG = -3.0e38 if f32 else -1.0e300

    @ti.func
    def scores(q: ti.template(), k: ti.template(), zs: ti.template(), top: ti.template(), b, h, row,
               slot, j0, kj, live, r):
        z = [[splat(0) for _ in ti.static(range(JB))] for _ in ti.static(range(TR))]
        for a in range(r):
            qa = [query(q, b, h, a, row + t) for t in ti.static(range(TR))]
            for jj in ti.static(range(JB)):
                kv = key(k, b, h, kj + jj, a)
                for t in ti.static(range(TR)):
                    z[t][jj] += qa[t] * kv
        for jj in ti.static(range(JB)):
            alive = j0 + jj < live
            for t in ti.static(range(TR)):
                zt = ti.select(alive, z[t][jj], c(NEG_BIG))
                zs[slot, t, j0 + jj] = zt
                top[t] = ti.max(top[t], zt)

    @ti.func
    def weigh(zs: ti.template(), slot, j, m: ti.template(), wsum: ti.template(), ent: ti.template(),
              observe):
        for t in ti.static(range(TR)):
            zc = zs[slot, t, j] - m[t]
            if ti.static(f32):
                zc = ti.max(zc, c(CLAMP))
            w = exp_clamped(zc)
            zs[slot, t, j] = w
            wsum[t] += w
            if observe:  # loop-invariant: LLVM unswitches it
                ent[t] += w * zc

    @ti.func
    def weighted_sum(zs: ti.template(), slot, u: ti.template(), b, h, j_first, jn, a0, part: ti.template()):
        for j in range(jn):
            wt = [zs[slot, t, j] for t in ti.static(range(TR))]
            for cc in ti.static(range(AC)):
                uj = value(u, b, h, j_first + j, a0 + cc)
                for t in ti.static(range(TR)):
                    part[t][cc] += wt[t] * uj

    return scores, weigh, weighted_sum


def lane_log(real, L: int):
    """A ti.func log(v) lane by lane over an L-lane vector (libm per lane: Taichi has no
    vector log unscalarised)."""

    @ti.func
    def log(v):
        out = v
        for k in range(L):
            out[k] = ti.log(v[k])
        return out

    return log


# -- exponential rules: the online softmax ---------------------------------------------------------
@ti.func
def rebased_entropy_sum(ent, wsum, shift, scale):
    """sum_j e^(z_j - m)(z_j - m) re-based on a new row maximum m' = m - shift
    (scale = e^shift <= 1): every term gains e^(z_j - m) shift and is scaled."""
    return scale * (ent + shift * wsum)


def online_rebase(exp, clamp=None):
    """A ti.func rebase(m, m_new, wsum, ent, observe) -> (scale, wsum, ent): a row's running
    sums re-based from its maximum m onto a new one m_new >= m, scale = e^(m - m_new) <= 1
    (the entropy sum only with observe, a compile-time switch); the caller scales its value
    accumulator by the returned scale, in its own layout. ``exp`` is the layout's (scalar ti.exp
    or the lanes' ``exp_clamped``, whose argument ``clamp`` bounds below, as it does the
    entropy sum's shift)."""
    clamped = clamp is not None

    @ti.func
    def rebase(m, m_new, wsum, ent, observe: ti.template()):
        shift = m - m_new
        if ti.static(clamped):
            shift = clamp(shift)
        scale = exp(shift)
        ent_out = ent
        if ti.static(observe):
            ent_out = rebased_entropy_sum(ent, wsum, shift, scale)
        return scale, wsum * scale, ent_out

    return rebase


@ti.func
def row_entropy(log_wsum, ent, wsum):
    """-sum_j p_j log p_j of p_j = w_j / wsum, from log wsum and ent = sum_j w_j log w_j with
    the weights taken relative to the row's largest (so both terms are small where the
    entropy is: no cancellation)."""
    return log_wsum - ent / wsum


def row_finish(real, exponential: bool, guarded: bool = True, log=ti.log):
    """A ti.func finish(m, wsum, ent, wpos, top, pot) -> (entropy, energy) of a finished row:
    for the exponential rules the entropy ``row_entropy`` and the log of the row's energy sum,
    sum_j e^z_j = e^m wsum (0, 0 for a row without weight unless guarded=False: the
    register-tile passes, whose rows hold their maximum's weight 1); for kernel rules the
    entropy relative to the largest weight (``kernel_entropy``) and the potential's row sum
    ``pot``. Unguarded, the exponential finish is written over the layout's value type: a
    scalar row, or L rows in a vector's lanes with the lanes' ``log`` (``lane_log``; the
    wide pass)."""
    _, kernel_row_entropy = kernel_entropy(real)

    @ti.func
    def exponential_row(m, wsum, ent, wpos, top, pot):
        log_wsum = log(wsum)
        return row_entropy(log_wsum, ent, wsum), m + log_wsum

    @ti.func
    def finish(m, wsum, ent, wpos, top, pot):
        entropy = ti.cast(0, real)
        energy = pot
        if ti.static(exponential):
            if wsum > 0:
                entropy, energy = exponential_row(m, wsum, ent, wpos, top, pot)
        else:
            entropy = kernel_row_entropy(wsum, wpos, top, ent)
        return entropy, energy

    return exponential_row if exponential and not guarded else finish


def normalisation(real, softmax: bool, exponential: bool, guarded: bool = True):
    """A ti.func row_norm(wsum, m, count): the factor that turns a row's weighted sum of u into
    its pull g_i. softmax: 1 / wsum (0 for a row without weight); mean: 1 / count, the visible
    keys, times e^m for the exponential rules, whose weights are taken relative to the row's
    maximum m. guarded=False: the pass knows wsum >= 1 (an exponential rule's row holds its
    maximum's weight 1) and skips the test (the register-tile passes: the test changed LLVM's
    code for the division, and the last bits)."""

    @ti.func
    def row_norm(wsum, m, count):
        norm = ti.cast(0, real)
        if ti.static(softmax and not guarded):
            norm = ti.cast(1, real) / wsum
        elif ti.static(softmax):
            if wsum > 0:
                norm = ti.cast(1, real) / wsum
        elif ti.static(exponential):
            norm = ti.exp(m) / count
        else:
            norm = ti.cast(1, real) / count
        return norm

    return row_norm


def key_by_key(rule, real):
    """A ti.func add(z, i, j, n, m, wsum, ent, wpos, top, pot, observe) -> (w, rebased, scale, m,
    wsum, ent, wpos, top, pot): key j's score z taken into row i's running sums, one key at a
    time (the plain and GPU pair passes; the entropy and potential sums only with observe, a
    compile-time switch). Exponential rules: w = e^(z - m) relative to the running maximum m,
    re-based (``online_rebase``) where z exceeds it, and then the caller scales its value
    accumulator by ``scale`` (rebased); kernel rules: w = k(z) or k(z, i, j, n) (``rule_lift``),
    its entropy terms (``kernel_entropy``) and the potential's sum. The caller adds w u_j."""
    exponential = rule.exponential
    with_potential = rule.potential is not None and not exponential
    weight_fn, potential_fn = (None, None) if exponential else rule_lift(rule, real)
    add_weight, _ = kernel_entropy(real)
    rebase = online_rebase(ti.exp)

    @ti.func
    def add(z, i, j, n, m, wsum, ent, wpos, top, pot, observe: ti.template()):
        w = ti.cast(0, real)
        rebased = False
        scale = ti.cast(1, real)
        m_out, wsum_out, ent_out, wpos_out, top_out, pot_out = m, wsum, ent, wpos, top, pot
        if ti.static(exponential):
            if z > m:
                scale, wsum_out, ent_out = rebase(m, z, wsum, ent, observe)
                rebased = True
                m_out = z
            w = ti.exp(z - m_out)
            if ti.static(observe):
                ent_out += w * (z - m_out)
        else:
            w = weight_fn(z, i, j, n)
            if ti.static(observe):
                ent_out, wpos_out, top_out = add_weight(w, ent, wpos, top)
                if ti.static(with_potential):
                    pot_out += potential_fn(z)
        wsum_out += w
        return w, rebased, scale, m_out, wsum_out, ent_out, wpos_out, top_out, pot_out

    return add


# -- kernel rules: the rule lift and its entropy ----------------------------------------------------
def rule_lift(rule, real):
    """(weight, potential): ti.funcs weight(z, i, j, n) = k(z) or k(z, i, j, n) and
    potential(z) (0 where the rule has none), cast to ``real``; for a kernel rule (the
    exponential rules are written as shifted exponentials by the passes)."""
    positional = rule.positional
    kernel_fn = ti.func(rule.kernel)
    with_potential = rule.potential is not None
    potential_fn = ti.func(rule.potential) if with_potential else None

    @ti.func
    def weight(z, i, j, n):
        w = ti.cast(0, real)
        if ti.static(positional):
            w = ti.cast(kernel_fn(z, i, j, n), real)
        else:
            w = ti.cast(kernel_fn(z), real)
        return w

    @ti.func
    def potential(z):
        p = ti.cast(0, real)
        if ti.static(with_potential):
            p = ti.cast(potential_fn(z), real)
        return p

    return weight, potential


def kernel_entropy(real):
    """(add_weight, row_entropy_of_kernel) for a kernel rule's row in ``real``: the pass takes
    ent, wpos, top = add_weight(w, ent, wpos, top) for each weight w of the row (top: the
    largest so far, wpos: the positive weights' sum), so that every term of ent is taken
    relative to the row's largest weight."""

    @ti.func
    def entropy_rebase(ent, wpos, top, w):
        """ent = sum_j w_j log(w_j / top) when w > top becomes the largest: each term gains
        w_j log(top / w)."""
        out = ent
        if top > 0:
            out = ent + wpos * ti.log(top / w)
        return out

    @ti.func
    def add_weight(w, ent, wpos, top):
        """(ent, wpos, top) after the row's weight w: a positive w adds w log(w / top),
        re-basing the sum first where w becomes the largest."""
        ent_out, wpos_out, top_out = ent, wpos, top
        if w > 0:
            if w > top:
                ent_out = entropy_rebase(ent, wpos, top, w)
                top_out = w
            ent_out += w * ti.log(w / top_out)
            wpos_out += w
        return ent_out, wpos_out, top_out

    @ti.func
    def row_entropy_of_kernel(wsum, wpos, top, ent):
        """log(wsum / top) - ent / wsum, plus log(top) (wsum - wpos) / wsum where some weights
        are negative (none for ReLU-like rules); 0 for a row without weight."""
        entropy = ti.cast(0, real)
        if wsum > 0:
            if top > 0:
                entropy = row_entropy(ti.log(wsum / top), ent, wsum)
                if wpos != wsum:
                    entropy += ti.log(top) * (wsum - wpos) / wsum
            else:
                entropy = ti.log(wsum)
        return entropy

    return add_weight, row_entropy_of_kernel


# -- the retraction ----------------------------------------------------------------------------------
def retraction(real, d: int, lanes: int, zero, component, set_component, padded):
    """A ti.func retract(x, aux, b, i): token i of replica b back onto the unit sphere,
    x_i <- x_i / |x_i| (the step's last operation on the sphere; the stages leave it by
    O(dt^(p+1)) only, so the order is kept). Over one token in scalars (lanes = 0,
    ``kernels.retract``) or ``lanes`` tokens in the lanes of a vector (the fused kernel), whose
    layouts pass zero(), component(x, b, i, e), set_component(x, b, i, e, value) and
    padded(aux, i, sum of squares) (the lanes' layout sets its padding lanes' to 1 by its
    mask, ``aux``). The lanes' 1 / sqrt is taken here: returned from a function of the layout,
    LLVM compiled it to other last bits."""

    @ti.func
    def retract(x: ti.template(), aux: ti.template(), b, i):
        sq = zero()
        if ti.static(d <= UNROLL_MAX_D):
            for e in ti.static(range(d)):
                sq += component(x, b, i, e) * component(x, b, i, e)
        else:
            for e in range(d):
                sq += component(x, b, i, e) * component(x, b, i, e)
        sq = padded(aux, i, sq)
        inv = zero()
        if ti.static(lanes):
            for k in range(lanes):
                inv[k] = ti.cast(1, real) / ti.sqrt(sq[k])
        else:
            inv = ti.cast(1, real) / ti.sqrt(sq)
        if ti.static(d <= UNROLL_MAX_D):
            for e in ti.static(range(d)):
                set_component(x, b, i, e, component(x, b, i, e) * inv)
        else:
            for e in range(d):
                set_component(x, b, i, e, component(x, b, i, e) * inv)

    return retract


# -- the per-token observables ---------------------------------------------------------------------
def token_observables(H: int, d: int, sphere: bool, zero, absolute, head_output, point, radial_shadow,
                      row_stat, store):
    """A ti.func observe(f, y, radial, row, tok, b, i, n, v_radial, kinetic) writing the
    per-token observables of token i of replica b at the point y (``layout``'s SLOT_*):
    kinetic |xdot_i|^2 (summed by the caller as it writes xdot, with v_radial = sum_h a^h_i),
    and per head h: a^h = <f^h, x> (radial shadow), T = |P f^h|^2, C = sum_{h' != h} <f^h, f^h'>,
    R = a^h sum_{h' != h} a^h' and |a^h| sum_{h' != h} |a^h'| (zero in flat space), the row's
    entropy and energy.

    Written once over a value type: one token in scalars (``kernels.combine``) or L tokens in
    the lanes of a vector (the fused kernel), whose layouts pass their reads and writes:
    zero() and absolute(v) of the value type, head_output(f, b, h, i, e), point(y, b, i, e),
    radial_shadow(radial, b, h, i) (a^h as the velocity's finish computed it: recomputed, its
    sum was reassociated differently by LLVM's fast math), row_stat(row, b, h, i, k) (k = 0 the
    row entropy, 1 the row energy) and store(tok, b, i, n, slot, value)."""

    @ti.func
    def tok_slot(h, s):  # layout.tok_slot
        return 1 + h * SLOTS_PER_HEAD + s

    @ti.func
    def tangent_term(f: ti.template(), y: ti.template(), ah, b, h, i, e):  # |P f^h|^2's component e
        pe = head_output(f, b, h, i, e)
        if ti.static(sphere):
            pe = pe - ah * point(y, b, i, e)
        return pe * pe

    @ti.func
    def observe(f: ti.template(), y: ti.template(), radial: ti.template(), row: ti.template(),
                tok: ti.template(), b, i, n, v_radial, kinetic):
        abs_sum = zero()
        for h in range(H):
            abs_sum += absolute(radial_shadow(radial, b, h, i))
        store(tok, b, i, n, SLOT_KINETIC, kinetic)
        for h in range(H):
            ah = radial_shadow(radial, b, h, i)
            tangent = zero()
            if ti.static(d <= UNROLL_MAX_D):
                for e in ti.static(range(d)):
                    tangent += tangent_term(f, y, ah, b, h, i, e)
            else:
                for e in range(d):
                    tangent += tangent_term(f, y, ah, b, h, i, e)
            cross = zero()
            for h2 in range(H):
                if h2 != h:
                    gram = zero()
                    if ti.static(d <= UNROLL_MAX_D):
                        for e in ti.static(range(d)):
                            gram += head_output(f, b, h, i, e) * head_output(f, b, h2, i, e)
                    else:
                        for e in range(d):
                            gram += head_output(f, b, h, i, e) * head_output(f, b, h2, i, e)
                    cross += gram
            radial_pair = zero()
            radial_abs_pair = zero()
            if ti.static(sphere):
                radial_pair = ah * (v_radial - ah)
                radial_abs_pair = absolute(ah) * (abs_sum - absolute(ah))
            store(tok, b, i, n, tok_slot(h, SLOT_TANGENT), tangent)
            store(tok, b, i, n, tok_slot(h, SLOT_CROSS), cross)
            store(tok, b, i, n, tok_slot(h, SLOT_RADIAL_PAIR), radial_pair)
            store(tok, b, i, n, tok_slot(h, SLOT_RADIAL_ABS_PAIR), radial_abs_pair)
            store(tok, b, i, n, tok_slot(h, SLOT_RADIAL), ah)
            store(tok, b, i, n, tok_slot(h, SLOT_ENTROPY), row_stat(row, b, h, i, 0))
            store(tok, b, i, n, tok_slot(h, SLOT_ROW_ENERGY), row_stat(row, b, h, i, 1))

    return observe


# -- the sum of directions ------------------------------------------------------------------------
@ti.func
def token_major(x: ti.template(), b, i, e):
    """Component e of token i of replica b in the (R, n, d) layout."""
    return x[b, i, e]


def direction_sum(acc, d: int, point=token_major):
    """The sum over tokens of x_i / |x_i| (an observable beside the columns; a token at the
    origin adds nothing) in type ``acc``, ``point(x, b, i, e)`` reading the layout. Returns the
    ti.funcs norm(x, b, i) -> |x_i| (squares summed in component order) and, for
    d <= UNROLL_MAX_D, total(x, b, n) -> the d-vector summed over tokens 0..n-1 in order
    (above it a pass adds x_i / norm in place, in the same order)."""

    @ti.func
    def norm(x: ti.template(), b, i):
        norm2 = ti.cast(0, acc)
        if ti.static(d <= UNROLL_MAX_D):
            for e in ti.static(range(d)):
                v = ti.cast(point(x, b, i, e), acc)
                norm2 += v * v
        else:
            for e in range(d):
                v = ti.cast(point(x, b, i, e), acc)
                norm2 += v * v
        return ti.sqrt(norm2)

    @ti.func
    def total(x: ti.template(), b, n):
        out = ti.Vector.zero(acc, d)
        for i in range(n):
            length = norm(x, b, i)
            if length > 0:
                for e in ti.static(range(d)):
                    out[e] += ti.cast(point(x, b, i, e), acc) / length
        return out

    return norm, total


# -- the column reduction --------------------------------------------------------------------------
def column_reduction(acc, value, with_lse, partials: bool = False):
    """A ti.func chunk(src, aux, b, col, first, last) -> the vector (sum, min, max, sum_i
    e^(v_i - max)) of the values v_i = value(src, aux, b, i, col) of tokens first..last-1, in
    type ``acc``, in item order; the exponentials (shifted by the maximum, so in (0, 1]) only
    where with_lse(col), else 0. The CPU reduces all n tokens as one chunk (``reduce_slot``),
    a GPU chunks of tokens in parallel and then the chunks (``kernels_gpu``): with partials,
    item i is a chunk's own (sum, min, max, exponential sum) vector, and the chunks' sums add,
    their extremes meet and each exponential sum is re-based onto the overall maximum."""
    if partials:
        @ti.func
        def extent(v):  # (sum, min, max) of an item
            return v[0], v[1], v[2]

        @ti.func
        def shifted(v, hi):  # an item's sum of e^(v - hi)
            return v[3] * ti.exp(v[2] - hi)
    else:
        @ti.func
        def extent(v):
            return v, v, v

        @ti.func
        def shifted(v, hi):
            return ti.exp(v - hi)

    @ti.func
    def chunk(src: ti.template(), aux: ti.template(), b, col, first, last):
        total = ti.cast(0, acc)
        _, lo, hi = extent(value(src, aux, b, first, col))
        for i in range(first, last):
            v_sum, v_lo, v_hi = extent(value(src, aux, b, i, col))
            total += v_sum
            lo = ti.min(lo, v_lo)
            hi = ti.max(hi, v_hi)
        lse = ti.cast(0, acc)
        if with_lse(col):
            for i in range(first, last):
                lse += shifted(value(src, aux, b, i, col), hi)
        return ti.Vector([total, lo, hi, lse])

    return chunk


@ti.func
def store_column(out: ti.template(), slot, b, col, r):
    """out[slot, b, col] = (sum, min, max, log-sum-exp) from a reduction's (sum, min, max,
    sum e^(v - max))."""
    out[slot, b, col, 0] = r[0]
    out[slot, b, col, 1] = r[1]
    out[slot, b, col, 2] = r[2]
    out[slot, b, col, 3] = r[2] + ti.log(r[3])


@ti.func
def is_row_energy_slot(s):
    """Slot s holds a head's row energy (the only slots whose log-sum-exp is read)."""
    return s >= 1 and (s - 1) % SLOTS_PER_HEAD == SLOT_ROW_ENERGY


@ti.func
def _slot_value(tok: ti.template(), unused: ti.template(), b, i, s):
    return ti.cast(tok[b, i, s], ti.f64)


_reduce_tokens = column_reduction(ti.f64, _slot_value, is_row_energy_slot)


@ti.func
def reduce_slot(tok: ti.template(), b, s, n, out: ti.template(), slot):
    """out[slot, b, s] = (sum, min, max, log-sum-exp) of slot s of replica b's n tokens, in
    float64 in token order (the log-sum-exp for the row energies only: it skips n exps
    elsewhere)."""
    store_column(out, slot, b, s, _reduce_tokens(tok, tok, b, s, 0, n))
