"""How cost grows with a model's size: start-up, memory, one student's speed and a class's capacity against
llama.cpp's llama-server on the same file, at 135M (the embedded model), 360M and 1.7B (SmolLM2's shapes with
random weights: scripts/make-synthetic-model.py) and 0.5B (Qwen2.5-Coder-0.5B-Instruct: scripts/fetch-qwen-0.5b.sh).

    .venv/bin/python bench/sizes.py --json artifacts/sizes.json [--sizes 135m,360m,0.5b,1.7b] [--students 1,8,16]

For each model: bench/start.py (ready cold and warm, peak and steady RSS, both servers at 8 slots and 2,048 tokens
of context each) and bench/classroom.py at the class sizes given (our server at its own slot count). The random
models' answers are noise, which costs the same to compute. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from classroom import parse_args as classroom_args
from classroom import run as classroom
from classroom_servers import build_llama_server, embedded_model

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE.parent / "scripts"


def model_path(size: str) -> str:
    if size == "135m":
        return embedded_model()
    command = [str(SCRIPTS / "fetch-qwen-0.5b.sh")] if size == "0.5b" else \
        [sys.executable, str(SCRIPTS / "make-synthetic-model.py"), size]
    return subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True).stdout.strip().splitlines()[-1]


def start(model: str, peer: str) -> dict:
    out = Path("artifacts") / f"start-{Path(model).stem}.json"
    subprocess.run([sys.executable, str(HERE / "start.py"), "--model", model, "--llama-server", peer, "--json",
                    str(out)], check=True)
    return json.loads(out.read_text())


def row(size: str, s: dict, c: dict) -> dict:
    by = {x["students"]: x for x in c["sizes"]}
    one = by.get(1, {})
    return {"size": size, "ready_cold_s": s["ours_cold"]["ready_s"], "ready_warm_s": s["ours_warm"]["ready_s"],
            "peer_ready_s": s["llama_server"]["ready_s"], "peak_rss_mb": s["ours_cold"]["peak_rss_mb"],
            "rss_mb": s["ours_warm"]["rss_mb"], "peer_rss_mb": s["llama_server"]["rss_mb"],
            "one_student_tokens_per_s": one.get("ours", {}).get("tokens_per_s"),
            "peer_one_student_tokens_per_s": one.get("peer", {}).get("tokens_per_s"),
            "capacity": c["capacity"]["ours"], "peer_capacity": c["capacity"]["peer"],
            "slots": c["config"].get("ours_slots")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="135m,360m,0.5b,1.7b")
    parser.add_argument("--students", default="1,8,16")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    peer = build_llama_server()
    rows, raw = [], {}
    for size in args.sizes.split(","):
        model = model_path(size)
        print(f"== {size}: {model}", file=sys.stderr, flush=True)
        s = start(model, peer)
        c = classroom(classroom_args(["--model", model, "--students", args.students, "--turns", "2",
                                      "--max-new-tokens", "128", "--peer-layouts", "default", "--peer-bin", peer]))
        raw[size] = {"start": s, "classroom": c}
        rows.append(row(size, s, c))
        print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "raw": raw}, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
