"""The Llama block (the llama and phi3 families) in TensorFlow: grouped-query attention, RoPE, RMSNorm, SwiGLU,
tied or untied output; another block subclasses `Transformer` and overrides its pieces (gpt2.py). A pure function
of its weights and K/V cache: it knows nothing of text, requests or compiling. Weights arrive canonical: float32
[out, in], Q/K rows in rotate-half order (weights/).

Shapes: b batch, t new positions, s cached positions, d model dim, h query heads, k kv heads,
g = h // k query heads per kv head, e head dim, v vocab.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeAlias, cast

import numpy as np
import tensorflow as tf

from ...architecture.model_config import ModelConfig
from ...config import WeightFormat
from . import native_ops
from .host_memory import variable, zeros_variable
from .quantized import Matrix, columns, dense, matrix

# From this share of the slots a decode step reads every slot's cache in place rather than copying out its own
# (docs/measurements/2026-12-01-chunked-prefill-and-prefix-reuse.md).
IN_PLACE_SHARE = 0.5

Segments: TypeAlias = "tuple[list[tf.Variable], list[tf.Variable]]"  # a layer's K and V segments (KVCache.layer)
Layer: TypeAlias = dict[str, Matrix]  # a layer's weights by name: matrices, and float32 norms and biases
P = ParamSpec("P")


class KVCache(tf.Module):  # type: ignore[misc]  # tf.Module is Any: TensorFlow ships no type information
    """One variable [slots, k, segment, e] per segment ending at `bounds`, so XLA's matmul reads whole variables
    without the copy a slice costs (docs/measurements/2026-12-01-chunked-prefill-and-prefix-reuse.md). Writes
    outside every segment (padding) are dropped: XLA's scatter skips out-of-bounds updates."""

    def __init__(self, cfg: ModelConfig, slots: int, max_len: int, bounds: Sequence[int] | None = None,
                 dtype: tf.DType = tf.float32):
        super().__init__(name="kv_cache")
        bounds = tuple(sorted(bounds or (max_len,)))
        if bounds[-1] != max_len or bounds[0] <= 0:
            raise ValueError(f"cache segments {bounds} must be positive and end at {max_len}")
        self.slots, self.max_len, self.bounds = slots, max_len, bounds
        self.starts = (0, *bounds[:-1])

        def segments(kind: str, layer: int) -> list[tf.Variable]:
            return [zeros_variable([slots, cfg.n_kv_heads, end - start, cfg.head_dim], dtype.as_numpy_dtype,
                                   f"{kind}{layer}_{start}")
                    for start, end in zip(self.starts, bounds)]

        self.k = [segments("k", i) for i in range(cfg.n_layers)]
        self.v = [segments("v", i) for i in range(cfg.n_layers)]

    def used(self, kv_len: int) -> list[tuple[int, int]]:
        """(segment, positions read from it) for the first kv_len positions. A kv_len that is one of `bounds`
        reads whole segments; any other reads part of its last one, which costs a copy."""
        return [(j, min(end, kv_len) - start) for j, (start, end) in enumerate(zip(self.starts, self.bounds))
                if start < kv_len]

    def layer(self, i: int, kv_len: int) -> Segments:
        """Only the segments kv_len uses: a variable handed to a layer's function is an argument of every call."""
        n = len(self.used(kv_len))
        return self.k[i][:n], self.v[i][:n]

    def write(self, segments: Segments, slots: tf.Tensor, positions: tf.Tensor, k: tf.Tensor, v: tf.Tensor,
              kv_len: int) -> None:
        """slots, positions [n]; k, v [n, k, e]: each row's K/V at (slot, position)."""
        ks, vs = segments
        heads = k.shape[1]
        at = tf.stack([tf.repeat(slots[:, None], heads, axis=1),
                       tf.repeat(tf.range(heads)[None], tf.shape(slots)[0], axis=0),
                       tf.repeat(positions[:, None], heads, axis=1)], axis=-1)  # [n, k, 3]: (slot, head, position)
        for j, _ in self.used(kv_len):
            index = at - [0, 0, self.starts[j]]  # the position within segment j
            if tf.executing_eagerly():  # an uncompiled reference run: TensorFlow's own scatter refuses such rows
                keep = tf.reduce_all((index >= 0) & (index < ks[j].shape[:3]), axis=-1)[:, 0]
                ks[j].scatter_nd_update(index[keep], k[keep])
                vs[j].scatter_nd_update(index[keep], v[keep])
            else:
                ks[j].scatter_nd_update(index, k)
                vs[j].scatter_nd_update(index, v)

    def gather(self, segments: Segments, slots: tf.Tensor, kv_len: int) -> tuple[list[tf.Tensor], ...]:
        """A copy of the first kv_len positions of each slot in `slots` [b]: lists of [b, k, segment, e]."""
        return tuple([tf.gather(var[j], slots)[:, :, :n] for j, n in self.used(kv_len)] for var in segments)

    def every_slot(self, segments: Segments, kv_len: int) -> tuple[list[tf.Tensor], ...]:
        """The first kv_len positions of every slot: the variables themselves (no copy) for whole segments."""
        def read(var: tf.Variable, n: int) -> tf.Tensor:
            return var if n == var.shape[2] else var[:, :, :n]

        return tuple([read(var[j], n) for j, n in self.used(kv_len)] for var in segments)

    def copy_slot(self, source: tf.Tensor, target: tf.Tensor) -> None:
        for buffers in (self.k, self.v):
            for layer in buffers:
                for var in layer:
                    var.scatter_nd_update([[target]], tf.gather(var, [source]))  # gather: see extend


class Transformer(tf.Module):  # type: ignore[misc]  # tf.Module is Any: TensorFlow ships no type information
    """The Llama block; start.build_model picks a subclass for a family with another block (gpt2.py)."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray], slots: int, max_len: int,
                 max_chunk: int = 1, kv_buckets: Sequence[int] | None = None,
                 weight_format: WeightFormat = WeightFormat.FP32):
        """`max_chunk`: the longest padded chunk `extend` gets (its positions may run that far past max_len);
        `kv_buckets`: the attention lengths calls will ask for."""
        super().__init__(name="transformer")
        self.cfg = cfg
        self.weight_format = WeightFormat(weight_format)
        self.max_chunk = max(1, max_chunk)
        self.cache = KVCache(cfg, slots, max_len, kv_buckets)
        self._hold(weights)

    def _var(self, x: np.ndarray, name: str) -> tf.Variable:
        """A float32 weight, held as it is (norms, biases, embeddings)."""
        return variable(x, name, np.float32)

    def _mat(self, x: np.ndarray, name: str) -> Matrix:
        """A matrix [in, out] in the model's weight format."""
        return matrix(x, name, self.weight_format)

    def _hold(self, weights: dict[str, np.ndarray]) -> None:
        cfg, var, mat = self.cfg, self._var, self._mat
        # [d, v]: XLA's CPU matmul is slower with a transposed operand; tied, it is the embedding table too
        # (docs/measurements/2026-11-30-repetition-penalty-and-model-code-layouts.md).
        self.output = mat(weights["tok_embeddings" if cfg.tie_embeddings else "output"].T, "output")  # [d, v]
        self.tok_embeddings = None if cfg.tie_embeddings else var(weights["tok_embeddings"], "tok_embeddings")
        self.norm = var(weights["norm"], "norm")
        self.layers: list[Layer] = []
        for i in range(cfg.n_layers):
            w = layer_weights(weights, i)
            layer = {
                "attention_norm": var(w["attention_norm"], f"l{i}_attention_norm"),
                "ffn_norm": var(w["ffn_norm"], f"l{i}_ffn_norm"),
                # one matmul for q, k and v: [d, (h + 2k) * e]
                "wqkv": mat(_joined_t(w["wq"], w["wk"], w["wv"]), f"l{i}_wqkv"),
                "wo": mat(w["wo"].T, f"l{i}_wo"),  # [h * e, d]
                # one matmul for gate and up: [d, 2 * hidden]
                "w_gate_up": mat(_joined_t(w["w_gate"], w["w_up"]), f"l{i}_w_gate_up"),
                "w_down": mat(w["w_down"].T, f"l{i}_w_down"),  # [hidden, d]
            }
            if cfg.qkv_bias:
                layer["bqkv"] = var(np.concatenate([w["bq"], w["bk"], w["bv"]]), f"l{i}_bqkv")
            self.layers.append(layer)
        angles = cfg.rope_angles(self.cache.max_len + self.max_chunk)  # [s+t, e/2]
        self.rope_cos = tf.constant(np.cos(angles), tf.float32)
        self.rope_sin = tf.constant(np.sin(angles), tf.float32)

    def _embed(self, tokens: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
        """tokens [...] -> [..., d]; `positions` (of tokens' shape) serve families with learned positions."""
        if self.tok_embeddings is not None:
            return tf.gather(self.tok_embeddings, tokens)
        table = columns(self.output, tokens)  # [d, ...]
        return tf.transpose(table, [*range(1, table.shape.rank), 0])

    def _rms_norm(self, x: tf.Tensor, weight: tf.Variable) -> tf.Tensor:
        return x * native_ops.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + self.cfg.norm_eps) * weight

    def _rope(self, x: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
        """x [b, t, heads, e], positions [b, t]: rotate-half RoPE (Hugging Face layout)."""
        cos = tf.gather(self.rope_cos, positions)[:, :, None, :]  # [b, t, 1, e/2]
        sin = tf.gather(self.rope_sin, positions)[:, :, None, :]
        x1, x2 = tf.split(x, 2, axis=-1)
        return tf.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def _qkv(self, layer: Layer, x: tf.Tensor, positions: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        cfg = self.cfg
        b, t = dims(x)[:2]
        qkv = dense(self._rms_norm(x, layer["attention_norm"]), layer["wqkv"])  # [b, t, (h + 2k) * e]
        if "bqkv" in layer:
            qkv += layer["bqkv"]
        q, k, v = tf.split(qkv, [cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim,
                                 cfg.n_kv_heads * cfg.head_dim], axis=-1)
        q = self._rope(tf.reshape(q, [b, t, cfg.n_heads, cfg.head_dim]), positions)  # [b, t, h, e]
        k = self._rope(tf.reshape(k, [b, t, cfg.n_kv_heads, cfg.head_dim]), positions)  # [b, t, k, e]
        v = tf.reshape(v, [b, t, cfg.n_kv_heads, cfg.head_dim])  # [b, t, k, e]
        return q, k, v

    def _attend(self, q: tf.Tensor, keys: list[tf.Tensor], values: list[tf.Tensor], mask: tf.Tensor) -> tf.Tensor:
        """q [b, t, h, e]; keys, values: segments [b, k, s_j, e] that together hold s positions; mask [b, t, s]
        (True = may attend) -> [b, t, h * e]. Scores are taken per segment and joined for one softmax."""
        cfg = self.cfg
        b, t = dims(q)[:2]
        q = tf.reshape(q, [b, t, cfg.n_kv_heads, cfg.groups, cfg.head_dim])
        q = tf.reshape(tf.transpose(q, [0, 2, 3, 1, 4]), [b, cfg.n_kv_heads, cfg.groups * t, cfg.head_dim])
        scores = tf.concat([tf.matmul(q, k, transpose_b=True) for k in keys], -1) * (cfg.head_dim**-0.5)
        scores = tf.reshape(scores, [b, cfg.n_kv_heads, cfg.groups, t, -1])  # [b, k, g, t, s]
        probs = native_ops.softmax(tf.where(mask[:, None, None], scores, tf.float32.min))
        probs = tf.split(tf.reshape(probs, [b, cfg.n_kv_heads, cfg.groups * t, -1]), [k.shape[2] for k in keys], -1)
        out = tf.add_n([tf.matmul(p, v) for p, v in zip(probs, values)])  # [b, k, g * t, e]
        out = tf.transpose(tf.reshape(out, [b, cfg.n_kv_heads, cfg.groups, t, cfg.head_dim]), [0, 3, 1, 2, 4])
        return tf.reshape(out, [b, t, cfg.n_heads * cfg.head_dim])

    def _attention_output(self, layer: Layer, attended: tf.Tensor) -> tf.Tensor:
        return dense(attended, layer["wo"])  # [b, t, d]

    def _mlp(self, layer: Layer, x: tf.Tensor) -> tf.Tensor:
        gate, up = tf.split(dense(self._rms_norm(x, layer["ffn_norm"]), layer["w_gate_up"]), 2, axis=-1)
        return dense(native_ops.silu(gate) * up, layer["w_down"])

    def _logits(self, x: tf.Tensor) -> tf.Tensor:
        return dense(self._rms_norm(x, self.norm), self.output)  # [..., v]

    # ---- entry points (compiled by compiler.py) ----

    def prefill(self, tokens: tf.Tensor, length: tf.Tensor, slot: tf.Tensor, all_logits: bool = False) -> tf.Tensor:
        """A fresh sequence: tokens [1, t] (padded past `length`) written to `slot` at positions 0..t-1."""
        return self.extend(tokens, tf.constant(0), length, slot, tokens.shape[1], all_logits)

    def extend(self, tokens: tf.Tensor, start: tf.Tensor, length: tf.Tensor, slot: tf.Tensor, kv_len: int,
               all_logits: bool = False) -> tf.Tensor:
        """tokens [1, t] (padded past `length`) at positions start.. of `slot` -> logits [1, v] after the last real
        token, or [1, t, v] with all_logits. kv_len is a static bucket of at least start + length; padding
        positions are never attended to and are overwritten later."""
        t = tokens.shape[1]
        positions = start + tf.range(t)  # [t]
        mask = (tf.range(kv_len)[None, :] <= positions[:, None])[None]  # causal over the cache [1, t, s]
        x = self._embed(tokens, positions[None])  # [1, t, d]
        body = _layer_body(self._extend_layer)
        for i, layer in enumerate(self.layers):
            x = body(layer, self.cache.layer(i, kv_len), x, positions, slot, mask, kv_len)
        if all_logits:
            return self._logits(x)
        return self._logits(tf.gather(x, [length - 1], axis=1)[:, 0])

    def _extend_layer(self, layer: Layer, segments: Segments, x: tf.Tensor, positions: tf.Tensor, slot: tf.Tensor,
                      mask: tf.Tensor, kv_len: int) -> tf.Tensor:
        q, k, v = self._qkv(layer, x, positions[None])
        self.cache.write(segments, tf.fill(tf.shape(positions), slot), positions, k[0], v[0], kv_len)
        # gather, not `[slot]`: a sliced variable index would be a compile-time constant, one XLA program per slot
        keys, values = self.cache.gather(segments, slot[None], kv_len)  # this chunk included
        # one matmul over the joined segments, faster than one per segment
        # (docs/measurements/2026-12-01-chunked-prefill-and-prefix-reuse.md)
        keys, values = [tf.concat(keys, axis=2)], [tf.concat(values, axis=2)]
        x += self._attention_output(layer, self._attend(q, keys, values, mask))
        return x + self._mlp(layer, x)

    def decode(self, tokens: tf.Tensor, positions: tf.Tensor, slots: tf.Tensor, kv_len: int) -> tf.Tensor:
        """tokens, positions, slots [b] -> logits [b, v]. A padding row has slot `slots` (the cache's count) and
        position max_len: its writes are dropped and its logits are garbage."""
        b, n_slots = tokens.shape[0], self.cache.slots
        if b >= IN_PLACE_SHARE * n_slots:  # row r is slot slots[r]: one-hot maps rows to slots and back
            rows = tf.cast(slots[:, None] == tf.range(n_slots)[None], tf.float32)  # [b, n_slots], padding: none
            slot_pos = tf.reduce_max(tf.where(rows > 0, positions[:, None], -1), axis=0)  # [n_slots], -1: idle
            mask = (tf.range(kv_len)[None, :] <= slot_pos[:, None])[:, None, :]  # [n_slots, 1, s]
        else:
            rows = tf.minimum(slots, n_slots - 1)  # a padding row gathers some slot and its result is dropped
            mask = (tf.range(kv_len)[None, :] <= positions[:, None])[:, None, :]  # [b, 1, s]
        x = self._embed(tokens, positions)[:, None, :]  # [b, 1, d]
        body = _layer_body(self._decode_layer)
        for i, layer in enumerate(self.layers):
            x = body(layer, self.cache.layer(i, kv_len), x, positions, slots, rows, mask, kv_len)
        return self._logits(x[:, 0])

    def _decode_layer(self, layer: Layer, segments: Segments, x: tf.Tensor, positions: tf.Tensor, slots: tf.Tensor,
                      rows: tf.Tensor, mask: tf.Tensor, kv_len: int) -> tf.Tensor:
        """rows: the one-hot [b, n_slots] of an in-place step, or the slots [b] that a gathering step reads."""
        q, k, v = self._qkv(layer, x, positions[:, None])
        self.cache.write(segments, slots, positions, k[:, 0], v[:, 0], kv_len)
        if rows.shape.rank == 2:
            keys, values = self.cache.every_slot(segments, kv_len)
            attended = self._attend(tf.einsum("bs,bthe->sthe", rows, q), keys, values, mask)
            attended = tf.einsum("bs,sty->bty", rows, attended)
        else:
            keys, values = self.cache.gather(segments, rows, kv_len)
            attended = self._attend(q, keys, values, mask)
        x += self._attention_output(layer, attended)
        return x + self._mlp(layer, x)


def dims(x: tf.Tensor) -> list[int | tf.Tensor]:
    """x's dimensions, each a Python int where the shape is static (every compiled program's is), else a tensor:
    static reshapes leave TensorFlow's constant folding nothing to evaluate before XLA sees the graph."""
    return [d if d is not None else tf.shape(x)[i] for i, d in enumerate(x.shape.as_list())]


def _joined_t(*parts: np.ndarray) -> np.ndarray:
    """[out_i, in] parts -> [in, sum(out_i)] in one pass (joining, then transposing, took two)."""
    return np.concatenate([p.T for p in parts], axis=1)


def _layer_body(layer_fn: Callable[P, tf.Tensor]) -> Callable[P, tf.Tensor]:
    """One traced function every layer calls, so tracing costs one layer's ops; a new one per trace keeps each
    program's compile-cache key the same (docs/measurements/2026-12-02-start-up-and-memory.md)."""
    if tf.executing_eagerly():
        return layer_fn
    body = tf.function(layer_fn, autograph=False)
    body._omit_frequent_tracing_warning = True  # one per trace, by design: not TensorFlow's "retracing" case
    return cast("Callable[P, tf.Tensor]", body)  # a tf.function is called as the function it traces


def layer_weights(weights: dict[str, np.ndarray], i: int) -> dict[str, np.ndarray]:
    """Layer i's canonical weights by their name within the layer ("layers.3.wq" -> "wq")."""
    return {k.split(".", 2)[2]: a for k, a in weights.items() if k.startswith(f"layers.{i}.")}
