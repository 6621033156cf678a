"""Load-to-ready of the GGUF file against the SavedModel exported from it, in one run.

    .venv/bin/python bench/saved_model.py --json artifacts/saved_model.json

Exports the embedded model (`typewriter export`, timed) to a temporary folder, then starts `typewriter serve`
on each source in turns (GGUF, SavedModel, GGUF, ...), each time measuring launch -> GET /readyz 200 and the
"loaded ... in N s" that the server logs (reading the weights and building the model, before any compile).
Both share the XLA cache, so after the first round the compiles are cache reads for both: the difference is
reading the weights. Reported: the median of the rounds for each and the ratio SavedModel / GGUF.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from classroom_servers import HOST, Server, embedded_model, free_port

LOADED = re.compile(r"loaded .* in ([0-9.]+)s")


def serve_once(model: str) -> dict:
    port = free_port()
    argv = [sys.executable, "-m", "typewriter", "serve", "--host", HOST, "--port", str(port), "--model", model]
    started = time.monotonic()
    with Server("typewriter", argv, port, "/readyz").start(timeout_s=600, poll_s=0.1) as server:
        ready_s = time.monotonic() - started
        found = LOADED.search(server.log.read_text())
        rss_mb = server.status("VmHWM") / 1024
    return {"ready_s": round(ready_s, 2), "load_s": float(found.group(1)) if found else None,
            "peak_rss_mb": round(rss_mb)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    gguf = embedded_model()
    with tempfile.TemporaryDirectory(prefix="typewriter-export-") as tmp:
        saved = str(Path(tmp) / "savedmodel")
        started = time.monotonic()
        subprocess.run([sys.executable, "-m", "typewriter", "export", "--model", gguf, "--out", saved], check=True)
        export_s = time.monotonic() - started
        size_mb = sum(f.stat().st_size for f in Path(saved).rglob("*") if f.is_file()) / 1e6
        serve_once(gguf)  # the XLA cache holds the first programs from here on, for both
        runs = {"gguf": [], "saved_model": []}
        for _ in range(args.rounds):
            for name, model in (("gguf", gguf), ("saved_model", saved)):
                runs[name].append(serve_once(model))
                print(name, runs[name][-1], flush=True)
    medians = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    result = {"export_s": round(export_s, 1), "saved_model_mb": round(size_mb), "gguf_mb": round(
        Path(gguf).stat().st_size / 1e6), **medians,
        "saved_model_over_gguf": {k: round(medians["saved_model"][k] / medians["gguf"][k], 3) for k in
                                  ("ready_s", "load_s")}}
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rounds": runs, "summary": result}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
