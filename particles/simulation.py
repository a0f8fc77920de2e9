"""The Simulation: state on the device, heads, rule, integrator, and batched observables."""
from __future__ import annotations

import functools
from typing import Sequence

import numpy as np
import taichi as ti

from . import adaptive, lie
from . import attention as attention_mod
from . import backend, kernels, kernels_fused, kernels_gpu, kernels_wide, paths  # each registers its implementations
from . import display, head_terms
from . import normalisation as normalisation_mod
from . import sinkhorn as _sinkhorn_pass  # noqa: F401  (registers the Sinkhorn pass)
from .attention import Attention
from .clock import step_time
from .drive import AT_END, Every, Rows, drive
from .heads import Head
from .kernels_wide import WideHeads
from .layout import Operands
from .integrators import EULER, ExplicitRK, split as split_integrator
from .observables import assemble_rows
from .result import Result, progress_bar, token_keeper
from .rule_check import check_rule_compiles
from .rules import Rule, get_rule
from .schedule import Layer, Schedule
from . import validation
from .errors import BlowUpError, ParticlesTypeError, ParticlesUserError
from .vocabulary import ARCHES, DTYPES, GEOMETRIES


def _as_heads(heads, d: int) -> list[Head]:
    out = []
    for idx, h in enumerate(heads):
        if isinstance(h, Head):
            head = h
        elif isinstance(h, tuple) and len(h) == 2:
            head = Head.from_matrices(h[0], h[1])
        else:
            head = Head.from_matrices(h)
        if head.dim != d:
            raise ParticlesUserError(f"head {idx} acts on dimension {head.dim}, tokens have d = {d}")
        out.append(head)
    if not out:
        raise ParticlesUserError("at least one head is needed")
    return out


def _count_heads(heads) -> int:
    """The number of heads (of the widest layer of a Schedule), for the memory estimate."""
    if isinstance(heads, Schedule):
        return max((_count_heads(layer.heads) for layer in heads.layers), default=1)
    if isinstance(heads, (str, bytes)) or not hasattr(heads, "__len__"):
        raise ParticlesTypeError(f"heads must be a sequence of particles.Head, (M, V) pairs or "
                                 f"score matrices, or a particles.Schedule, got {type(heads).__name__}")
    if len(heads) == 0:
        raise ParticlesUserError("heads must hold at least one head, got an empty sequence")
    return len(heads)


def _check_layer_in_dtype(where: str, heads, attention, dtype: str) -> None:
    """Every head's factors and its own beta and ALiBi slope stay finite in the run's dtype."""
    for i, head in enumerate(heads):
        for part, value in (("query", head.query), ("key", head.key),
                            ("value_out", head.value_out), ("value_in", head.value_in)):
            if validation.factor_problem(value, dtype):
                validation.in_dtype(f"{where}heads[{i}].{part}", value, dtype,
                                    f"use dtype 'float64' or strengths within {dtype}'s range")
    for i, att in enumerate(attention):
        if att.beta is not None:
            validation.in_dtype(f"{where}attention[{i}].beta", att.beta, dtype)
        validation.in_dtype(f"{where}attention[{i}].alibi", att.alibi, dtype)


def _pack(heads: list[Head], d: int, r: int, rv: int):
    """Stack head factors, zero-padded to ranks r, rv (zero rows contribute nothing)."""
    H = len(heads)
    Q = np.zeros((H, r, d)); K = np.zeros((H, r, d))
    W = np.zeros((H, rv, d)); O = np.zeros((H, d, rv))
    for i, h in enumerate(heads):
        Q[i, :h.score_rank] = h.query
        K[i, :h.score_rank] = h.key
        W[i, :h.value_rank] = h.value_in
        O[i, :, :h.value_rank] = h.value_out
    return Q, K, W, O


class _Operations:
    """What an integrator may touch: the state arrays and four operations (see integrators.py).

    Private to the engine, so that the public Simulation is not the integrator protocol.
    """

    __slots__ = ("x", "slopes", "stage_x", "stage_acc", "evaluate", "after_first_stage", "axpy",
                 "accumulate", "retract")

    def __init__(self, sim: "Simulation"):
        kern = sim._kern
        self.x, self.slopes, self.stage_x, self.stage_acc = sim._x, sim._slopes, sim._stage_x, sim._stage_acc
        self.evaluate, self.after_first_stage = sim._evaluate, sim._after_first_stage
        self.axpy, self.accumulate, self.retract = kern.axpy, kern.accumulate, kern.retract


def _silencing_the_build_notice_on_error(init):
    """A construction that raises stops its build notice (backend.BuildNotice.abandon): the
    notice is made midway through __init__ and finished by _warm_up, its last call."""
    @functools.wraps(init)
    def construct(self, *args, **kwargs):
        try:
            init(self, *args, **kwargs)
        except BaseException:
            notice = self.__dict__.get("_notice")
            if notice is not None:
                notice.abandon()
            raise
    return construct


class Simulation:
    """n tokens (or R replicas of them) flowing under H attention heads.

    Build once (allocates device arrays and compiles every kernel), then ``advance``.
    Each step: velocity from all heads (rule -> weights -> head outputs -> tangent
    projection) -> integrator stages -> retraction onto the sphere -> step += 1.
    Observables, when asked for, are those of the state at the start of the step and
    come from the first stage's evaluation, so they cost no extra pair pass.

    tokens: (n, d) or (R, n, d) for an ensemble of R replicas (same heads).
    heads: Head objects, (M, V) pairs, or score matrices M (then V = M).
    beta: one inverse temperature, or one per replica.
    attention: per-head masks, positional biases, rules and betas (``particles.Attention``,
    one for every head or one per head); heads may also be a ``particles.Schedule`` of
    layers, each with its own heads and attention. On the CPU, exp/softmax heads with masks,
    ALiBi or own betas run the tiled path over visible key blocks; layers mixing rules, ReLU
    and user rules run the plain kernels (neither the fused nor the wide path carries
    positions); on a GPU the tiled pair pass carries all of it, skipping key tiles no row of
    a block sees.
    path: 'fused' (k whole steps per kernel launch: small n, CPU), 'tiled' (a launch per
    kernel, parallel within a replica: large n, any arch), 'plain' (the straightforward
    kernels, for checking) or 'auto': the fastest path that declares everything this
    simulation uses (``particles.paths``); an explicit path that cannot serve it is refused,
    naming what it lacks. ``sim.path`` says which runs. All match the float64 reference to
    the dtype's tolerance; they need not agree bitwise.
    integrator: 'euler', 'rk4' or a ``particles.ExplicitRK`` tableau of your own (a fixed step
    dt); 'dopri5', 'bs32' or ``particles.Adaptive(method, rtol=, atol=, dt_min=, dt_max=)`` for
    adaptive steps with error control (``particles.adaptive``), each replica its own: dt is
    then the grid on which rows, frames and layer switches land, and ``sim.stepper.stats()``
    counts accepted and rejected steps.
    retraction: 'normalise' (each step ends by renormalising the tokens) or 'exp' (the exact
    step on the sphere, ``particles.lie``: tokens rotate in the plane of x and xdot; with
    'euler' the Lie-Euler step, with 'heun' its commutator-free order-2 form).
    """

    @_silencing_the_build_notice_on_error
    def __init__(self, tokens, heads: Sequence, beta=1.0, rule: str | Rule = "exp",
                 geometry: str = "sphere", dt: float = 0.01, integrator: str | ExplicitRK = "rk4",
                 dtype: str = "float32", arch: str = "cpu", entropy_rate: bool = False,
                 batch: int = 64, path: str = "auto", attention=None,
                 normalisation: str = "post", ngpt_alpha: float = 1.0, retraction: str = "normalise"):
        self._blown_up = None  # the BlowUpError message while the state is not finite
        geometry = validation.choice("geometry", geometry, GEOMETRIES)
        self.normalisation, self.ngpt_alpha = normalisation_mod.check(normalisation, geometry, ngpt_alpha)
        dtype = validation.choice("dtype", dtype, DTYPES)
        method, self.adaptive = split_integrator(integrator)
        self.retraction = validation.choice("retraction", retraction, ("normalise", "exp"))
        self.stepper_kind = "adaptive" if self.adaptive is not None else "exp" if self.retraction == "exp" else None
        if self.retraction == "exp" and self.adaptive is not None:
            raise ParticlesUserError("retraction 'exp' steps with 'euler' or 'heun' at a fixed dt; "
                                     "adaptive steps renormalise (retraction 'normalise')")
        path = validation.choice("path", path, ("auto", "fused", "tiled", "plain"))
        validation.choice("arch", arch, ARCHES)
        batch = validation.integer("batch", batch, 1)
        R, n, d, self.ensemble = validation.tokens_shape(tokens)
        n_heads = _count_heads(heads)
        validation.memory(validation.estimate_bytes(n, d, n_heads, R, dtype,
                                                    kernels.n_tok_slots(n_heads), bool(entropy_rate)),
                          f"tokens of shape {np.shape(tokens)} ({n_heads} heads, {dtype})")
        x, _ = validation.tokens(tokens, dtype, geometry=geometry)
        dt = validation.positive("dt", dt, dtype)
        if geometry == "sphere" and self.normalisation not in normalisation_mod.RADIAL:
            x = x / np.linalg.norm(x, axis=-1)[..., None]
        betas = validation.betas(beta, R, dtype)
        if rule is not None and not isinstance(rule, (str, Rule)):
            raise ParticlesTypeError(f"rule must be a rule name or a particles.Rule, got "
                                     f"{type(rule).__name__}")

        self.rule = rule if isinstance(rule, Rule) else get_rule(rule)
        if isinstance(heads, Schedule):
            if attention is not None:
                raise ParticlesUserError("with a Schedule, give each Layer its own attention")
            schedule = heads
        else:
            schedule = Schedule((Layer(heads, None, attention),), (0,))
        self.schedule = schedule
        self.scheduled = len(schedule.layers) > 1
        layers = []  # (heads, attention) per layer
        for idx, layer in enumerate(schedule.layers):
            layer_rule = self.rule if layer.rule is None else (
                layer.rule if isinstance(layer.rule, Rule) else get_rule(layer.rule))
            layer_heads = _as_heads(layer.heads, d)
            layers.append((layer_heads, attention_mod.resolve(layer.attention, len(layer_heads),
                                                              layer_rule)))
            if len(layer_heads) != len(layers[0][0]):
                raise ParticlesUserError(f"layer {idx} has {len(layer_heads)} heads, layer 0 has "
                                         f"{len(layers[0][0])}: every layer needs the same number of heads")
        self.layer_attention = tuple(att for _, att in layers)
        self.layer_heads = tuple(tuple(hs) for hs, _ in layers)   # per layer, as Heads
        for idx, (hs, att) in enumerate(layers):
            _check_layer_in_dtype(f"layer {idx} " if self.scheduled else "", hs, att, dtype)
        self.geometry, self.dtype, self.dt = geometry, dtype, float(dt)
        self.integrator = method
        self.n_replicas, self.n, self.d, self.n_heads = R, n, d, len(layers[0][0])
        self.betas = betas
        # plain: one layer of full attention, every head with the simulation's rule and beta
        plain_head = Attention(rule=self.rule)
        self.plain = not self.scheduled and all(a == plain_head for a in self.layer_attention[0])
        layer_terms = [head_terms.has_terms(hs, att) for hs, att in layers]  # biases, rotary
        self.entropy_rate_enabled = bool(entropy_rate) and self.rule.exponential
        if self.entropy_rate_enabled and (not self.plain or any(layer_terms)):
            raise ParticlesUserError("the entropy rate (Theorem 27) is computed for one layer of unmasked, "
                                     "unbiased heads with the run's rule and beta; switch it off for masks, "
                                     "biases, per-head rules or betas and schedules")
        if self.entropy_rate_enabled and self.normalisation != "post":
            raise ParticlesUserError(f"the entropy rate (Theorem 27) is the sphere's (normalisation "
                                     f"'post'); switch it off for normalisation {self.normalisation!r}")
        self.step_count = 0
        self.arch = backend.init(arch)
        validation.pair_guard(n, n_heads, R, self.arch, d=d)   # before anything is compiled or run
        backend.check_dtype(dtype)
        for checked in {a.rule for att in self.layer_attention for a in att}:
            check_rule_compiles(checked, dtype, n)

        real = ti.f32 if dtype == "float32" else ti.f64
        self._np_real = np.float32 if dtype == "float32" else np.float64
        H = self.n_heads
        r = max(h.score_rank for hs, _ in layers for h in hs)
        rv = max(h.value_rank for hs, _ in layers for h in hs)
        self.score_rank, self.value_rank = r, rv

        def arr(*shape, dt=real):
            return ti.ndarray(dt, shape=shape)

        self._beta = arr(R)
        self._beta.from_numpy(betas.astype(self._np_real))
        self._x = arr(R, n, d)
        self._x.from_numpy(x.astype(self._np_real))
        self._xdot, self._stage_x, self._stage_acc = arr(R, n, d), arr(R, n, d), arr(R, n, d)
        rules_used = {a.rule for att in self.layer_attention for a in att}
        features = [_features(att) for att in self.layer_attention]
        pass_needs = tuple(
            paths.PassNeeds(paths.rule_kind(rule), positions=f.banded or f.biased or f.head_beta,
                            mixed_rules=f.filtered, entropy_rate=self.entropy_rate_enabled,
                            arch=self.arch, n=n, head_terms=terms)
            for att, f, terms in zip(self.layer_attention, features, layer_terms)
            for rule in dict.fromkeys(a.rule for a in att))
        self.plan = paths.choose(path, paths.Needs(
            rules=frozenset(paths.rule_kind(u) for u in rules_used), positions=not self.plain and not self.scheduled,
            layers=self.scheduled, entropy_rate=self.entropy_rate_enabled, arch=self.arch,
            n=n, d=d, H=H, r=r, rv=rv, dtype=dtype, passes=pass_needs, head_terms=any(layer_terms),
            normalisation=self.normalisation,
            adaptive=self.adaptive is not None or self.retraction == "exp"))
        self.path = self.plan.path
        self._notice = backend.BuildNotice(_build_sizes(self, r, rv), 2 if self.plan.steps else 2 + 2 * len(layers))
        self._notice.stage("the pair passes' kernels")
        implementations = iter(self.plan.implementations * (not self.plan.steps))
        self._layers = [_LayerState(hs, att, f, geometry, dtype, d, r, rv, R, n, self.entropy_rate_enabled,
                                    arr, self._np_real, implementations)
                        for (hs, att), f in zip(layers, features)]
        self._kern = self._layers[0].passes[0][0]  # combine, reduce, integrator ops: rule-free
        self._reduce = paths.factory(self.plan.reduction)(self._kern)  # the observables' column sums

        # per-kernel arrays at full size only where the plan's implementations use them (the
        # tiled and wide passes pack their own); others get a one-token stand-in of the same rank
        def operand(name, *shape):
            return arr(*shape) if name in self.plan.operands else arr(*shape[:2], 1, shape[3])
        self._q, self._k = operand("q", R, H, n, r), operand("k", R, H, n, r)
        self._u, self._g = operand("u", R, H, n, rv), operand("g", R, H, n, rv)
        self._f, self._row = operand("f", R, H, n, d), operand("row", R, H, n, 4)
        self._tok = arr(R, n, kernels.n_tok_slots(H))
        if self.entropy_rate_enabled:
            self._qd, self._kd, self._ud = arr(R, H, n, r), arr(R, H, n, r), arr(R, H, n, rv)
        self._batch = int(batch)
        red_dt = backend.reduction_dtype()  # float32 where the device has no float64
        if self.arch == "cpu":  # host memory the kernels write in place: a flush launches no copy
            self._red = np.zeros((self._batch, R, kernels.n_tok_slots(H), 4))   # (~0.3-1 ms each)
            self._sumx = np.zeros((self._batch, R, d, 1))
        else:
            self._red = arr(self._batch, R, kernels.n_tok_slots(H), 4, dt=red_dt)
            self._sumx = arr(self._batch, R, d, 1, dt=red_dt)
        self._pending: list[tuple[int, int]] = []   # (step, slot) of rows not yet copied
        self._rows: list[dict] = []
        for st in self._layers:
            st.operands = Operands(x=self._x, xdot=self._xdot, beta=self._beta, Q=st.Q, K=st.K, W=st.W,
                                   O=st.O, hreal=st.hreal, q=self._q, k=self._k, u=self._u, g=self._g,
                                   f=self._f, row=self._row, tok=self._tok, red=self._red, sumx=self._sumx)
        self.layer = -1
        self._use_layer(0)
        self._fused = None
        if self.plan.steps:
            self._fused = paths.factory(self.plan.implementations[0].name)(   # adaptive and exp
                self.rule, geometry, dtype, d, H, r, rv,                      # steps evaluate only
                self.integrator if self.stepper_kind is None else EULER, R, n)
        # the integrator's slope buffers (integrators.ExplicitRK.slope_slots), xdot the first;
        # the fused kernel keeps its own
        self._slopes = [self._xdot] + [arr(R, n, d) for _ in range(
            0 if self._fused is not None or self.adaptive else self.integrator.slope_buffers - 1)]
        self._placement = None if self.normalisation == "post" else normalisation_mod.Placement(
            self.normalisation, self.ngpt_alpha, R, n, d, dtype, self._batch, arr)
        self._ops = _Operations(self)
        if self._placement is not None:
            self._ops.retract = self._placement.retract(self._kern)
        # adaptive stepping (particles.adaptive): None at a fixed step
        self.stepper = (adaptive.Stepper(self, self.adaptive) if self.adaptive is not None
                        else lie.LieStepper(self, method) if self.retraction == "exp" else None)
        self._warm_up()

    # -- what the integrators' operations object calls --------------------------------------
    def _evaluate(self, x, xdot, observe: bool) -> None:
        if self._placement is not None:  # a LayerNorm placement: transforms around the pass
            return self._placement.evaluate(x, xdot, observe, self._evaluate_at, self._f, self._tok)
        self._evaluate_at(x, xdot, observe)

    def _evaluate_at(self, x, xdot, observe: bool) -> None:
        kern = self._kern
        for _, head_pass, hint in self._passes:  # one pass per distinct rule of the layer
            head_pass(x, self._operands, hint, observe)
        kern.combine(x, self._f, xdot, self._row, self._tok, observe,
                     x.shape[0] * x.shape[1] >= kernels.COMBINE_PARALLEL_TOKENS)

    def _use_layer(self, index: int) -> None:
        """Point the operations at layer ``index``'s heads (a no-op when already there)."""
        if index == self.layer:
            return
        st = self._layers[index]
        self.layer = index
        self.heads, self.attention = st.heads, st.attention
        self._Q, self._K, self._W, self._O = st.Q, st.K, st.W, st.O
        self._hreal, self._passes = st.hreal, st.passes
        self._operands = st.operands
        self._heads = st.passes[0][1]

    def _after_first_stage(self, observe: bool) -> None:
        if not observe:
            return
        kern = self._kern
        if self.entropy_rate_enabled:
            kern.project(self._xdot, self._Q, self._K, self._W, self._qd, self._kd, self._ud)
            kern.entropy_rate(self._q, self._k, self._qd, self._kd, self._beta, self._row, self._tok)
        slot = len(self._pending)
        self._reduce(self._tok, self._x, self._red, self._sumx, slot)
        if self._placement is not None:
            self._placement.observe(self._x, slot)
        self._pending.append((self.step_count, slot))
        if len(self._pending) == self._batch:
            self._flush()

    # -- public API -------------------------------------------------------------------------
    def __repr__(self) -> str:
        return display.text("Simulation", display.simulation_fields(self))

    def _repr_html_(self) -> str:
        return display.html_table("Simulation", display.simulation_fields(self))

    @property
    def time(self) -> float:
        return step_time(self.step_count, self.dt)

    @property
    def implementation(self) -> str:
        """The code that runs (``paths.Plan``): 'fused', or the pair passes' implementations
        ('wide', 'fast', 'gpu', 'plain'; joined by '+' where layers or rules differ)."""
        return self.plan.implementation

    @property
    def tuning(self) -> str:
        """The speed choices measured for this machine that this simulation uses (see
        ``particles.tuning``), e.g. "wide 16x3x6 (cached)"; "-" where none applies."""
        choices = dict.fromkeys(hp.choice.describe() for st in self._layers for _, hp, _ in st.passes
                                if isinstance(hp, WideHeads))
        return ", ".join(choices) or "-"

    @property
    def tokens(self) -> np.ndarray:
        """Current tokens as float64 NumPy, (n, d) or (R, n, d) for an ensemble."""
        x = self._x.to_numpy().astype(np.float64)
        return x if self.ensemble else x[0]

    def native_tokens(self) -> np.ndarray:
        """Current tokens in the simulation's own dtype, always (R, n, d): exact for saving."""
        return self._x.to_numpy()

    def set_tokens(self, tokens, step: int | None = None) -> None:
        """Replace the state (e.g. from a checkpoint); exact for arrays of this dtype."""
        want = (self.n_replicas, self.n, self.d)
        shape = validation.tokens_shape(tokens)[:3]
        if shape != want:
            raise ParticlesUserError(f"tokens must have shape {want}"
                                     f"{f' or {want[1:]}' if want[0] == 1 else ''}, "
                                     f"got shape {np.shape(tokens)}")
        validation.tokens(tokens, self.dtype, geometry=self.geometry)
        if step is not None:
            step = validation.step_count("step", step)
        x = np.asarray(tokens)
        x = x if x.ndim == 3 else x[None]
        self._x.from_numpy(np.ascontiguousarray(x, dtype=self._np_real))
        self._blown_up = None
        if self.stepper is not None:
            self.stepper.forget()
        if step is not None:
            self.step_count = step
            self._use_layer(self.schedule.layer_at(self.step_count))

    def set_state(self, tokens, step: int | None = None) -> None:
        """Replace the state (and optionally the step count); the same as ``set_tokens``."""
        self.set_tokens(tokens, step=step)

    def set_beta(self, beta) -> None:
        """New inverse temperature(s): one number, or one per replica. Compiled kernels are kept."""
        b = validation.betas(beta, self.n_replicas, self.dtype)
        self._beta.from_numpy(b.astype(self._np_real))
        self.betas = b
        if self.stepper is not None:
            self.stepper.forget()

    def run(self, steps: int, every: int = 1, trajectory_every: int = 0, progress: bool = False):
        """Advance ``steps`` steps, observing every ``every``-th state and the final one.
        ``trajectory_every=k`` also keeps the tokens every k steps and at the end, in memory:
        ``result.trajectory`` (a ``particles.Trajectory``; None when 0). ``progress=True``
        shows a progress bar (tqdm).

        Returns a ``particles.Result``: NumPy arrays per log column (``result["eps"]``,
        ``result.columns``; ``.to_pandas()`` when pandas is installed), one entry per observed
        state (and replica, for an ensemble), and the final tokens. The same drive loop as
        ``particles run`` (``particles.drive``), so the numbers are the run's, bitwise.
        """
        steps = validation.step_count("steps", steps)
        every = validation.step_count("every", every, 1)
        self._refuse_if_blown_up()
        self.take_rows()
        rows = Rows(Every(every) | AT_END)
        keep = None
        meta = {"n": self.n, "d": self.d, "n_heads": self.n_heads, "rule": self.rule.name,
                "beta": self.betas.tolist(), "geometry": self.geometry, "dt": self.dt,
                "normalisation": self.normalisation}
        if trajectory_every:
            keep = token_keeper(validation.step_count("trajectory_every", trajectory_every, 1), self.ensemble, meta)
        bar = [progress_bar(steps)] if progress else []
        drive(self, [rows] + ([keep] if keep else []) + bar, self.step_count + steps)
        result = Result.from_rows(rows.rows, final_tokens=self.tokens, meta=meta)
        if keep is not None:
            result = Result(result.data, result.final_tokens, keep.trajectory(), meta)
        return result

    def velocity(self) -> np.ndarray:
        """xdot at the current state, float64 NumPy of the tokens' shape."""
        self._use_layer(self.schedule.layer_at(self.step_count))
        if self._fused is not None:
            self._fused(self._operands, self.dt, self.step_count, 0, 0, False, 0)
        else:
            self._evaluate(self._x, self._xdot, False)
        if self.stepper is not None:
            self.stepper.forget(keep_row=True)
        v = self._xdot.to_numpy().astype(np.float64)
        return v if self.ensemble else v[0]

    def advance(self, steps: int = 1, observe_every: int = 0, *, check_finite: bool = True) -> None:
        """Advance ``steps`` steps; with observe_every = k, record the observables of every
        state whose step count is a multiple of k (before stepping from it). A state that is
        no longer finite after them (a rule returning NaN, too large a step) raises
        BlowUpError, naming the step and token; check_finite=False leaves that check (one
        kernel launch per call) to the caller, e.g. the drive loop, which checks at its own
        cadence and keeps the rows observed before the blow-up."""
        self._advance(steps, observe_every)
        if check_finite:
            self.check_finite()

    def _advance(self, steps: int, observe_every: int) -> None:
        steps = validation.step_count("steps", steps)
        observe_every = validation.step_count("observe_every", observe_every)
        self._refuse_if_blown_up()
        if self.stepper is not None:
            return self.stepper.advance(int(steps), int(observe_every))
        if self._fused is not None:
            return self._advance_fused(int(steps), int(observe_every))
        integ, dt = self.integrator, self.dt
        for _ in range(int(steps)):
            if self.scheduled:
                self._use_layer(self.schedule.layer_at(self.step_count))
            observe = observe_every > 0 and self.step_count % observe_every == 0
            integ.step(self._ops, dt, observe)
            self.step_count += 1

    def observe(self) -> None:
        """Record the observables of the current state without stepping."""
        self._use_layer(self.schedule.layer_at(self.step_count))
        if self._fused is not None:
            self._fused(self._operands, self.dt, self.step_count, 0, 0, True, len(self._pending))
            self._logged_fused(self.step_count, 1, 1)
        else:
            self._evaluate(self._x, self._xdot, True)
            self._after_first_stage(True)
        if self.stepper is not None:   # the step from here reuses this evaluation and its row
            self.stepper.observed()

    def take_rows(self) -> list[dict]:
        """The recorded observable rows so far (oldest first), and forget them."""
        self._flush()
        rows, self._rows = self._rows, []
        return rows

    def per_token(self) -> dict[str, np.ndarray]:
        """Per-token arrays of the last observed evaluation: radial_h{h} (a^h_i), entropy_h{h}."""
        tok = self._tok.to_numpy().astype(np.float64)
        out = {}
        for h in range(self.n_heads):
            for name, s in (("radial", kernels.SLOT_RADIAL), ("entropy", kernels.SLOT_ENTROPY)):
                a = tok[:, :, kernels.tok_slot(h, s)]
                out[f"{name}_h{h}"] = a if self.ensemble else a[0]
        return out

    def first_bad_token(self) -> tuple[int, int] | None:
        """(replica, token) of the first token with a NaN or Inf component, or None."""
        idx = int(self._kern.finite_check(self._x))
        if idx < 0:
            return None
        x = self._x.to_numpy()
        bad = np.argwhere(~np.isfinite(x).all(axis=-1))[0]
        return int(bad[0]), int(bad[1])

    def check_finite(self) -> None:
        """Raise BlowUpError naming the step, the first bad token and the likely cause."""
        bad = self.first_bad_token()
        if bad is None:
            return
        b, i = bad
        values = self._x.to_numpy()[b, i]
        where = f"replica {b}, " if self.ensemble else ""
        self._blown_up = f"blow-up at step {self.step_count}: {where}token {i} is not finite"
        raise BlowUpError(f"{self._blown_up} (values {np.array2string(values, precision=4, threshold=8)}). "
                          f"Likely cause: {self._likely_cause(b)}.", self.step_count, b, i)

    def velocity_blow_up(self, row: dict) -> BlowUpError:
        """The error for an observed state whose velocity is not finite (its row is all NaN),
        though its tokens may still be: the run stops there instead of logging it."""
        b = int(row.get("replica", 0))
        where = f"replica {b}, " if self.ensemble else ""
        self._blown_up = f"blow-up at step {row['step']}: {where}the velocity is not finite"
        return BlowUpError(f"{self._blown_up}. Likely cause: {self._likely_cause(b)}.", int(row["step"]), b, -1)

    def _likely_cause(self, b: int) -> str:
        # a head's own beta replaces the run's: name the largest one in force
        own = [(a.beta, h) for h, a in enumerate(self.attention) if a.beta is not None]
        beta, head = max(own + ([(float(self.betas[b]), None)] if len(own) < len(self.attention) else []),
                         key=lambda pair: pair[0])
        which = f" (head {head}'s own)" if head is not None else ""
        cause = (f"the step dt = {self.dt} is likely too large for beta = {beta:g}{which}; "
                 "reduce dt (or beta)")
        rules = {self.rule.name} | {a.rule.name for a in self.attention if a.rule is not None}
        if "exp" in rules and self.dtype == "float32":
            cause += ("; with rule 'exp' in float32, e^(beta s) overflows near beta*s = 88: "
                      "use dtype float64 or rule 'softmax'")
        return cause

    def _refuse_if_blown_up(self) -> None:
        if getattr(self, "_blown_up", None):
            raise ParticlesUserError(f"this Simulation stopped with a BlowUpError ({self._blown_up}); "
                                     "it will not advance from a non-finite state: give it a "
                                     "finite state with set_state(tokens, step) first")

    # -- internals ----------------------------------------------------------------------------
    def _flush(self) -> None:
        if not self._pending:
            return
        count = len(self._pending)
        red, sumx = (a[:count] if isinstance(a, np.ndarray) else a.to_numpy()[:count]
                     for a in (self._red, self._sumx))
        red, sumx = red.astype(np.float64), sumx[:, :, :, 0].astype(np.float64)  # copies
        radius = None if self._placement is None else self._placement.radius_rows()
        for (step, slot) in self._pending:
            rows = assemble_rows(self, step, red[slot], sumx[slot])
            if radius is not None:
                normalisation_mod.Placement.add_radius(rows, radius[slot])
            self._rows.extend(rows)
        self._pending = []

    def _advance_fused(self, steps: int, every: int) -> None:
        """Launches of as many whole steps as the batch buffer has slots for their rows."""
        while steps > 0:
            chunk = steps if self._fused.max_steps is None else min(steps, self._fused.max_steps)
            if every > 0:
                free = self._batch - len(self._pending)
                first = -self.step_count % every  # steps before the next logged one
                chunk = min(chunk, first + (free - 1) * every + 1)
            self._fused(self._operands, self.dt, self.step_count, chunk, every, False, len(self._pending))
            self._logged_fused(self.step_count, chunk, every)
            self.step_count += chunk
            steps -= chunk

    def _logged_fused(self, start: int, steps: int, every: int) -> None:
        for step in range(start, start + steps):
            if every > 0 and step % every == 0:
                self._pending.append((step, len(self._pending)))
        if len(self._pending) == self._batch:
            self._flush()

    def _warm_up(self) -> None:
        """Compile every kernel now, so JIT time never lands inside a timed step."""
        kern, notice = self._kern, self._notice
        if self._fused is not None:
            notice.stage(f"the {self.plan.implementation} step kernel")
            self._fused(self._operands, self.dt, self.step_count, 0, 0, True, 0)
            kern.finite_check(self._x)
            ti.sync()
            notice.finish()
            return
        for index in range(len(self._layers)):
            self._use_layer(index)
            for observe in (False, True):
                notice.stage(f"layer {index}'s pair pass" + " with observables" * observe)
                self._evaluate(self._x, self._xdot, observe)
        notice.stage("the reduction and the integrator's kernels")
        self._use_layer(self.schedule.layer_at(self.step_count))
        if self.entropy_rate_enabled:
            kern.project(self._xdot, self._Q, self._K, self._W, self._qd, self._kd, self._ud)
            kern.entropy_rate(self._q, self._k, self._qd, self._kd, self._beta, self._row, self._tok)
        self._reduce(self._tok, self._x, self._red, self._sumx, 0)
        if self._placement is not None:
            self._placement.observe(self._x, 0)
        kern.axpy(self._stage_x, self._x, 0.0, self._xdot)
        kern.accumulate(self._stage_acc, 1.0, self._xdot, 1)
        kern.accumulate(self._stage_acc, 1.0, self._xdot, 0)
        kern.retract(self._stage_x)
        kern.finite_check(self._x)
        ti.sync()
        notice.finish()


def _build_sizes(sim, r: int, rv: int) -> str:
    """The sizes a build compiles for, as its notice names them."""
    rules = ", ".join(dict.fromkeys(a.rule.name for att in sim.layer_attention for a in att))
    replicas = f", {sim.n_replicas} replicas" if sim.n_replicas > 1 else ""
    return (f"n={sim.n}, d={sim.d}, H={sim.n_heads}, rank r={r} (values {rv}){replicas}, rule {rules}, "
            f"{sim.dtype}, {sim.integrator.name}, implementation {sim.plan.implementation} on {sim.arch}")


def _features(attention) -> kernels.Features:
    return kernels.Features(banded=any(a.masked for a in attention),
                            biased=any(a.alibi > 0 for a in attention),
                            head_beta=any(a.beta is not None for a in attention),
                            filtered=len({a.rule for a in attention}) > 1)


class _LayerState:
    """One layer's device side: its factors, per-head parameters and pair passes (one per
    distinct rule, each serving its own heads)."""

    def __init__(self, heads, attention, features, geometry, dtype, d, r, rv, R, n, keep_qk, arr,
                 np_real, implementations):
        """implementations: an iterator over the plan's pass implementations (one per distinct
        rule, taken in order; empty for a whole-step implementation, which needs no pass)."""
        self.heads, self.attention = heads, attention
        H = len(heads)
        Q, K, W, O = _pack(heads, d, r, rv)
        self.Q, self.K, self.W, self.O = arr(H, r, d), arr(H, r, d), arr(H, rv, d), arr(H, d, rv)
        for dev, host in ((self.Q, Q), (self.K, K), (self.W, W), (self.O, O)):
            dev.from_numpy(host.astype(np_real))
        self.hreal = arr(H, 2)
        self.hreal.from_numpy(np.array([[a.alibi, a.beta or 0.0] for a in attention], dtype=np_real))
        bands = [a.band for a in attention]
        self.passes = []
        for rule in dict.fromkeys(a.rule for a in attention):  # distinct, in head order
            kern = kernels.build(rule, geometry, dtype, d, H, r, rv, features)
            hint = ti.ndarray(ti.i32, shape=(H, 3))
            hint.from_numpy(np.array([[lo, hi, int(a.rule == rule)] for (lo, hi), a in
                                      zip(bands, attention)], dtype=np.int32))
            implementation = next(implementations, None)
            head_pass = None if implementation is None else \
                paths.factory(implementation.name)(kern, R, n, keep_qk)
            if head_terms.has_terms(heads, attention):  # the plan chose a pass that serves them
                head_pass.after_project = head_terms.LayerTerms(heads, attention, dtype, n, r, rv,
                                                                np_real)
            self.passes.append((kern, head_pass, hint))
