"""A Llama-family decoder's matmuls as TensorFlow Lite programs with int8 weights, one program per layer.

XNNPACK quantizes each input row to 8 bits on the fly, and one scale per row loses what a few large channels leave
to the rest (KL from fp32 0.034 nats a token unrotated, quantized.py). So the whole residual stream is kept
rotated, x~ = x @ R for the orthogonal R of quantized.Rotation, and every rotation is folded into the weights
(as QuaRot does): RMSNorm commutes with R (it keeps each row's norm), so its weight moves into the next matrix,
W' = R^T diag(g) W; matrices that write the stream get W @ R. V is rotated inside each head, so the attention
output arrives rotated and the output projection takes that back; only the down projection's input is rotated
as it runs (a Hadamard inside blocks of 64, two reshapes and a small float matmul).

Programs (rows resizable): `first` x~ -> qkv of layer 0; `layer i` (x~, attention output) -> (x~ after the
layer, qkv of layer i + 1), the last one x~ alone; `logits` x~ -> logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model_config import ModelConfig
from ..rotation import Rotation, quantize_int8
from .flatbuffer import Program


def _matrix(rotation: Rotation) -> np.ndarray:
    """R [n, n] with x @ R = rotation.numpy(x)."""
    n = rotation.a * rotation.b
    return rotation.numpy(np.eye(n, dtype=np.float32))


def _block_diag(block: np.ndarray, times: int) -> np.ndarray:
    return np.kron(np.eye(times, dtype=np.float32), block)


@dataclass
class Folded:
    """The rotated weights: per layer q/k/v, o, gate, up, down [in, out] (and qkv bias), the output matrix,
    the embedding rows x~ (float16), and the down projection's online block rotation."""
    layers: list[dict]
    output: np.ndarray
    embeddings: np.ndarray
    down_block: np.ndarray


def fold(cfg: ModelConfig, weights: dict[str, np.ndarray]) -> Folded:
    d, e = cfg.dim, cfg.head_dim
    r = _matrix(Rotation.of(d))
    head = _matrix(Rotation.of(e))
    heads_out = _block_diag(head, cfg.n_heads)  # the attention output's rotation, [h * e, h * e]
    down = Rotation.of(cfg.hidden_dim)
    down_block = down.inner  # [b, b], symmetric Hadamard
    down_rot = _block_diag(down_block, down.a)

    def into(w_in_out, g):  # a matrix that reads a norm's output: R^T diag(g) W
        return r.T @ (g[:, None] * w_in_out)

    layers = []
    for i in range(cfg.n_layers):
        w = {k.split(".", 2)[2]: a.astype(np.float32) for k, a in weights.items() if k.startswith(f"layers.{i}.")}
        g1, g2 = w["attention_norm"], w["ffn_norm"]
        wv = w["wv"].T @ _block_diag(head, cfg.n_kv_heads)  # [d, k * e], each head's V rotated
        layer = {
            "qkv": into(np.concatenate([w["wq"].T, w["wk"].T, wv], axis=1), g1),
            "o": heads_out.T @ w["wo"].T @ r,
            "gate": into(w["w_gate"].T, g2),
            "up": into(w["w_up"].T, g2),
            "down": down_rot.T @ w["w_down"].T @ r,
        }
        if cfg.qkv_bias:
            bv = w["bv"] @ _block_diag(head, cfg.n_kv_heads)
            layer["bqkv"] = np.concatenate([w["bq"], w["bk"], bv]).astype(np.float32)
        layers.append(layer)
    table = weights["tok_embeddings"].astype(np.float32)
    out = weights["tok_embeddings" if cfg.tie_embeddings else "output"].astype(np.float32)
    return Folded(layers, into(out.T, weights["norm"].astype(np.float32)), (table @ r).astype(np.float16),
                  down_block)


def _int8(p: Program, x: int, w: np.ndarray) -> int:
    return p.int8_matmul(x, *quantize_int8(w))


def _qkv(p: Program, cfg: ModelConfig, x: int, layer: dict) -> int:
    y = _int8(p, p.rms(x, cfg.norm_eps), layer["qkv"])
    return p.add(y, p.const(layer["bqkv"])) if "bqkv" in layer else y


def first_program(cfg: ModelConfig, folded: Folded, rows: int = 1) -> bytes:
    p = Program(rows)
    return p.finish([_qkv(p, cfg, p.input(cfg.dim), folded.layers[0])])


def layer_program(cfg: ModelConfig, folded: Folded, i: int, rows: int = 1) -> bytes:
    p = Program(rows)
    x, attended = p.input(cfg.dim), p.input(cfg.n_heads * cfg.head_dim)
    layer = folded.layers[i]
    h = p.add(x, _int8(p, attended, layer["o"]))
    n = p.rms(h, cfg.norm_eps)
    gate, up = _int8(p, n, layer["gate"]), _int8(p, n, layer["up"])
    act = p.mul(p.mul(gate, p.sigmoid(gate)), up)  # SiLU(gate) * up, [rows, hidden]
    b = folded.down_block.shape[0]
    act = p.reshape(p.matmul(p.reshape(act, [-1, b]), folded.down_block), [-1, cfg.hidden_dim])  # rotated
    # inside blocks of b: [rows * hidden / b, b] -> [rows, hidden]
    x = p.add(h, _int8(p, act, layer["down"]))
    if i + 1 == cfg.n_layers:
        return p.finish([x])
    return p.finish([x, _qkv(p, cfg, x, folded.layers[i + 1])])


def logits_program(cfg: ModelConfig, folded: Folded, rows: int = 1) -> bytes:
    p = Program(rows)
    return p.finish([_int8(p, p.rms(p.input(cfg.dim), cfg.norm_eps), folded.output)])
