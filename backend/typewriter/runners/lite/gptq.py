"""GPTQ rounding (Frantar et al., 2022) of a matrix to int8 with one scale per output column, as
rotation.quantize_int8 stores it, but rounded so that the matrix's outputs on real inputs move least.

Rounding each weight to its nearest step leaves an error per input channel that the rows then add up. GPTQ rounds
one input channel at a time and moves the channels not yet rounded to make up for the error so far, weighted by
H = E[x^T x] of the matrix's inputs (calibration.py measures it): the same format and speed, a smaller error.

Here the inputs are taken in groups of GROUP channels, each group rounded on its own (H's blocks on its diagonal,
the only part of H computed), all groups at once: whole-matrix GPTQ needs H^-1 of 1,536 channels and a Python step per channel, too slow for a
start-up budget of a few seconds for the whole model. What the groups give up:
docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..rotation import INT8_MAX

if TYPE_CHECKING:
    from .kernel import Kernel

# H + DAMP * mean(diag H) * I: a few hundred calibration rows leave H singular, and a heavier damping leans towards
# round-to-nearest, which generalised better to text unlike the calibration's
# (docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
DAMP = 0.1
GROUP = 64


SUB_BLOCK = 16  # channels rounded one by one before their error moves the rest of the group in one product


def group_width(n: int, group: int = GROUP) -> int:
    """The group width for n input channels: a width with no such divisor rounds in smaller groups (1:
    round-to-nearest)."""
    return math.gcd(n, group)


def moment(x: np.ndarray, group: int = GROUP) -> np.ndarray:
    """E[x^T x]'s blocks on its diagonal, [n / g, g, g] for inputs x [rows, n]: all that `quantize` reads, so the
    rest (most of it for a wide matrix) is never computed."""
    rows, n = x.shape
    g = group_width(n, group)
    xg = np.ascontiguousarray(x.reshape(rows, n // g, g).transpose(1, 2, 0))  # [groups, g, rows]
    blocks: np.ndarray = xg @ xg.transpose(0, 2, 1) / rows  # [groups, g, g]
    return blocks


def quantize(w: np.ndarray, h: np.ndarray, damp: float = DAMP, group: int = GROUP,
             kernel: Kernel | None = None) -> tuple[np.ndarray, np.ndarray]:
    """w [in, out], h the inputs' second moment: [in, in], or its diagonal blocks [in / g, g, g] as `moment`
    gives them -> (int8 [in, out], float32 scale [out]), w ~ q * scale, each column's scale its largest |w| / 127
    (as rotation.quantize_int8). Every column is rounded on its own, so a matrix may be rounded a slice of columns
    at a time. `kernel`: kernel.py's Kernel, whose C loop (gptq.c) rounds on two threads; None: numpy."""
    n, out = w.shape
    g = group_width(n, group)
    scale = np.abs(w).max(axis=0).astype(np.float32) / INT8_MAX
    scale[scale == 0] = 1.0  # an all-zero column stays zero
    inv_scale = 1.0 / scale
    w = np.array(w, dtype=np.float32, order="C").reshape(n // g, g, out)  # a copy, updated as channels are rounded
    if h.ndim == 2:
        h = np.stack([h[i:i + g, i:i + g] for i in range(0, n, g)])
    blocks = np.array(h, dtype=np.float64)  # [groups, g, g]
    diag = np.einsum("bii->bi", blocks)  # a view: writes go into `blocks`
    mean_diag = np.mean(diag)
    dead = diag == 0  # an input that is always zero does nothing: its weights round to zero
    w[dead] = 0.0
    diag[dead] = 1.0
    diag += damp * mean_diag
    # Upper Cholesky factors of H^-1 (GPTQ's form): row j says how rounding channel j moves channels j+1.. .
    u = np.linalg.cholesky(np.linalg.inv(blocks)).transpose(0, 2, 1).astype(np.float32)
    q = np.empty(w.shape, np.int8)
    if kernel is not None:
        kernel.gptq(w, np.ascontiguousarray(u), scale, inv_scale.astype(np.float32), q)
        return q.reshape(n, out), scale
    # GPTQ's lazy batches: within a sub-block the channels are rounded one by one, each moving the sub-block's
    # others; the sub-block's errors then move the rest of the group in one matrix product.
    errors = np.empty((n // g, min(SUB_BLOCK, g), out), np.float32)
    for b0 in range(0, g, SUB_BLOCK):
        b1 = min(b0 + SUB_BLOCK, g)
        for j in range(b0, b1):
            row = np.clip(np.rint(w[:, j] * inv_scale), -INT8_MAX, INT8_MAX)  # [groups, out]
            q[:, j] = row
            err = (w[:, j] - row * scale) / u[:, j, j, None]
            errors[:, j - b0] = err
            if j + 1 < b1:
                w[:, j + 1:b1] -= u[:, j, j + 1:b1, None] * err[:, None, :]
        if b1 < g:
            w[:, b1:] -= u[:, b0:b1, b1:].transpose(0, 2, 1) @ errors[:, :b1 - b0]
    return q.reshape(n, out), scale
