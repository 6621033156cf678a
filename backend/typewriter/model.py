"""A Llama-family decoder in TensorFlow: grouped-query attention, RoPE, RMSNorm, SwiGLU, tied or untied output.

The model is a pure function of its weights and its KV cache; it knows nothing of tokens as text, of requests
or of compilation (runner.py compiles its two entry points per bucket). Weights arrive as canonical float32
arrays in [out, in] layout with Q/K rows in rotate-half order (see weights/).

Shapes: b batch, t new positions, s cached positions, d model dim, h query heads, k kv heads,
g = h // k query heads per kv head, e head dim, v vocab.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from .model_config import ModelConfig


class KVCache(tf.Module):
    """Static K/V buffers for `slots` independent sequences of up to `max_len` positions, updated in place.

    Each slot has `tail` scratch positions past `max_len` (at least one): a padded prefill chunk near the end of
    the context writes its padding there instead of out of bounds, and so do a decode batch's padding rows.
    Nothing ever reads them.
    """

    def __init__(self, cfg: ModelConfig, slots: int, max_len: int, tail: int = 1, dtype=tf.float32):
        super().__init__(name="kv_cache")
        tail = max(1, tail)
        self.slots, self.max_len, self.tail = slots, max_len, tail
        shape = [slots, max_len + tail, cfg.n_kv_heads, cfg.head_dim]  # [slots, s + tail, k, e]
        self.k = [tf.Variable(tf.zeros(shape, dtype), trainable=False, name=f"k{i}") for i in range(cfg.n_layers)]
        self.v = [tf.Variable(tf.zeros(shape, dtype), trainable=False, name=f"v{i}") for i in range(cfg.n_layers)]

    def write(self, layer: int, index: tf.Tensor, k: tf.Tensor, v: tf.Tensor) -> None:
        """index [n, 2] of (slot, position); k, v [n, k, e]."""
        self.k[layer].scatter_nd_update(index, k)
        self.v[layer].scatter_nd_update(index, v)

    def copy_slot(self, source: tf.Tensor, target: tf.Tensor) -> None:
        """Every cached position of slot `source` into slot `target` (a shared prefix, computed once)."""
        for buffers in (self.k, self.v):
            for var in buffers:
                var.scatter_nd_update([[target]], tf.gather(var, [source]))  # gather: see extend


class Transformer(tf.Module):
    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray], slots: int, max_len: int,
                 max_chunk: int = 0):
        """`max_chunk`: the longest padded prefill chunk that `extend` will be given (its scratch room)."""
        super().__init__(name="transformer")
        self.cfg = cfg
        self.cache = KVCache(cfg, slots, max_len, tail=max_chunk)

        def var(x, name):
            return tf.Variable(np.ascontiguousarray(x, dtype=np.float32), trainable=False, name=name)

        self.tok_embeddings = var(weights["tok_embeddings"], "tok_embeddings")  # [v, d]
        # Stored [d, v]: XLA's CPU matmul is up to 2x slower with a transposed operand once b > 1.
        self.output = var(weights["tok_embeddings" if cfg.tie_embeddings else "output"].T, "output")  # [d, v]
        self.norm = var(weights["norm"], "norm")
        self.layers = []
        for i in range(cfg.n_layers):
            w = {k.split(".", 2)[2]: a for k, a in weights.items() if k.startswith(f"layers.{i}.")}
            layer = {
                "attention_norm": var(w["attention_norm"], f"l{i}_attention_norm"),
                "ffn_norm": var(w["ffn_norm"], f"l{i}_ffn_norm"),
                # one matmul for q, k and v: [d, (h + 2k) * e]
                "wqkv": var(np.concatenate([w["wq"], w["wk"], w["wv"]]).T, f"l{i}_wqkv"),
                "wo": var(w["wo"].T, f"l{i}_wo"),  # [h * e, d]
                # one matmul for gate and up: [d, 2 * hidden]
                "w_gate_up": var(np.concatenate([w["w_gate"], w["w_up"]]).T, f"l{i}_w_gate_up"),
                "w_down": var(w["w_down"].T, f"l{i}_w_down"),  # [hidden, d]
            }
            if cfg.qkv_bias:
                layer["bqkv"] = var(np.concatenate([w["bq"], w["bk"], w["bv"]]), f"l{i}_bqkv")
            self.layers.append(layer)
        half = cfg.head_dim // 2
        inv_freq = 1.0 / (cfg.rope_theta ** (np.arange(half, dtype=np.float64) * 2 / cfg.head_dim))
        angles = np.arange(max_len + self.cache.tail, dtype=np.float64)[:, None] * inv_freq[None, :]  # [s+tail, e/2]
        self.rope_cos = tf.constant(np.cos(angles), tf.float32)
        self.rope_sin = tf.constant(np.sin(angles), tf.float32)

    # ---- building blocks ----

    def _rms_norm(self, x: tf.Tensor, weight: tf.Variable) -> tf.Tensor:
        return x * tf.math.rsqrt(tf.reduce_mean(tf.square(x), axis=-1, keepdims=True) + self.cfg.norm_eps) * weight

    def _rope(self, x: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
        """x [b, t, heads, e], positions [b, t]: rotate-half RoPE (Hugging Face layout)."""
        cos = tf.gather(self.rope_cos, positions)[:, :, None, :]  # [b, t, 1, e/2]
        sin = tf.gather(self.rope_sin, positions)[:, :, None, :]
        x1, x2 = tf.split(x, 2, axis=-1)
        return tf.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def _qkv(self, layer: dict, x: tf.Tensor, positions: tf.Tensor):
        cfg = self.cfg
        b, t = tf.shape(x)[0], tf.shape(x)[1]
        qkv = tf.matmul(self._rms_norm(x, layer["attention_norm"]), layer["wqkv"])  # [b, t, (h + 2k) * e]
        if "bqkv" in layer:
            qkv += layer["bqkv"]
        q, k, v = tf.split(qkv, [cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim,
                                 cfg.n_kv_heads * cfg.head_dim], axis=-1)
        q = self._rope(tf.reshape(q, [b, t, cfg.n_heads, cfg.head_dim]), positions)  # [b, t, h, e]
        k = self._rope(tf.reshape(k, [b, t, cfg.n_kv_heads, cfg.head_dim]), positions)  # [b, t, k, e]
        v = tf.reshape(v, [b, t, cfg.n_kv_heads, cfg.head_dim])  # [b, t, k, e]
        return q, k, v

    def _attend(self, q: tf.Tensor, keys: tf.Tensor, values: tf.Tensor, mask: tf.Tensor) -> tf.Tensor:
        """q [b, t, h, e]; keys, values [b, s, k, e]; mask [b, t, s] (True = may attend) -> [b, t, h * e]."""
        cfg = self.cfg
        b, t = tf.shape(q)[0], tf.shape(q)[1]
        q = tf.reshape(q, [b, t, cfg.n_kv_heads, cfg.groups, cfg.head_dim])  # [b, t, k, g, e]
        scores = tf.einsum("btkge,bske->bkgts", q, keys) * (cfg.head_dim**-0.5)  # [b, k, g, t, s]
        scores = tf.where(mask[:, None, None, :, :], scores, tf.float32.min)
        probs = tf.nn.softmax(scores, axis=-1)
        out = tf.einsum("bkgts,bske->btkge", probs, values)  # [b, t, k, g, e]
        return tf.reshape(out, [b, t, cfg.n_heads * cfg.head_dim])

    def _mlp(self, layer: dict, x: tf.Tensor) -> tf.Tensor:
        gate, up = tf.split(tf.matmul(self._rms_norm(x, layer["ffn_norm"]), layer["w_gate_up"]), 2, axis=-1)
        return tf.matmul(tf.nn.silu(gate) * up, layer["w_down"])

    def _logits(self, x: tf.Tensor) -> tf.Tensor:
        return tf.matmul(self._rms_norm(x, self.norm), self.output)  # [..., v]

    # ---- entry points (compiled by runner.py) ----

    def prefill(self, tokens: tf.Tensor, length: tf.Tensor, slot: tf.Tensor, all_logits: bool = False) -> tf.Tensor:
        """A fresh sequence: tokens [1, t] (padded past `length`) written to `slot` at positions 0..t-1."""
        return self.extend(tokens, tf.constant(0), length, slot, tokens.shape[1], all_logits)

    def extend(self, tokens: tf.Tensor, start: tf.Tensor, length: tf.Tensor, slot: tf.Tensor, kv_len: int,
               all_logits: bool = False) -> tf.Tensor:
        """A prefill chunk: tokens [1, t] (padded past `length`) written to `slot` at positions start..start+t-1,
        each attending to every cached position of the slot before it, the chunk's own included. kv_len is a
        static bucket at least start + length; start + t may run into the cache's scratch tail.

        Returns the logits at position start + length - 1 [1, v], or at every chunk position [1, t, v] with
        all_logits. Positions at or past start + length hold padding; no real position attends to them, and
        later chunks or decode steps overwrite them.
        """
        t = tokens.shape[1]
        positions = start + tf.range(t)  # [t]
        index = tf.stack([tf.fill([t], slot), positions], axis=1)  # [t, 2]
        mask = (tf.range(kv_len)[None, :] <= positions[:, None])[None]  # causal over the cache [1, t, s]
        x = tf.gather(self.tok_embeddings, tokens)  # [1, t, d]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, positions[None])
            self.cache.write(i, index, k[0], v[0])
            # gather, not `[slot]`: a sliced variable index would be a compile-time constant, one XLA program per slot
            keys = tf.gather(self.cache.k[i][:, :kv_len], slot)[None]  # [1, s, k, e], this chunk included
            values = tf.gather(self.cache.v[i][:, :kv_len], slot)[None]
            x += tf.matmul(self._attend(q, keys, values, mask), layer["wo"])
            x += self._mlp(layer, x)
        if all_logits:
            return self._logits(x)
        return self._logits(tf.gather(x, [length - 1], axis=1)[:, 0])

    def decode(self, tokens: tf.Tensor, positions: tf.Tensor, slots: tf.Tensor, kv_len: int) -> tf.Tensor:
        """One step for b sequences: tokens [b] at positions [b] in slots [b] -> logits [b, v].

        Attention reads only the first kv_len cached positions of each row's slot (a static bucket above every
        real position). A padding row has position max_len: it writes into the scratch tail, which nobody reads.
        """
        b = tokens.shape[0]
        index = tf.stack([slots, positions], axis=1)  # [b, 2]
        mask = (tf.range(kv_len)[None, :] <= positions[:, None])[:, None, :]  # [b, 1, s]
        x = tf.gather(self.tok_embeddings, tokens)[:, None, :]  # [b, 1, d]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, positions[:, None])
            self.cache.write(i, index, k[:, 0], v[:, 0])
            keys = tf.gather(self.cache.k[i][:, :kv_len], slots)  # [b, s, k, e]
            values = tf.gather(self.cache.v[i][:, :kv_len], slots)
            x += tf.matmul(self._attend(q, keys, values, mask), layer["wo"])
            x += self._mlp(layer, x)
        return self._logits(x[:, 0])
