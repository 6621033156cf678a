"""A Llama-family decoder's matmuls as TensorFlow Lite programs with int8 weights, one program per layer.

XNNPACK quantizes each input row to 8 bits on the fly, and one scale per row loses what a few large channels leave
to the rest (runners/xla/quantized.py; docs/measurements/2026-12-01-weight-formats.md). So the whole residual
stream is kept rotated, x~ = x @ R for the orthogonal R of quantized.Rotation, and every rotation is folded into the
weights
(as QuaRot does): RMSNorm commutes with R (it keeps each row's norm), so its weight moves into the next matrix,
W' = R^T diag(g) W; matrices that write the stream get W @ R. V is rotated inside each head, so the attention
output arrives rotated and the output projection takes that back; only the down projection's input is rotated
as it runs (a Hadamard inside blocks of 64, two reshapes and a small float matmul).

Programs (rows resizable): `first` x~ -> qkv of layer 0; `layer i` (x~, attention output) -> (x~ after the
layer, qkv of layer i + 1), the last one x~ alone; `logits` x~ -> logits. They take the matrices already rounded,
(int8 [in, out], scale [out]) pairs: programs.py rounds them (gptq.py, or to nearest).

With `two_pass` (int8-lite; int8-lite-fast has none) the matrices q/k/v, o and down take their rows to about 16
bits (flatbuffer.py); gate, up and the logits stay at XNNPACK's 8 bits. Of the matrices, these three gained the
most quality (bench/quality.py) for the step time they cost
(docs/measurements/2026-12-04-int8-lite-gptq-16-bit-rows.md).
"""

from __future__ import annotations

import numpy as np

from ...models.model_config import ModelConfig
from ...models.rotation import Rotation
from .flatbuffer import ProgramBuilder


class RotationFolder:
    """Folds the rotations into the weights, one layer at a time (so only a layer or two of rotated float copies
    exist at once): `layer(i)` gives layer i's matrices [in, out] q/k/v joined, o, gate, up, down (and the qkv
    bias); `output()` the logits matrix; `embeddings()` the rotated embedding rows (float16). Each rotation is
    applied by blocks (models/rotation.py), not as a dense matrix."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray]):
        self.cfg, self.weights = cfg, weights
        self.stream = Rotation.of(cfg.dim)
        self.head = Rotation.of(cfg.head_dim).inner  # a Hadamard inside each head
        self.down_block = Rotation.of(cfg.hidden_dim).inner  # the down projection's online rotation, [b, b]

    def _into(self, w: np.ndarray, g: np.ndarray) -> np.ndarray:
        """R^T diag(g) W for a matrix W [d, out] that reads a norm's output."""
        return self.stream.numpy(np.ascontiguousarray((g[:, None] * w).T)).T

    def layer(self, i: int) -> dict:
        cfg = self.cfg
        w = {k.split(".", 2)[2]: np.asarray(a, np.float32) for k, a in self.weights.items()
             if k.startswith(f"layers.{i}.")}  # asarray: the file's float32 arrays are read, never copied
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

    def output(self) -> np.ndarray:
        out = self.weights["tok_embeddings" if self.cfg.tie_embeddings else "output"]
        return self._into(np.asarray(out, np.float32).T, np.asarray(self.weights["norm"], np.float32))

    def embeddings(self) -> np.ndarray:
        return self.stream.numpy(np.asarray(self.weights["tok_embeddings"], np.float32)).astype(np.float16)


def _blocks_times(block: np.ndarray, m: np.ndarray) -> np.ndarray:
    """diag(block, block, ...)^T @ m for m [times * b, out]."""
    b = block.shape[0]
    return (block.T @ m.reshape(-1, b, m.shape[1])).reshape(m.shape)


def _times_blocks(m: np.ndarray, block: np.ndarray) -> np.ndarray:
    """m @ diag(block, block, ...) for m [n, times * b]."""
    b = block.shape[0]
    return (m.reshape(m.shape[0], -1, b) @ block).reshape(m.shape)


def _int8(p: ProgramBuilder, x: int, w: tuple[np.ndarray, np.ndarray], two_pass: bool = False) -> int:
    return p.int8_matmul(x, *w, two_pass=two_pass)


def _qkv(p: ProgramBuilder, cfg: ModelConfig, x: int, layer: dict, two_pass: bool) -> int:
    y = _int8(p, p.rms(x, cfg.norm_eps), layer["qkv"], two_pass)
    return p.add(y, p.const(layer["bqkv"])) if "bqkv" in layer else y


def first_program(cfg: ModelConfig, layer0: dict, two_pass: bool = True, rows: int = 1) -> bytes:
    p = ProgramBuilder(rows)
    return p.finish([_qkv(p, cfg, p.input(cfg.dim), layer0, two_pass)])


def layer_program(cfg: ModelConfig, layer: dict, following: dict | None, down_block: np.ndarray,
                  two_pass: bool = True, rows: int = 1) -> bytes:
    """A layer's program; `following` is the next layer's folded weights (None for the last layer)."""
    p = ProgramBuilder(rows)
    x, attended = p.input(cfg.dim), p.input(cfg.n_heads * cfg.head_dim)
    h = p.add(x, _int8(p, attended, layer["o"], two_pass))
    n = p.rms(h, cfg.norm_eps)
    gate, up = _int8(p, n, layer["gate"]), _int8(p, n, layer["up"])
    act = p.mul(p.mul(gate, p.sigmoid(gate)), up)  # SiLU(gate) * up, [rows, hidden]
    b = down_block.shape[0]
    act = p.reshape(p.matmul(p.reshape(act, [-1, b]), down_block), [-1, cfg.hidden_dim])  # rotated
    # inside blocks of b: [rows * hidden / b, b] -> [rows, hidden]
    x = p.add(h, _int8(p, act, layer["down"], two_pass))
    if following is None:
        return p.finish([x])
    return p.finish([x, _qkv(p, cfg, x, following, two_pass)])


def logits_program(cfg: ModelConfig, output: tuple[np.ndarray, np.ndarray], rows: int = 1) -> bytes:
    p = ProgramBuilder(rows)
    return p.finish([_int8(p, p.rms(p.input(cfg.dim), cfg.norm_eps), output)])
