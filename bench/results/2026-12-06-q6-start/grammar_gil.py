"""grammar_gil.py [MODEL]: llguidance's tokenizer for a model's vocabulary (the embedded model's by default), built
as engine/constraints.py builds it (plain, then its slices), with a 1 ms ticker thread beside it (bench/gil_ticker.py):
each part's time and the longest the ticker was held off (the GIL held)."""
import sys
import time
from pathlib import Path

import llguidance

from typewriter.engine import constraints
from typewriter.text.tokenizer import Tokenizer
from typewriter.weights.source import embedded_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gil_ticker import GilTicker

tok = Tokenizer.load(sys.argv[1] if len(sys.argv) > 1 else embedded_model_path())
with GilTicker() as ticker:
    spelled = constraints._ByteVocabulary(tok, tok.vocab_size)
    began = time.perf_counter()
    plain = llguidance.LLTokenizer(llguidance.TokenizerWrapper(spelled), n_vocab=tok.vocab_size,
                                   eos_token=sorted(tok.eos_token_ids), slices=[])
    middle = time.perf_counter()
    spelled.greedy = plain.greedy_tokenize
    plain.with_slices(llguidance.LLTokenizer.general_slices())
    end = time.perf_counter()
print(f"plain {1000 * (middle - began):.0f} ms, with_slices {1000 * (end - middle):.0f} ms, "
      f"longest gap {1000 * ticker.longest_s:.0f} ms")
