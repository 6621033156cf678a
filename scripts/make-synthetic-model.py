"""A model of SmolLM2-360M's or SmolLM2-1.7B's shape with random weights, for measuring how speed, start-up and
memory grow with a model's size (never for its answers, which are noise). Benchmarks only.

    .venv/bin/python scripts/make-synthetic-model.py 360m      # prints the path of the quantized GGUF

The embedded SmolLM2-135M file gives the tokenizer and chat template (the three sizes share them); the weights
are drawn from a normal distribution, written as float16 with gguf-py, then quantized with the llama-quantize of
scripts/build-llama-server.sh to Q4_1 with a Q8_0 embedding, as the embedded file is. Kept in
$TYPEWRITER_BENCH_CACHE/models (default ~/.cache/typewriter/models); a second run reuses the file.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# Hugging Face config.json of each model: hidden size, layers, heads, kv heads, intermediate size, RoPE theta
SHAPES = {
    "135m": dict(dim=576, layers=30, heads=9, kv_heads=3, hidden=1536, rope_theta=100000.0),
    "360m": dict(dim=960, layers=32, heads=15, kv_heads=5, hidden=2560, rope_theta=100000.0),
    "1.7b": dict(dim=2048, layers=24, heads=32, kv_heads=32, hidden=8192, rope_theta=130000.0),
}
QUANT = "Q4_1"  # as the embedded file, whose token embedding is Q8_0 (llama-quantize's --token-embedding-type)


def cache_folder() -> Path:
    return Path(os.environ.get("TYPEWRITER_BENCH_CACHE") or Path.home() / ".cache" / "typewriter") / "models"


def write_random(out: Path, size: str, seed: int = 0) -> None:
    """A float16 GGUF of `size`'s shape: the embedded file's metadata (tokenizer, template), random weights."""
    sys.path.insert(0, str(ROOT / "backend"))
    from typewriter.weights.gguf_reader import GGUFReader
    from typewriter.weights.source import embedded_model_path

    shape, source = SHAPES[size], GGUFReader(embedded_model_path())
    arch = source.fields["general.architecture"]
    writer = gguf.GGUFWriter(str(out), arch)
    per_arch = {"embedding_length": shape["dim"], "block_count": shape["layers"],
                "feed_forward_length": shape["hidden"], "attention.head_count": shape["heads"],
                "attention.head_count_kv": shape["kv_heads"], "rope.freq_base": shape["rope_theta"],
                "rope.dimension_count": shape["dim"] // shape["heads"]}
    for key, value in source.fields.items():
        if key in ("general.architecture", "general.file_type", "general.quantization_version") or \
                key.startswith("GGUF."):
            continue
        name = key.split(".", 1)[1] if key.startswith(arch + ".") else None
        if name in per_arch:
            continue
        if key == "general.name":
            value = f"synthetic SmolLM2 {size} shape, random weights"
        _add(writer, key, value)
    for name, value in per_arch.items():
        _add(writer, f"{arch}.{name}", value)
    rng = np.random.default_rng(seed)
    d, hidden, vocab = shape["dim"], shape["hidden"], len(source.fields["tokenizer.ggml.tokens"])
    e = d // shape["heads"]

    def tensor(name: str, rows: int, cols: int | None = None) -> None:
        if cols is None:  # a norm's weight: ones, as a trained model's are near
            writer.add_tensor(name, np.ones(rows, np.float32))
            return
        w = rng.standard_normal((rows, cols), dtype=np.float32) * (1.0 / np.sqrt(cols))
        writer.add_tensor(name, w.astype(np.float16))

    tensor("token_embd.weight", vocab, d)
    tensor("output_norm.weight", d)
    for i in range(shape["layers"]):
        tensor(f"blk.{i}.attn_norm.weight", d)
        tensor(f"blk.{i}.attn_q.weight", shape["heads"] * e, d)
        tensor(f"blk.{i}.attn_k.weight", shape["kv_heads"] * e, d)
        tensor(f"blk.{i}.attn_v.weight", shape["kv_heads"] * e, d)
        tensor(f"blk.{i}.attn_output.weight", d, shape["heads"] * e)
        tensor(f"blk.{i}.ffn_norm.weight", d)
        tensor(f"blk.{i}.ffn_gate.weight", hidden, d)
        tensor(f"blk.{i}.ffn_up.weight", hidden, d)
        tensor(f"blk.{i}.ffn_down.weight", d, hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file(progress=False)
    writer.close()


def _add(writer: gguf.GGUFWriter, key: str, value) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value) if 0 <= value < 2**32 else writer.add_int64(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    elif (isinstance(value, list) and value and isinstance(value[0], str)) or isinstance(value, list):
        writer.add_array(key, value)
    else:
        raise TypeError(f"{key}: cannot write a {type(value).__name__}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("size", choices=sorted(SHAPES))
    args = parser.parse_args()
    folder = cache_folder()
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"synthetic-smollm2-{args.size}.{QUANT.lower()}.gguf"
    if out.is_file():
        print(out)
        return 0
    server = subprocess.run([str(ROOT / "scripts" / "build-llama-server.sh")], check=True, capture_output=True,
                            text=True).stdout.strip().splitlines()[-1]
    quantize = Path(server).with_name("llama-quantize")
    f16 = folder / f".synthetic-smollm2-{args.size}.f16.gguf"
    print(f"writing random weights of the {args.size} shape", file=sys.stderr)
    write_random(f16, args.size)
    staging = out.with_name(f".{out.name}.partial")
    try:
        subprocess.run([str(quantize), "--token-embedding-type", "q8_0", str(f16), str(staging), QUANT], check=True,
                       stdout=subprocess.DEVNULL)
        staging.rename(out)
    finally:
        f16.unlink(missing_ok=True)
        staging.unlink(missing_ok=True)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
