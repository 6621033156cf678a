"""phases.py [MODEL]: the cached load in one process (assemble.open_runner), with when the tokenizer starts and
ends, when some program files' digests end and when some interpreters are made, by thread."""

import sys
import threading
import time

from typewriter import assemble
from typewriter.config import WeightFormat, lite_cache_dir
from typewriter.runners.lite import program_cache
from typewriter.runners.lite import runner as runner_module
from typewriter.runners.options import RunnerOptions

T0 = time.perf_counter()
SHOWN = ("embeddings.npy", "first.tflite", "logits.tflite", "layer0.tflite")


def at(message: str) -> None:
    print(f"{time.perf_counter() - T0:6.3f} [{threading.current_thread().name[:20]}] {message}", flush=True)


def main() -> None:
    at("imported")
    tokenizer, digest, interpreter = assemble._tokenizer, program_cache._digest, runner_module.lite_interpreter

    def timed_tokenizer(*args):
        at("tokenizer start")
        made = tokenizer(*args)
        at("tokenizer end")
        return made

    def timed_digest(path):
        t = time.perf_counter()
        done = digest(path)
        if path.name in SHOWN or path.name.startswith("layer2"):
            at(f"digest {path.name} {1000 * (time.perf_counter() - t):.0f}ms")
        return done

    def timed_interpreter(path, threads):
        made = interpreter(path, threads)
        if path.name in SHOWN:
            at(f"interpreter {path.name}")
        return made

    assemble._tokenizer, program_cache._digest = timed_tokenizer, timed_digest
    runner_module.lite_interpreter = timed_interpreter
    assemble.open_runner(sys.argv[1] if len(sys.argv) > 1 else None,
                         RunnerOptions(WeightFormat.AUTO, 2048, None, lite_cache_dir(), "start"), at)
    at("opened")


if __name__ == "__main__":
    main()
