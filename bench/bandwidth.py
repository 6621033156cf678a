"""The physical floor of one student's decode: this machine's memory read bandwidth, the bytes one decode step
reads in each weight format, and the tokens/s that bandwidth / bytes allows.

    .venv/bin/python bench/bandwidth.py [--mib 512] [--repeats 10]
    .venv/bin/python bench/bandwidth.py --model F.gguf [--position 150] [--measure [--formats int8-lite]]

Bandwidth: a STREAM-like pass over a buffer far larger than the last-level cache (bench/c/bandwidth.c: a read that
sums every 32-byte word, and a memcpy counted as bytes read plus written), on 1 and 2 threads, interleaved,
best and median of the repeats. One student's decode runs on 2 threads on both sides, so the 2-thread read is
the floor's bandwidth.

Bytes a step reads (weights once, plus the K/V cache at `--position` and one embedding row):
- int8-lite: every layer's int8 matrices (q/k/v, o, gate, up, down) and the logits' int8 matrix, each with a
  float32 scale per output column; the matrices whose rows go to 16 bits (runners/lite/layers.py) take two zero
  input channels more and the rows twice, but read their weights once; the down projection's online rotation is a
  small float32 block. K/V float16.
- llama.cpp: every tensor of the GGUF file as stored, but the token embeddings (one row) unless they are also the
  output matrix. K/V float16 (its default).
- q4-blocks (runners/lite/blocks.c), the same bytes as `blocks exact` below.
- candidates in bench/c/q4_matmul.c's block formats (32 weights a block, float16 scales): `blocks exact`, each
  matrix in the format that holds the file's own blocks exactly (Q4_0 as Q4, 18 bytes a block; Q4_1 as Q4M with a
  minimum, 20; Q4_K as Q4K, 18.5 (its 6-bit scales and minimums a byte each); Q5_0 as Q5, 22; Q5_1 and Q5_K as Q5M,
  24; Q6_K as Q6K, 26.5 (the file's 26.25 and its blocks on cache lines); Q8_0 and the rest as Q8, 34); `q4m + q8
  logits`, every layer matrix at 20 and the logits at 34; `q4 + q8 logits`, the layers at 18.

With --measure, one-student decode (bench/single_stream.py's runs: ours through `typewriter bench`, llama.cpp
through llama-cpp-python on 2 threads, or --peer-threads) and each as a fraction of its floor.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BLOCK = 32  # weights per block in the C kernel's formats
# bytes a block: 16 of nibbles and a float16 scale; and a float16 minimum; 4 bytes more of fifth bits; Q5's and 4
# more of sixth bits and a second scale; 32 bytes. The K-quants' (Q4K, Q6K): a byte for each sub-block's scale (and
# Q4K's minimum) and a float16 d (and dmin) for each super-block of 256
Q4, Q4M, Q4K, Q5, Q5M, Q6K, Q8 = 18, 20, 18.5, 22, 24, 26.5, 34
EXACT = {"Q4_0": Q4, "Q4_1": Q4M, "Q4_K": Q4K, "Q5_0": Q5, "Q5_1": Q5M, "Q5_K": Q5M, "Q6_K": Q6K}  # others Q8
DOWN_BLOCK = 64  # runners/lite/layers.py: the down projection's online rotation, a Hadamard inside blocks of this


def measure_bandwidth(mib: int, repeats: int) -> dict:
    """GB/s (1e9 bytes) of reads and copies of a `mib` MiB buffer: best, median and worst over `repeats` passes.

    Buffers on transparent huge pages (as numpy's large arrays ask for), and a read of one on 4 KiB pages: a
    runtime that packs its weights into memory of its own without asking for huge pages reads them so."""
    sys.path.insert(0, str(HERE))
    from c_build import load

    library = load("bandwidth.c", ("-mavx2",))
    library.bandwidth_pass.restype = ctypes.c_double
    library.bandwidth_pass.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int,
                                       ctypes.POINTER(ctypes.c_uint64)]
    size = mib << 20
    huge, small, dst = _buffer(size, True), _buffer(size, False), _buffer(size, True)
    sink, copied = ctypes.c_uint64(), ctypes.c_uint64()
    huge_kib = _huge_page_kib()  # of the two numpy buffers' 2 x size: how much the kernel put on huge pages
    passes = {"read_1t": (huge, None, 1), "read_2t": (huge, None, 2), "read_2t_4k_pages": (small, None, 2),
              "copy_2t": (huge, dst, 2)}
    seconds: dict[str, list[float]] = {name: [] for name in passes}
    for _ in range(repeats):  # the variants interleaved, so a busy moment of the machine touches each alike
        for name, (a, b, threads) in passes.items():
            seconds[name].append(library.bandwidth_pass(
                a.ctypes.data, None if b is None else b.ctypes.data, size, threads, int(b is not None),
                ctypes.byref(sink if b is None else copied)))
    expected = size // 8 * 0x0101010101010101 % 2**64  # every 64-bit word of a buffer of bytes 1, added
    if sink.value != expected:  # so no part of the buffer was skipped
        raise AssertionError(f"the read pass summed {sink.value}, expected {expected}")
    report: dict = {"buffer_mib": mib, "repeats": repeats, "huge_page_mib": huge_kib >> 10}
    for name, times in seconds.items():
        moved = size * (2 if name.startswith("copy") else 1)  # a copy reads and writes every byte
        rates = sorted(moved / t / 1e9 for t in times)
        report[name] = {"best_gb_s": round(rates[-1], 2), "median_gb_s": round(statistics.median(rates), 2),
                        "worst_gb_s": round(rates[0], 2)}
    return report


def _buffer(size: int, huge_pages: bool) -> np.ndarray:
    """`size` bytes of 1, every page touched before timing: numpy's own (it asks for huge pages), or a mapping
    kept off them."""
    if huge_pages:
        return np.ones(size, np.uint8)
    memory = mmap.mmap(-1, size)
    memory.madvise(mmap.MADV_NOHUGEPAGE)
    array = np.frombuffer(memory, np.uint8)
    array[:] = 1
    return array


def _huge_page_kib() -> int:
    line = next(line for line in Path("/proc/self/smaps_rollup").read_text().splitlines()
                if line.startswith("AnonHugePages"))
    return int(line.split()[1])


def step_bytes(path: Path, position: int) -> dict:
    """Bytes one decode step reads in each format, for the GGUF model at `path`, at `position` cached positions."""
    from typewriter.weights.source import open_source, read_config

    src, _ = open_source(path)
    cfg = read_config(src)
    d, f, v, e = cfg.dim, cfg.hidden_dim, cfg.vocab_size, cfg.head_dim
    qkv_out = (cfg.n_heads + 2 * cfg.n_kv_heads) * e
    # (inputs, outputs, whether its rows go to 16 bits in int8-lite) of each layer's matrices
    layer = [(d, qkv_out, True), (cfg.n_heads * e, d, True), (d, f, False), (d, f, False), (f, d, True)]
    bias = 4 * qkv_out if cfg.qkv_bias else 0
    kv = cfg.n_layers * 2 * cfg.n_kv_heads * e * position * 2  # float16 keys and values
    embedding_row = d * 2

    def int8(inputs: int, outputs: int, two_pass: bool) -> int:
        return (inputs + (2 if two_pass else 0)) * outputs + 4 * outputs

    def blocks(inputs: int, outputs: int, size: int) -> int:
        return inputs * outputs // BLOCK * size

    def exact(t) -> int:  # a tensor of the file in the C format that holds its blocks exactly
        if t.tensor_type.name in ("F32", "F16"):
            return t.data.nbytes
        return int(int(np.prod(t.shape)) // BLOCK * EXACT.get(t.tensor_type.name, Q8))

    lite_layers = cfg.n_layers * (sum(int8(*m) for m in layer) + bias + DOWN_BLOCK**2 * 4)
    fast_layers = cfg.n_layers * (sum(int8(i, o, False) for i, o, _ in layer) + bias + DOWN_BLOCK**2 * 4)
    q4_layers = cfg.n_layers * (sum(blocks(i, o, Q4) for i, o, _ in layer) + bias)
    q4m_layers = cfg.n_layers * (sum(blocks(i, o, Q4M) for i, o, _ in layer) + bias)
    tensors = src.tensors
    output = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    llama_all = sum(t.data.nbytes for name, t in tensors.items() if name != "token_embd.weight" or
                    output == "token_embd.weight")
    llama_logits = tensors[output].data.nbytes
    formats = {
        "int8-lite": (lite_layers, int8(d, v, True)),
        "int8-lite-fast": (fast_layers, int8(d, v, False)),
        "llama.cpp": (llama_all - llama_logits, llama_logits),
        "blocks exact": (sum(exact(t) for name, t in tensors.items() if name != output and
                             (name != "token_embd.weight" or output == name)), exact(tensors[output])),
        "q4m + q8 logits": (q4m_layers, blocks(d, v, Q8)),
        "q4 + q8 logits": (q4_layers, blocks(d, v, Q8)),
    }
    formats["q4-blocks"] = formats["blocks exact"]  # the runtime format that runs them (runners/lite/blocks.py)
    out = {"model": cfg.name, "config": {"dim": d, "hidden": f, "vocab": v, "layers": cfg.n_layers,
                                         "heads": cfg.n_heads, "kv_heads": cfg.n_kv_heads, "head_dim": e},
           "position": position, "kv_bytes": kv, "formats": {}}
    for name, (layers, logits) in formats.items():
        out["formats"][name] = {"layer_bytes": layers, "logits_bytes": logits,
                                "step_bytes": layers + logits + kv + embedding_row}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mib", type=int, default=512, help="buffer size (default %(default)s MiB)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--model", help="a GGUF file: the bytes its step reads, and its floor")
    parser.add_argument("--position", type=int, default=150,
                        help="cached positions of the step (default %(default)s: single_stream.py's middle)")
    parser.add_argument("--measure", action="store_true", help="also run one-student decode, ours and llama.cpp's")
    parser.add_argument("--formats", default="int8-lite", help="our formats to measure (default %(default)s)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--peer-threads", type=int, default=2, help="llama.cpp's threads (default %(default)s)")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    report: dict = {"bandwidth": measure_bandwidth(args.mib, args.repeats)}
    print(json.dumps({"bandwidth": report["bandwidth"]}), flush=True)
    read = report["bandwidth"]["read_2t"]["best_gb_s"] * 1e9
    if args.model:
        sizes = step_bytes(Path(args.model), args.position)
        for row in sizes["formats"].values():
            row["floor_tokens_per_s"] = round(read / row["step_bytes"], 1)
        report["model"] = sizes
        for name, row in sizes["formats"].items():
            print(json.dumps({"format": name, "step_mb": round(row["step_bytes"] / 1e6, 1),
                              "layers_mb": round(row["layer_bytes"] / 1e6, 1),
                              "logits_mb": round(row["logits_bytes"] / 1e6, 1),
                              "kv_mb": round(sizes["kv_bytes"] / 1e6, 1),
                              "floor_tokens_per_s": row["floor_tokens_per_s"]}), flush=True)
    if args.measure:
        if not args.model:
            parser.error("--measure needs --model")
        sys.path.insert(0, str(HERE))
        from single_stream import llama, ours

        from typewriter.commands.bench import TUTOR_QUESTION
        from typewriter.text.tokenizer import Tokenizer

        prompt = Tokenizer.from_gguf(Path(args.model)).encode_chat([{"role": "user", "content": TUTOR_QUESTION}])
        runs = {"llama.cpp": llama(args.model, prompt, args.tokens, args.peer_threads)}
        for fmt in args.formats.split(","):
            runs[fmt] = ours(fmt, args.tokens, args.model)
        report["measured"] = {}
        for name, run in runs.items():
            floor = report["model"]["formats"][name]["floor_tokens_per_s"]
            row = {"tokens_per_s": run["tokens_per_s"], "floor_tokens_per_s": floor,
                   "of_floor": round(run["tokens_per_s"] / floor, 3),
                   "vs_llama_cpp": round(run["tokens_per_s"] / runs["llama.cpp"]["tokens_per_s"], 2)}
            report["measured"][name] = row
            print(json.dumps({"engine": name, **row}), flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
