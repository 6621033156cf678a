"""4-bit weights for int8-lite, the research prototype (issue 40): what one matrix costs a call, at one row (a
student's decode step) and at a few rows (a batch), in each candidate format, against today's int8 in LiteRT.

    .venv/bin/python bench/q4_kernels.py [--models 135m,0.5b,1.5b] [--rows 1,2,8,32] [--variants ...]
        [--mib 160] [--repeats 7] [--json artifacts/q4-kernels.json]
    .venv/bin/python bench/q4_kernels.py --chain [--models 135m]   # every matrix of a decode step, one row

Variants (random weights at the models' shapes; speed does not depend on their values):
- lite-int8: today's int8-lite matmul, a FULLY_CONNECTED with int8 weights one scale per output column, float
  rows that XNNPACK quantizes to 8 bits (runners/lite/flatbuffer.py).
- lite-int4-channel: the same with an INT4 filter, one scale per output column (XNNPACK's qc4w kernels).
- lite-int4-block32: an INT4 filter with BlockwiseQuantization, 32 input channels a block, float16 scales
  (XNNPACK's qb4w kernels; bench/q4_1_exact.py's format).
- c-q4, c-q4m, c-q8: bench/c/q4_matmul.c, blocks of 32 with a float16 scale at 4 bits (18 bytes a block), with
  a float16 minimum too (GGUF's Q4_1, 20 bytes) or at 8 bits (34), rows quantized to 8 bits a block, AVX-512 VNNI
  (or AVX2 with `-avx2`), two threads (or one with `-1t`); `-4k` keeps its weights off huge pages, as XNNPACK's
  packed copy is (bench/bandwidth.py measures both).

A call reads weights that are not in any cache, as a decode step does: each variant holds enough copies of the
matrix (at least --mib MiB of them) and calls them in turn, all from one program (LiteRT: one interpreter with
the copies side by side on the same input) or one C call (c-*); `-py` calls the C kernel once per matrix from
Python instead. Reported per variant, shape and rows: microseconds a call (median and best of the repeats, the
variants interleaved), the GB/s of weight bytes that makes, and the ratio to lite-int8's median time.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
BLOCK = 32


def shapes(dim: int, hidden: int, vocab: int, heads: int, kv_heads: int, head_dim: int) -> dict:
    """(inputs, outputs) of a layer's matrices and of the logits."""
    return {"qkv": (dim, (heads + 2 * kv_heads) * head_dim), "o": (heads * head_dim, dim), "gate/up": (dim, hidden),
            "down": (hidden, dim), "logits": (dim, vocab)}


MODELS = {  # the shapes of each model (its GGUF's config), and its layers
    "135m": (shapes(576, 1536, 49152, 9, 3, 64), 30),  # SmolLM2-135M, embedded
    "0.5b": (shapes(896, 4864, 151936, 14, 2, 64), 24),  # Qwen2.5-0.5B
    "1.5b": (shapes(1536, 8960, 151936, 12, 2, 128), 28),  # Qwen2.5-1.5B
}
LAYER = ("qkv", "o", "gate/up", "gate/up", "down")
VARIANTS = "lite-int8,lite-int4-channel,lite-int4-block32,c-q4,c-q4-1t,c-q4-4k,c-q4-py,c-q4m,c-q8,c-q4-avx2"
FORMATS = {"c-q4": 4, "c-q4m": 41, "c-q8": 8}  # bench/c/q4_matmul.c's `format`


def weight_bytes(variant: str, inputs: int, outputs: int) -> int:
    """Bytes of weights (and their scales) one call reads."""
    if variant == "lite-int8":
        return inputs * outputs + 4 * outputs
    if variant == "lite-int4-channel":
        return inputs * outputs // 2 + 4 * outputs
    if variant == "lite-int4-block32":
        return inputs * outputs // 2 + inputs // BLOCK * outputs * 2
    return inputs // BLOCK * outputs * block_bytes(c_format(variant))


def c_format(variant: str) -> int:
    return next(f for name, f in FORMATS.items() if variant == name or variant.startswith(name + "-"))


def block_bytes(fmt: int) -> int:
    """Bytes of one output's block of 32 weights in the C kernel's `fmt`."""
    return {4: 18, 41: 20, 8: 34}[fmt]


# ---- LiteRT programs ----

def lite_program(variant: str, inputs: int, outputs: int, copies: int, rows: int, rng) -> bytes:
    """`copies` FULLY_CONNECTED ops side by side on one input [rows, inputs], each with its own weights."""
    sys.path.insert(0, str(HERE.parent / "backend"))
    from typewriter.runners.lite.flatbuffer import ProgramBuilder

    p = ProgramBuilder(rows)
    x = p.input(inputs)
    outs = []
    for _ in range(copies):
        if variant == "lite-int8":
            q = rng.integers(-127, 128, (inputs, outputs), dtype=np.int8)
            outs.append(p._int8_rows(x, q, rng.uniform(1e-3, 2e-3, outputs).astype(np.float32)))
        else:
            outs.append(_int4_matmul(p, x, inputs, outputs, variant == "lite-int4-block32", rng))
    return p.finish(outs)


def _int4_matmul(p, x: int, inputs: int, outputs: int, blockwise: bool, rng) -> int:
    s = p.s
    nibbles = rng.integers(0, 256, (outputs, inputs // 2), dtype=np.uint8)  # [out, in], two a byte, even low
    quant = s.QuantizationParametersT()
    if blockwise:
        scales = p._tensor([outputs, inputs // BLOCK], s.TensorType.FLOAT16,
                           rng.uniform(1e-3, 2e-3, (outputs, inputs // BLOCK)).astype(np.float16))
        quant.details = s.BlockwiseQuantizationT()
        quant.details.scales, quant.details.zeroPoints, quant.details.blockSize = scales, -1, BLOCK
        quant.detailsType = s.QuantizationDetails.BlockwiseQuantization
    else:
        quant.scale = rng.uniform(1e-3, 2e-3, outputs).astype(np.float32)
        quant.zeroPoint = np.zeros(outputs, np.int64)
        quant.quantizedDimension = 0
    w = p._tensor([outputs, inputs], s.TensorType.INT4, nibbles, quant)
    options = s.FullyConnectedOptionsT()
    options.asymmetricQuantizeInputs = True
    return p._op(s.BuiltinOperator.FULLY_CONNECTED, [x, w, -1], [p.shape(x)[0], outputs],
                 s.BuiltinOptions.FullyConnectedOptions, options)


class Lite:
    def __init__(self, variant: str, inputs: int, outputs: int, copies: int, rows: int, rng):
        sys.path.insert(0, str(HERE.parent / "backend"))
        from typewriter.runners.lite.interpreter import lite_interpreter

        self.interpreter = lite_interpreter(lite_program(variant, inputs, outputs, copies, rows, rng), threads=2)
        self.index = self.interpreter.get_input_details()[0]["index"]
        self.x = rng.standard_normal((rows, inputs), dtype=np.float32)

    def __call__(self) -> None:
        self.interpreter.set_tensor(self.index, self.x)
        self.interpreter.invoke()


# ---- the C kernel ----

def c_library(avx2: bool = False):
    sys.path.insert(0, str(HERE))
    from c_build import cpu_flags, load

    wide = not avx2 and {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= cpu_flags()
    flags = ("-mavx2", "-mfma", "-mf16c") + (("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni") if wide else ())
    library = load("q4_matmul.c", flags)
    p = ctypes.c_void_p
    library.q4_pack.argtypes = [p, p, p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, p]
    library.q4_matmul.argtypes = [p, p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, p, p,
                                  ctypes.c_int]
    library.q4_matmul_many.argtypes = [ctypes.c_int, p, p, ctypes.c_int, ctypes.c_int64, p, p, ctypes.c_int, p, p,
                                       ctypes.c_int]
    return library


def random_blocks(rng, fmt: int, inputs: int, outputs: int):
    """Random q [out, in] int8 in `fmt`'s range, scales and minimums [out, in / 32] float16."""
    low, high = {4: (-8, 8), 41: (0, 16), 8: (-127, 128)}[fmt]
    q = rng.integers(low, high, (outputs, inputs), dtype=np.int8)
    scales = rng.uniform(1e-3, 2e-3, (outputs, inputs // BLOCK)).astype(np.float16)
    mins = rng.uniform(-2e-2, -1e-2, (outputs, inputs // BLOCK)).astype(np.float16)
    return q, scales, mins


def pack(library, q: np.ndarray, scales: np.ndarray, mins: np.ndarray, fmt: int, huge_pages: bool = True
         ) -> np.ndarray:
    """q [out, in] int8, scales and minimums [out, in / 32] float16 -> the kernel's layout, on huge pages (numpy's
    own large arrays ask for them) or kept off them."""
    outputs, inputs = q.shape
    size = inputs // BLOCK * outputs * block_bytes(fmt)
    if huge_pages:
        packed = np.empty(size, np.uint8)
    else:
        memory = mmap.mmap(-1, size)
        memory.madvise(mmap.MADV_NOHUGEPAGE)
        packed = np.frombuffer(memory, np.uint8)
    library.q4_pack(q.ctypes.data, scales.ctypes.data, mins.ctypes.data, inputs, outputs, fmt, packed.ctypes.data)
    return packed


def reference(q: np.ndarray, scales: np.ndarray, mins: np.ndarray | None, x: np.ndarray) -> np.ndarray:
    """What the kernel computes, in numpy: x's blocks rounded to 8 bits as it rounds them, times the weights."""
    rows, inputs = x.shape
    xb = x.reshape(rows, inputs // BLOCK, BLOCK)
    dx = np.abs(xb).max(-1, keepdims=True) / 127
    xq = np.rint(xb / np.where(dx == 0, 1, dx)) * dx
    w = q.astype(np.float32).reshape(q.shape[0], -1, BLOCK) * scales.astype(np.float32)[..., None]
    if mins is not None:
        w += mins.astype(np.float32)[..., None]
    return xq.reshape(rows, inputs) @ w.reshape(q.shape).T


class C:
    def __init__(self, variant: str, inputs: int, outputs: int, copies: int, rows: int, rng):
        self.library = c_library(avx2="avx2" in variant)
        self.fmt = c_format(variant)
        self.threads = 1 if variant.endswith("-1t") else 2
        self.per_call = variant.endswith("-py")
        self.weights = [pack(self.library, *random_blocks(rng, self.fmt, inputs, outputs), self.fmt,
                             huge_pages=not variant.endswith("-4k")) for _ in range(copies)]
        self.x = rng.standard_normal((rows, inputs), dtype=np.float32)
        self.y = [np.empty((rows, outputs), np.float32) for _ in range(copies)]
        self.scratch = np.empty(rows * inputs * 6 + 128, np.uint8)
        self.shape = (rows, inputs, outputs)
        self.ins, self.outs = np.full(copies, inputs, np.int64), np.full(copies, outputs, np.int64)
        self.packed_at = (ctypes.c_void_p * copies)(*(w.ctypes.data for w in self.weights))
        self.y_at = (ctypes.c_void_p * copies)(*(y.ctypes.data for y in self.y))

    def __call__(self) -> None:
        rows, inputs, outputs = self.shape
        if self.per_call:
            for w, y in zip(self.weights, self.y):
                self.library.q4_matmul(w.ctypes.data, self.x.ctypes.data, rows, inputs, outputs, self.fmt,
                                       y.ctypes.data, self.scratch.ctypes.data, self.threads)
            return
        self.library.q4_matmul_many(len(self.weights), self.packed_at, self.x.ctypes.data, rows, inputs,
                                    self.ins.ctypes.data, self.outs.ctypes.data, self.fmt, self.y_at,
                                    self.scratch.ctypes.data, self.threads)


def check_kernel(rng) -> dict:
    """The kernel against numpy on one shape, every format and both instruction sets: the largest error relative
    to the outputs' largest magnitude."""
    out = {}
    for avx2 in (False, True):
        library = c_library(avx2)
        for name, fmt in FORMATS.items():
            inputs, outputs, rows = 576, 960, 11
            q, scales, mins = random_blocks(rng, fmt, inputs, outputs)
            x = rng.standard_normal((rows, inputs), dtype=np.float32)
            y = np.empty((rows, outputs), np.float32)
            scratch = np.empty(rows * inputs * 2 + 64, np.uint8)
            packed = pack(library, q, scales, mins, fmt)  # held: ctypes keeps only its address
            library.q4_matmul(packed.ctypes.data, x.ctypes.data, rows, inputs, outputs, fmt, y.ctypes.data,
                              scratch.ctypes.data, 2)
            want = reference(q, scales, mins if fmt == 41 else None, x)
            out[name + ("-avx2" if avx2 else "")] = float(np.abs(y - want).max() / np.abs(want).max())
    return out


def make(variant: str, inputs: int, outputs: int, copies: int, rows: int, rng):
    return (Lite if variant.startswith("lite") else C)(variant, inputs, outputs, copies, rows, rng)


def timed(call, repeats: int) -> list[float]:
    call()  # packs, allocates, warms the helper thread
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def run_shapes(args, rng) -> list[dict]:
    results = []
    variants = args.variants.split(",")
    for model in args.models.split(","):
        kinds, _ = MODELS[model]
        for kind, (inputs, outputs) in kinds.items():
            copies = max(1, -(-(args.mib << 20) // (inputs * outputs)))  # int8's bytes: the most any variant reads
            for rows in (int(r) for r in args.rows.split(",")):
                calls = {v: make(v, inputs, outputs, copies, rows, rng) for v in variants}
                times: dict[str, list[float]] = {v: [] for v in variants}
                for _ in range(args.repeats):  # interleaved: a busy moment of the machine touches each alike
                    for v, call in calls.items():
                        times[v] += timed(call, 1)
                base = statistics.median(times[variants[0]]) / copies
                for v in variants:
                    median, best = statistics.median(times[v]) / copies, min(times[v]) / copies
                    row = {"model": model, "matrix": kind, "inputs": inputs, "outputs": outputs, "rows": rows,
                           "variant": v, "copies": copies, "us_median": round(median * 1e6, 1),
                           "us_best": round(best * 1e6, 1),
                           "gb_s_median": round(weight_bytes(v, inputs, outputs) / median / 1e9, 2),
                           "gb_s_best": round(weight_bytes(v, inputs, outputs) / best / 1e9, 2),
                           f"vs_{variants[0]}": round(base / median, 2)}
                    results.append(row)
                    print(json.dumps(row), flush=True)
                del calls
    return results


def run_chain(args, rng) -> list[dict]:
    """Every matrix of one decode step in order (the layers', then the logits), one row: LiteRT's int8 as one
    program against the C kernel's formats (all in one C call; `-py`: a call per matrix from Python), the variants
    interleaved."""
    results = []
    for model in args.models.split(","):
        kinds, layers = MODELS[model]
        order = [kinds[k] for _ in range(layers) for k in LAYER] + [kinds["logits"]]
        calls = {"lite-int8": _lite_chain(order, rng), "c-q4": _c_chain(order, rng, 4, one_call=True),
                 "c-q4-1t": _c_chain(order, rng, 4, one_call=True, threads=1), "c-q4-py": _c_chain(order, rng, 4),
                 "c-q4m": _c_chain(order, rng, 41, one_call=True), "c-q8": _c_chain(order, rng, 8, one_call=True)}
        times: dict[str, list[float]] = {v: [] for v in calls}
        for _ in range(args.repeats):  # interleaved
            for v, call in calls.items():
                times[v] += timed(call, 1)
        for v, ts in times.items():
            total = sum(weight_bytes(v, i, o) for i, o in order)
            row = {"model": model, "chain": len(order), "variant": v,
                   "ms_median": round(statistics.median(ts) * 1e3, 2), "ms_best": round(min(ts) * 1e3, 2),
                   "mb": round(total / 1e6, 1),
                   "gb_s_median": round(total / statistics.median(ts) / 1e9, 2),
                   "vs_lite-int8": round(statistics.median(times["lite-int8"]) / statistics.median(ts), 2)}
            results.append(row)
            print(json.dumps(row), flush=True)
    return results


def _lite_chain(order, rng):
    """The step's matrices as one LiteRT program: one input per width, each FULLY_CONNECTED reading the input of
    its width, every output a program output; XNNPACK runs them in the program's order."""
    sys.path.insert(0, str(HERE.parent / "backend"))
    from typewriter.runners.lite.flatbuffer import ProgramBuilder
    from typewriter.runners.lite.interpreter import lite_interpreter

    p = ProgramBuilder(1)
    inputs_by_width: dict[int, int] = {}
    outs = []
    for inputs, outputs in order:
        if inputs not in inputs_by_width:
            inputs_by_width[inputs] = p.input(inputs)
        q = rng.integers(-127, 128, (inputs, outputs), dtype=np.int8)
        outs.append(p._int8_rows(inputs_by_width[inputs], q, rng.uniform(1e-3, 2e-3, outputs).astype(np.float32)))
    interpreter = lite_interpreter(p.finish(outs), threads=2)
    feeds = [(d["index"], rng.standard_normal(d["shape"], dtype=np.float32))
             for d in interpreter.get_input_details()]

    def call():
        for index, x in feeds:
            interpreter.set_tensor(index, x)
        interpreter.invoke()

    return call


def _c_chain(order, rng, fmt: int, one_call: bool = False, threads: int = 2):
    """The step's matrices through the C kernel: a call from Python per matrix, as a runtime that keeps its
    layers' other ops elsewhere would make them, or (`one_call`) all of them in one C call."""
    library = c_library()
    weights, outs = [], []
    for inputs, outputs in order:
        weights.append(pack(library, *random_blocks(rng, fmt, inputs, outputs), fmt))
        outs.append(np.empty((1, outputs), np.float32))
    width = max(i for i, _ in order)
    x = rng.standard_normal((1, width), dtype=np.float32)
    scratch = np.empty(width * 6 + 128, np.uint8)
    xs = {i: np.ascontiguousarray(x[:, :i]) for i, _ in order}
    ins, outs_n = (np.array([s[k] for s in order], np.int64) for k in (0, 1))
    packed_at = (ctypes.c_void_p * len(order))(*(w.ctypes.data for w in weights))
    y_at = (ctypes.c_void_p * len(order))(*(y.ctypes.data for y in outs))

    def each():
        for (inputs, outputs), w, y in zip(order, weights, outs):
            library.q4_matmul(w.ctypes.data, xs[inputs].ctypes.data, 1, inputs, outputs, fmt, y.ctypes.data,
                              scratch.ctypes.data, threads)

    def together():
        library.q4_matmul_many(len(order), packed_at, x.ctypes.data, 1, width, ins.ctypes.data, outs_n.ctypes.data,
                               fmt, y_at, scratch.ctypes.data, threads)

    call = together if one_call else each
    call.held = (weights, outs)  # ctypes keeps only their addresses
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="135m,0.5b,1.5b")
    parser.add_argument("--rows", default="1,2,8,32")
    parser.add_argument("--variants", default=VARIANTS, help="the first is the baseline of the ratios")
    parser.add_argument("--mib", type=int, default=160, help="int8 MiB of copies of each matrix (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--chain", action="store_true", help="a whole step's matrices instead, one row")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    check = check_kernel(rng)
    print(json.dumps({"kernel_max_relative_error": check}), flush=True)
    results = run_chain(args, rng) if args.chain else run_shapes(args, rng)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"check": check, "results": results}, indent=2))


if __name__ == "__main__":
    main()
