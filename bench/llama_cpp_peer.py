"""llama.cpp through llama-cpp-python, in this process: the peer of the single-stream and quality benchmarks.

Built by scripts/build-llama-server.sh (portable CPU flags, cached outside the repo); the binding's Python
sources come from the same sdist and load that build's libllama, so it is never a dependency of ours.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def import_llama_cpp():
    """The llama_cpp module, built (once) by scripts/build-llama-server.sh."""
    done = subprocess.run(["bash", str(REPO / "scripts" / "build-llama-server.sh")], stdout=subprocess.PIPE,
                          text=True, check=True)
    cache = Path(done.stdout.strip().splitlines()[-1]).parents[2]  # CACHE/build/bin/llama-server
    os.environ["LLAMA_CPP_LIB_PATH"] = str(cache / "build" / "bin")
    sys.path[:0] = [str(cache / "src"), str(cache / "pydeps")]
    import llama_cpp

    return llama_cpp


def open_model(path: str, n_ctx: int, logits_all: bool = False, threads: int = 2, draft_model=None):
    """`draft_model`: llama-cpp-python's speculative drafts (a LlamaDraftModel), which keep every position's logits."""
    llama_cpp = import_llama_cpp()
    return llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, logits_all=logits_all,
                           verbose=False, draft_model=draft_model)
