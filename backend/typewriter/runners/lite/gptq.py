"""GPTQ rounding (Frantar et al., 2022) of a matrix to int8 with one scale per output column, as
rotation.quantize_int8 stores it, but moving the channels not yet rounded to make up for the error so far, weighted
by H = E[x^T x] of the inputs (calibration.py). Groups of GROUP channels round on their own, all at once, to fit
start-up's budget (docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from ..rotation import INT8_MAX

if TYPE_CHECKING:
    from .kernel import Kernel

# H + DAMP * mean(diag H) * I: a few hundred calibration rows leave H singular, and leaning towards round-to-nearest
# generalises better to other text (the study above).
DAMP = 0.1
GROUP = 64


SUB_BLOCK = 16


def group_width(n: int, group: int = GROUP) -> int:
    """A width with no such divisor rounds in smaller groups (1: round-to-nearest)."""
    return math.gcd(n, group)


def moment(x: np.ndarray, group: int = GROUP) -> np.ndarray:
    """x [rows, n] -> E[x^T x]'s diagonal blocks [n / g, g, g]: all `quantize` reads."""
    rows, n = x.shape
    g = group_width(n, group)
    xg = np.ascontiguousarray(x.reshape(rows, n // g, g).transpose(1, 2, 0))  # [groups, g, rows]
    blocks: np.ndarray = xg @ xg.transpose(0, 2, 1) / rows  # [groups, g, g]
    return blocks


def quantize(w: np.ndarray, h: np.ndarray, damp: float = DAMP, group: int = GROUP,
             kernel: Kernel | None = None) -> tuple[np.ndarray, np.ndarray]:
    """w [in, out], h [in, in] or `moment`'s blocks -> (int8 [in, out], float32 scale [out]) as
    rotation.quantize_int8. Columns round independently, so a matrix may go a slice at a time. `kernel` None: numpy."""
    n, out = w.shape
    g = group_width(n, group)
    scale = np.abs(w).max(axis=0).astype(np.float32) / INT8_MAX
    scale[scale == 0] = 1.0  # an all-zero column stays zero
    inv_scale = 1.0 / scale
    w = np.array(w, dtype=np.float32, order="C").reshape(n // g, g, out)  # a copy, updated as channels round
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
    # GPTQ's lazy batches: one by one within a sub-block, whose errors then move the rest of the group in one product.
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
