"""gil.py MODEL: how long the constraints' warm-up (Grammars.warm) holds the GIL: the longest gap of a 1 ms sleep
loop beside it, and the sum of gaps over 50 ms."""

import sys
import threading
import time

from typewriter.engine.constraints import Grammars
from typewriter.text.tokenizer import Tokenizer


def main() -> None:
    tokenizer = Tokenizer.from_gguf(sys.argv[1])
    grammars = Grammars(tokenizer, tokenizer.vocab_size)
    done = threading.Event()

    def warm() -> None:
        t = time.perf_counter()
        grammars.warm()
        print(f"warm {time.perf_counter() - t:.2f}s")
        done.set()

    threading.Thread(target=warm).start()
    gaps, last = [], time.perf_counter()
    while not done.is_set():
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now
    print(f"longest gap {1000 * max(gaps):.0f} ms, gaps over 50 ms {sum(g for g in gaps if g > 0.05):.2f}s")


if __name__ == "__main__":
    main()
