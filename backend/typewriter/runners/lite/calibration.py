"""What gptq.py rounds by: E[x^T x] of each int8-lite matrix's inputs on a calibration text (calibration.txt). The
text runs through the folded model in numpy a layer at a time, each matrix rounded as soon as its inputs are known,
so a later one is rounded against what the earlier rounding left (GPTQ's order); attention need only be close.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...architecture.model_config import ModelConfig
from . import gptq
from .attention import _rope
from .layers import Layer

TEXT = Path(__file__).with_name("calibration.txt")
# Time grows with the tokens; fewer rounded about as well (docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
MAX_TOKENS = 512

Matrix = tuple[np.ndarray, np.ndarray]  # int8 [in, out], float32 scale [out]
Round = Callable[[np.ndarray, np.ndarray | None], Matrix]  # (w [in, out], E[x^T x] or None) -> int8 matrix


def text() -> str:
    return TEXT.read_text(encoding="utf-8")


def _norm(x: np.ndarray, eps: float) -> np.ndarray:
    """The programs' RMSNorm (its weight folded into the matrix that reads it)."""
    normed: np.ndarray = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return normed


def _moment(x: np.ndarray) -> np.ndarray:
    return gptq.moment(x)


def _times(x: np.ndarray, m: Matrix) -> np.ndarray:
    q, scale = m
    return (x @ q.astype(np.float32)) * scale


class Calibration:
    """The calibration tokens' residual stream x~ [n, d] (rotated, as the programs hold it)."""

    def __init__(self, cfg: ModelConfig, embeddings: np.ndarray, ids: list[int]):
        ids = list(ids)[:min(MAX_TOKENS, cfg.max_position)]
        if not ids:
            raise ValueError("calibration needs at least one token")
        self.cfg = cfg
        self.x = embeddings[ids].astype(np.float32)
        n = len(ids)
        angles = cfg.rope_angles(n)
        self.cos, self.sin = np.cos(angles)[:, None].astype(np.float32), np.sin(angles)[:, None].astype(np.float32)
        self.mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)

    def stream_moment(self) -> np.ndarray:
        """What a layer's qkv, and the logits, read."""
        return _moment(_norm(self.x, self.cfg.norm_eps))

    def run_layer(self, layer: Layer, down_block: np.ndarray, round_: Round) -> None:
        """`layer`'s "qkv" is rounded already; its "o", "gate", "up" and "down" are rounded in place here."""
        cfg, n = self.cfg, len(self.x)
        h, k, e = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        qkv = _times(_norm(self.x, cfg.norm_eps), layer["qkv"])
        if "bqkv" in layer:
            qkv += layer["bqkv"]
        q = _rope(qkv[:, :h * e].reshape(n, h, e), self.cos, self.sin)
        keys = _rope(qkv[:, h * e:(h + k) * e].reshape(n, k, e), self.cos, self.sin)
        values = qkv[:, (h + k) * e:].reshape(n, k, e)
        keys, values = (np.repeat(t, h // k, axis=1).transpose(1, 0, 2) for t in (keys, values))  # [h, n, e]
        scores = q.transpose(1, 0, 2) @ keys.transpose(0, 2, 1) / np.float32(np.sqrt(e)) + self.mask  # [h, n, n]
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        attended = (scores @ values).transpose(1, 0, 2).reshape(n, h * e)
        layer["o"] = round_(layer["o"], _moment(attended))
        x = self.x + _times(attended, layer["o"])
        normed = _norm(x, cfg.norm_eps)
        ffn = _moment(normed)
        layer["gate"], layer["up"] = round_(layer["gate"], ffn), round_(layer["up"], ffn)
        gate, up = _times(normed, layer["gate"]), _times(normed, layer["up"])
        act = gate / (1 + np.exp(-gate)) * up
        b = down_block.shape[0]
        act = (act.reshape(-1, b) @ down_block).reshape(n, -1)  # rotated as the program rotates it
        layer["down"] = round_(layer["down"], _moment(act))
        self.x = x + _times(act, layer["down"])
