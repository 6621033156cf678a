"""A Llama-family decoder's matmuls as TensorFlow Lite programs with int8 weights, one program per layer.

XNNPACK rounds each input row to 8 bits with one scale, which a few large channels spoil for the rest, so the
residual stream is kept rotated (x~ = x @ R) and every rotation folded into the weights, as QuaRot does; only the
down projection's input is rotated as it runs (docs/measurements/2026-12-01-weight-formats.md). With `two_pass`,
q/k/v, o, down and the logits take their rows to about 16 bits
(docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from ...architecture.model_config import ModelConfig
from ...weights.source import WeightReader
from ..rotation import Rotation
from .flatbuffer import ProgramBuilder

# Rows of a vocabulary-sized matrix folded at once: all of it in float32 would be hundreds of MB.
CHUNK_ROWS = 16384

# "qkv", "o", "gate", "up", "down": float [in, out], replaced in place by (int8 [in, out], float32 scale [out]) once
# rounded; "bqkv" where the model has q/k/v biases.
Layer = dict[str, Any]


class RotationFolder:
    """A layer at a time, so only a layer or two of rotated float copies exist at once."""

    def __init__(self, cfg: ModelConfig, weights: Mapping[str, np.ndarray]):
        self.cfg, self.weights = cfg, weights
        self.stream = Rotation.of(cfg.dim)
        self.head = Rotation.of(cfg.head_dim).inner  # a Hadamard inside each head
        self.down_block = Rotation.of(cfg.hidden_dim).inner  # the down projection's online rotation, [b, b]

    def _into(self, w: np.ndarray, g: np.ndarray) -> np.ndarray:
        """R^T diag(g) W for a matrix W [d, out] that reads a norm's output."""
        return self.stream.numpy(np.ascontiguousarray((g[:, None] * w).T)).T

    def layer(self, i: int) -> Layer:
        cfg = self.cfg
        # asarray: the file's float32 arrays are read, never copied
        w = {k.split(".", 2)[2]: np.asarray(self.weights[k], np.float32) for k in self.weights
             if k.startswith(f"layers.{i}.")}
        g1, g2 = w["attention_norm"], w["ffn_norm"]
        wv = _times_blocks(w["wv"].T, self.head)  # [d, k * e], each head's V rotated
        layer = {
            "qkv": self._into(np.concatenate([w["wq"].T, w["wk"].T, wv], axis=1), g1),
            "o": self.stream.numpy(_blocks_times(self.head, w["wo"].T)),  # takes each head's rotation back
            "gate": self._into(w["w_gate"].T, g2),
            "up": self._into(w["w_up"].T, g2),
            "down": self.stream.numpy(_blocks_times(self.down_block, w["w_down"].T)),
        }
        if cfg.qkv_bias:
            bv = _times_blocks(w["bv"][None], self.head)[0]
            layer["bqkv"] = np.concatenate([w["bq"], w["bk"], bv]).astype(np.float32)
        return layer

    def output(self, columns: int = CHUNK_ROWS) -> Iterator[tuple[int, int, np.ndarray]]:
        """The logits matrix [d, v] a slice at a time: (start, stop, its columns [d, stop - start])."""
        name = "tok_embeddings" if self.cfg.tie_embeddings else "output"
        norm = np.asarray(self.weights["norm"], np.float32)
        for start in range(0, self.cfg.vocab_size, columns):
            stop = min(start + columns, self.cfg.vocab_size)
            yield start, stop, self._into(_rows(self.weights, name, start, stop).T, norm)

    def embeddings(self, rows: int = CHUNK_ROWS) -> np.ndarray:
        """The rotated embedding rows [v, d], float16."""
        out = np.empty((self.cfg.vocab_size, self.cfg.dim), np.float16)
        for start in range(0, self.cfg.vocab_size, rows):
            stop = min(start + rows, self.cfg.vocab_size)
            out[start:stop] = self.stream.numpy(_rows(self.weights, "tok_embeddings", start, stop))
        return out


def _rows(weights: Mapping[str, np.ndarray], name: str, start: int, stop: int) -> np.ndarray:
    if isinstance(weights, WeightReader):
        return np.asarray(weights.rows(name, start, stop), np.float32)
    return np.asarray(weights[name][start:stop], np.float32)


def _blocks_times(block: np.ndarray, m: np.ndarray) -> np.ndarray:
    """diag(block, block, ...)^T @ m for m [times * b, out], as one product: a stack of small ones is far slower."""
    b, out = block.shape[0], m.shape[1]
    times = m.shape[0] // b
    side = m.reshape(times, b, out).transpose(1, 0, 2).reshape(b, times * out)  # [b, times * out]
    return np.ascontiguousarray((block.T @ side).reshape(b, times, out).transpose(1, 0, 2)).reshape(m.shape)


def _times_blocks(m: np.ndarray, block: np.ndarray) -> np.ndarray:
    """m @ diag(block, block, ...) for m [n, times * b]."""
    b = block.shape[0]
    product: np.ndarray = np.ascontiguousarray(m).reshape(-1, b) @ block
    return product.reshape(m.shape)


def _int8(p: ProgramBuilder, x: int, w: tuple[np.ndarray, np.ndarray], two_pass: bool = False) -> int:
    return p.int8_matmul(x, *w, two_pass=two_pass)


def _qkv(p: ProgramBuilder, cfg: ModelConfig, x: int, layer: Layer, two_pass: bool) -> int:
    y = _int8(p, p.rms(x, cfg.norm_eps), layer["qkv"], two_pass)
    return p.add(y, p.const(layer["bqkv"])) if "bqkv" in layer else y


def first_program(cfg: ModelConfig, layer0: Layer, two_pass: bool = True, rows: int = 1) -> bytes:
    p = ProgramBuilder(rows)
    return p.finish([_qkv(p, cfg, p.input(cfg.dim), layer0, two_pass)])


def layer_program(cfg: ModelConfig, layer: Layer, following: Layer | None, down_block: np.ndarray,
                  two_pass: bool = True, rows: int = 1) -> bytes:
    """A layer's program; `following` is the next layer's folded weights (None for the last layer)."""
    p = ProgramBuilder(rows)
    x, attended = p.input(cfg.dim), p.input(cfg.n_heads * cfg.head_dim)
    h = p.add(x, _int8(p, attended, layer["o"], two_pass))
    n = p.rms(h, cfg.norm_eps)
    gate, up = _int8(p, n, layer["gate"]), _int8(p, n, layer["up"])
    act = p.mul(p.mul(gate, p.sigmoid(gate)), up)  # SiLU(gate) * up, [rows, hidden]
    b = down_block.shape[0]
    # rotated inside blocks of b: [rows * hidden / b, b] -> [rows, hidden]
    act = p.reshape(p.matmul(p.reshape(act, [-1, b]), down_block), [-1, cfg.hidden_dim])
    x = p.add(h, _int8(p, act, layer["down"], two_pass))
    if following is None:
        return p.finish([x])
    return p.finish([x, _qkv(p, cfg, x, following, two_pass)])


def logits_program(cfg: ModelConfig, output: tuple[np.ndarray, np.ndarray], two_pass: bool = True,
                   rows: int = 1) -> bytes:
    p = ProgramBuilder(rows)
    return p.finish([_int8(p, p.rms(p.input(cfg.dim), cfg.norm_eps), output, two_pass)])
