"""Kernels shaped for a GPU (CUDA, Vulkan, Metal): chosen by ``kernels.KernelSet`` when the
active arch is not the CPU.

``Reduce``: the column reductions over tokens of the observables as per-chunk partials
(one thread per (replica, column, chunk of CHUNK tokens)) and a finish over the chunks
(one thread per (replica, column)): parallel, no loop over n on a single thread, and a
fixed summation order, so a run is reproducible on one device. It accumulates in float64
where the device has it, else in float32; the log-sum-exp of the row energies is summed
after the shift by the maximum, so its exponentials lie in (0, 1] in either type.
"""
import functools

import taichi as ti

from . import backend

CHUNK = 256  # tokens per partial sum


class Reduce:
    """Drop-in for ``KernelSet.reduce(tok, x, out, sumx, slot)`` on a GPU arch."""

    def __init__(self, n_slots: int, d: int, slots_per_head: int, slot_row_energy: int):
        self.acc = backend.reduction_dtype()
        self.n_cols = n_slots + d  # the observable slots, then the d components of sum x_i/|x_i|
        self.partial, self.finish = _reduce_kernels(n_slots, d, slots_per_head, slot_row_energy,
                                                    self.acc)
        self._parts: dict[tuple[int, int], ti.Ndarray] = {}

    def __call__(self, tok, x, out, sumx, slot: int) -> None:
        R, n = tok.shape[0], tok.shape[1]
        part = self._parts.get((R, n))
        if part is None:
            part = self._parts[(R, n)] = ti.ndarray(self.acc, shape=(R, self.n_cols, -(-n // CHUNK), 4))
        self.partial(tok, x, part)
        self.finish(part, out, sumx, slot)


@functools.lru_cache(maxsize=None)
def _reduce_kernels(n_slots: int, d: int, slots_per_head: int, slot_row_energy: int, acc):
    any3 = ti.types.ndarray(ndim=3)
    any4 = ti.types.ndarray(ndim=4)

    @ti.func
    def column(tok: ti.template(), x: ti.template(), b, i, col):
        """Slot col of token i, or for col >= n_slots component col - n_slots of x_i / |x_i|."""
        value = ti.cast(0, acc)
        if col < n_slots:
            value = ti.cast(tok[b, i, col], acc)
        else:
            norm2 = ti.cast(0, acc)
            for e in ti.static(range(d)):
                norm2 += ti.cast(x[b, i, e], acc) * ti.cast(x[b, i, e], acc)
            if norm2 > 0:
                value = ti.cast(x[b, i, col - n_slots], acc) / ti.sqrt(norm2)
        return value

    @ti.func
    def is_row_energy(col):
        return col >= 1 and col < n_slots and (col - 1) % slots_per_head == slot_row_energy

    @ti.kernel
    def partial(tok: any3, x: any3, part: any4):
        """part[b, col, chunk] = (sum, min, max, sum of e^(v - max)) over the chunk's tokens."""
        n = tok.shape[1]
        for b, col, ck in ti.ndrange(tok.shape[0], part.shape[1], part.shape[2]):
            first = ck * CHUNK
            last = ti.min(first + CHUNK, n)
            total = ti.cast(0, acc)
            lo = column(tok, x, b, first, col)
            hi = lo
            for i in range(first, last):
                v = column(tok, x, b, i, col)
                total += v
                lo = ti.min(lo, v)
                hi = ti.max(hi, v)
            lse = ti.cast(0, acc)
            if is_row_energy(col):  # the log-sum-exp is read for the row energies only
                for i in range(first, last):
                    lse += ti.exp(column(tok, x, b, i, col) - hi)
            part[b, col, ck, 0] = total
            part[b, col, ck, 1] = lo
            part[b, col, ck, 2] = hi
            part[b, col, ck, 3] = lse

    @ti.kernel
    def finish(part: any4, out: any4, sumx: any4, slot: ti.i32):
        """Combine the chunks in order into out[slot] (slots) and sumx[slot] (sum of x_i/|x_i|)."""
        nchunk = part.shape[2]
        for b, col in ti.ndrange(part.shape[0], part.shape[1]):
            total = ti.cast(0, acc)
            lo = part[b, col, 0, 1]
            hi = part[b, col, 0, 2]
            for ck in range(nchunk):
                total += part[b, col, ck, 0]
                lo = ti.min(lo, part[b, col, ck, 1])
                hi = ti.max(hi, part[b, col, ck, 2])
            if col < n_slots:
                lse = ti.cast(0, acc)
                for ck in range(nchunk):
                    lse += part[b, col, ck, 3] * ti.exp(part[b, col, ck, 2] - hi)
                out[slot, b, col, 0] = total
                out[slot, b, col, 1] = lo
                out[slot, b, col, 2] = hi
                out[slot, b, col, 3] = hi + ti.log(lse)
            else:
                sumx[slot, b, col - n_slots, 0] = total

    return partial, finish
