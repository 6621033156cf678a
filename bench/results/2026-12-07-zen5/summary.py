"""summary.py: this study's floor-*.json as one table: each run's 2-thread read, one student's tokens/s (q4-blocks,
int8-lite, llama.cpp), q4-blocks ÷ llama.cpp and each one's share of its floor. Run from the repository root."""
import json
from pathlib import Path

here = Path(__file__).parent
print("model run read_2t_GB/s | q4-blocks int8-lite llama.cpp tok/s | q4÷llama int8÷llama | share q4 int8 llama")
for model in ("135m", "0.5b", "1.5b"):
    for f in sorted(here.glob(f"floor-{model}-*.json"), key=lambda p: int(p.stem.rsplit("-", 1)[1])):
        d = json.loads(f.read_text())
        m = d["measured"]
        row = [model, f.stem.rsplit("-", 1)[1], f"{d['bandwidth']['read_2t']['best_gb_s']:.1f}"]
        row += [f"{m[e]['tokens_per_s']:.1f}" if e in m else "-" for e in ("q4-blocks", "int8-lite", "llama.cpp")]
        row += [f"{m[e]['vs_llama_cpp']:.2f}" if e in m else "-" for e in ("q4-blocks", "int8-lite")]
        row += [f"{m[e]['of_floor']:.1%}" if e in m else "-" for e in ("q4-blocks", "int8-lite", "llama.cpp")]
        print(" ".join(row))
