"""grammar_gil.py: llguidance's tokenizer for the embedded model's vocabulary, built as engine/constraints.py builds
it (plain, then its slices), with a 1 ms ticker thread beside it: each part's time and the longest the ticker was
held off (the GIL held)."""
import threading
import time

import llguidance

from typewriter.engine import constraints
from typewriter.text.tokenizer import Tokenizer
from typewriter.weights.source import embedded_model_path

tok = Tokenizer.load(embedded_model_path())
gaps: list[float] = []
stop = False


def ticker() -> None:
    last = time.perf_counter()
    while not stop:
        time.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


thread = threading.Thread(target=ticker)
thread.start()
time.sleep(0.05)
spelled = constraints._ByteVocabulary(tok, tok.vocab_size)
began = time.perf_counter()
plain = llguidance.LLTokenizer(llguidance.TokenizerWrapper(spelled), n_vocab=tok.vocab_size,
                               eos_token=sorted(tok.eos_token_ids), slices=[])
middle = time.perf_counter()
spelled.greedy = plain.greedy_tokenize
plain.with_slices(llguidance.LLTokenizer.general_slices())
end = time.perf_counter()
time.sleep(0.02)
stop = True
thread.join()
print(f"plain {1000 * (middle - began):.0f} ms, with_slices {1000 * (end - middle):.0f} ms, "
      f"longest gap {1000 * max(gaps):.0f} ms")
