"""The GPT-2 block on the shared Transformer: what gpt2_names.py describes, as HF's modeling_gpt2 computes it.

    x = wte[token] + wpe[position]
    per layer:  x += c_proj(attention(split_heads(c_attn(LayerNorm_1(x)))))      (no RoPE, every head its own K/V)
                x += mlp.c_proj(gelu_tanh(mlp.c_fc(LayerNorm_2(x))))
    logits = LayerNorm_f(x) @ wte.T
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from . import native_ops
from .model import Layer, Transformer, dims, layer_weights
from .quantized import dense


class GPT2Transformer(Transformer):
    def _hold(self, weights: dict[str, np.ndarray]) -> None:
        cfg, var = self.cfg, self._var
        self.output = self._mat(weights["tok_embeddings"].T, "output")  # [d, v], the embedding table too (tied)
        self.tok_embeddings = None
        self.pos_embeddings = var(weights["pos_embeddings"], "pos_embeddings")  # [max_position, d]
        self.norm, self.norm_bias = var(weights["norm"], "norm"), var(weights["norm_bias"], "norm_bias")
        self.layers = []
        transposed = {"wqkv", "wo", "w_up", "w_down"}  # held [in, out] for x @ w
        for i in range(cfg.n_layers):
            self.layers.append({k: self._mat(a.T, f"l{i}_{k}") if k in transposed else var(a, f"l{i}_{k}")
                                for k, a in layer_weights(weights, i).items()})

    def _embed(self, tokens: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
        # A padding position may lie past the table (a chunk's tail, a padding row at max_len): its result is
        # never used, so it reads the last row rather than out of bounds.
        positions = tf.minimum(positions, self.cfg.max_position - 1)
        return super()._embed(tokens, positions) + tf.gather(self.pos_embeddings, positions)

    def _layer_norm(self, x: tf.Tensor, weight: tf.Variable, bias: tf.Variable) -> tf.Tensor:
        mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * native_ops.rsqrt(variance + self.cfg.norm_eps) * weight + bias

    def _qkv(self, layer: Layer, x: tf.Tensor, positions: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        cfg = self.cfg
        b, t = dims(x)[:2]
        h = self._layer_norm(x, layer["attention_norm"], layer["attention_norm_bias"])
        qkv = dense(h, layer["wqkv"]) + layer["bqkv"]  # [b, t, 3 * h * e]
        q, k, v = (tf.reshape(part, [b, t, cfg.n_heads, cfg.head_dim]) for part in tf.split(qkv, 3, axis=-1))
        return q, k, v  # each [b, t, h, e]

    def _attention_output(self, layer: Layer, attended: tf.Tensor) -> tf.Tensor:
        return dense(attended, layer["wo"]) + layer["bo"]

    def _mlp(self, layer: Layer, x: tf.Tensor) -> tf.Tensor:
        h = self._layer_norm(x, layer["ffn_norm"], layer["ffn_norm_bias"])
        h = native_ops.gelu_tanh(dense(h, layer["w_up"]) + layer["b_up"])  # [b, t, hidden]
        return dense(h, layer["w_down"]) + layer["b_down"]

    def _logits(self, x: tf.Tensor) -> tf.Tensor:
        return dense(self._layer_norm(x, self.norm, self.norm_bias), self.output)  # [..., v]
