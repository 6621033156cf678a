"""GPTQ rounding (Frantar et al., 2022) of a matrix to int8 with one scale per output column, as
rotation.quantize_int8 stores it, but rounded so that the matrix's outputs on real inputs move least.

Rounding each weight to its nearest step leaves an error per input channel that the rows then add up. GPTQ rounds
one input channel at a time and moves the channels not yet rounded to make up for the error so far, weighted by
H = E[x^T x] of the matrix's inputs (calibration.py measures it): the same format and speed, a smaller error.

Here the inputs are taken in groups of GROUP channels, each group rounded on its own (H's blocks on its diagonal),
all groups at once: whole-matrix GPTQ needs H^-1 of 1,536 channels and a Python step per channel, too slow for a
start-up budget of a few seconds for the whole model. What the groups give up:
docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md.
"""

from __future__ import annotations

import math

import numpy as np

from ...models.rotation import INT8_MAX

# H + DAMP * mean(diag H) * I: a few hundred calibration rows leave H singular, and a heavier damping leans towards
# round-to-nearest, which generalised better to text unlike the calibration's
# (docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
DAMP = 0.1
GROUP = 64


def quantize(w: np.ndarray, h: np.ndarray, damp: float = DAMP, group: int = GROUP) -> tuple[np.ndarray, np.ndarray]:
    """w [in, out], h [in, in] (the inputs' second moment) -> (int8 [in, out], float32 scale [out]),
    w ~ q * scale, each column's scale its largest |w| / 127 (as rotation.quantize_int8)."""
    n, out = w.shape
    g = math.gcd(n, group)  # a width with no such divisor rounds in smaller groups (1: round-to-nearest)
    scale = np.abs(w).max(axis=0).astype(np.float32) / INT8_MAX
    scale[scale == 0] = 1.0  # an all-zero column stays zero
    inv_scale = 1.0 / scale
    w = np.array(w, dtype=np.float32, order="C").reshape(n // g, g, out)  # a copy, updated as channels are rounded
    blocks = np.stack([h[i:i + g, i:i + g] for i in range(0, n, g)]).astype(np.float64)  # [groups, g, g]
    diag = np.einsum("bii->bi", blocks)  # a view: writes go into `blocks`
    dead = diag == 0  # an input that is always zero does nothing: its weights round to zero
    w[dead] = 0.0
    diag[dead] = 1.0
    diag += damp * np.mean(np.diag(h))
    # Upper Cholesky factors of H^-1 (GPTQ's form): row j says how rounding channel j moves channels j+1.. .
    u = np.linalg.cholesky(np.linalg.inv(blocks)).transpose(0, 2, 1).astype(np.float32)
    q = np.empty(w.shape, np.int8)
    for j in range(g):
        row = np.clip(np.rint(w[:, j] * inv_scale), -INT8_MAX, INT8_MAX)  # [groups, out]
        q[:, j] = row
        if j + 1 < g:
            err = (w[:, j] - row * scale) / u[:, j, j, None]
            w[:, j + 1:] -= u[:, j, j + 1:, None] * err[:, None, :]
    return q.reshape(n, out), scale
