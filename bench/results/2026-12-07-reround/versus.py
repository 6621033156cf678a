"""versus.py MODEL SEEDED [ROUNDS]: one student, a token a step, against llama.cpp: our `typewriter bench` on the
file's blocks (mapped from the user's q4-blocks cache, as a server's later start maps them) and on the GPTQ-rounded
ones `reround.py seed` saved in SEEDED, and llama.cpp (llama-cpp-python, 2 threads) on the file, in turn, ROUNDS
rounds. `typewriter bench` itself packs afresh; here it is handed a cache folder instead. From the repository root,
PYTHONPATH=backend:bench."""

import functools
import json
import os
import subprocess
import sys

from single_stream import llama

from typewriter.commands.bench import TUTOR_QUESTION
from typewriter.config import lite_cache_dir
from typewriter.text.tokenizer import Tokenizer

BENCH = """import functools, sys
import typewriter.assemble as a
a.load = functools.partial(a.load, program_cache=sys.argv.pop(1))
from typewriter.cli import run
run()"""


def ours(model: str, folder: str, tokens: int) -> float:
    command = [sys.executable, "-c", BENCH, folder, "bench", "--json", "--streams", "1", "--tokens", str(tokens),
               "--draft-tokens", "0", "--weights", "q4-blocks", "--model", model]
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=True,
                          env=os.environ)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["single_tokens_per_s"])


def main() -> None:
    model, seeded, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 3
    prompt = Tokenizer.from_gguf(__import__("pathlib").Path(model)).encode_chat(
        [{"role": "user", "content": TUTOR_QUESTION}])
    run = functools.partial(ours, model, tokens=128)
    for r in range(1, rounds + 1):
        peer = llama(model, prompt, 128)["tokens_per_s"]
        file_blocks, rounded = run(lite_cache_dir()), run(seeded)
        print(json.dumps({"round": r, "llama.cpp": peer, "file's blocks": file_blocks, "gptq q4k": rounded,
                          "file / llama.cpp": round(file_blocks / peer, 3), "gptq / llama.cpp": round(rounded / peer, 3),
                          "gptq / file": round(rounded / file_blocks, 3)}), flush=True)


if __name__ == "__main__":
    main()
