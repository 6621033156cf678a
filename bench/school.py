"""A school's question in one command: the classroom benchmark (classroom.py) on the embedded model for a class of
1, 8, 16 and 32 students, and on a 0.5B model (Qwen2.5-Coder-0.5B-Instruct, scripts/fetch-qwen-0.5b.sh) for 1, 8
and 16, each against llama.cpp's llama-server on the same file.

    .venv/bin/python bench/school.py --json artifacts/school.json

Every other option is classroom.py's, passed on (--turns, --max-new-tokens, --peer-layouts, ...). Run it on an
otherwise idle machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from classroom import parse_args, run
from classroom_report import table

HERE = Path(__file__).resolve().parent
CLASSES = {"embedded": [1, 8, 16, 32], "qwen2.5-0.5b": [1, 8, 16]}


def qwen_model() -> str:
    done = subprocess.run(["bash", str(HERE.parent / "scripts" / "fetch-qwen-0.5b.sh")], stdout=subprocess.PIPE,
                          text=True, check=True)
    return done.stdout.strip().splitlines()[-1]


def main() -> int:
    argv = sys.argv[1:]
    out = None
    if "--json" in argv:
        at = argv.index("--json")
        out, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2:]
    reports = {}
    for name, students in CLASSES.items():
        model = [] if name == "embedded" else ["--model", qwen_model()]
        args = parse_args([*argv, *model, "--students", ",".join(map(str, students))])
        print(f"== {name}: {students} students", file=sys.stderr, flush=True)
        reports[name] = run(args)
        print(f"\n{name}\n{table(reports[name]['sizes'], reports[name]['capacity'])}\n", flush=True)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(reports, indent=2, default=str) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
