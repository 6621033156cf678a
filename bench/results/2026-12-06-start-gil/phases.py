"""phases.py [MODEL]: the parts of a cached q4-blocks start that hold the GIL or both cores, one after another in one
process (run it from a tree's root with PYTHONPATH=backend, TYPEWRITER_LITE_CACHE naming the tree's cache): the GGUF's
header and token lists, the tokenizer, its wordy tokens, the check of the cached blocks (two threads), llguidance's
tokenizers; each the best of three, in ms."""
import sys
import time
from pathlib import Path

import llguidance
import numpy as np

from typewriter.assemble import weights_for
from typewriter.config import lite_cache_dir
from typewriter.engine import constraints
from typewriter.runners.lite import blocks_cache
from typewriter.runners.lite.program_cache import ProgramCache, cache_key
from typewriter.text.tokenizer import Tokenizer
from typewriter.weights.source import embedded_model_path, open_source, read_config


def best(fn, times=3):
    took = []
    for _ in range(times):
        began = time.perf_counter()
        out = fn()
        took.append(time.perf_counter() - began)
    return out, 1000 * min(took)


path = Path(sys.argv[1]) if len(sys.argv) > 1 else embedded_model_path()
(source, _), parse_ms = best(lambda: open_source(path))
tok, tokenizer_ms = best(lambda: Tokenizer.from_gguf(path, source.fields))
_, wordy_ms = best(lambda: type(tok.token_text)(tok.token_text.table, tok.token_text.leading_space).wordy)
cfg = read_config(source)
entry = ProgramCache(lite_cache_dir()).entry(cache_key(path, cfg, weights_for(cfg).value, blocks_cache.LAYOUT))
if entry is not None:
    mapped = np.memmap(entry / blocks_cache.BLOCKS, np.uint8, mode="r")
    _, check_ms = best(lambda: blocks_cache._digests(mapped))
    check = f"check of {len(mapped) >> 20} MiB {check_ms:.0f}"
else:
    check = "no cached blocks"
spelled = constraints._ByteVocabulary(tok, tok.vocab_size)
began = time.perf_counter()
plain = llguidance.LLTokenizer(llguidance.TokenizerWrapper(spelled), n_vocab=tok.vocab_size,
                               eos_token=sorted(tok.eos_token_ids), slices=[])
middle = time.perf_counter()
plain.with_slices(llguidance.LLTokenizer.general_slices())
end = time.perf_counter()
print(f"{path.name}: parse {parse_ms:.0f}, tokenizer {tokenizer_ms:.0f}, wordy {wordy_ms:.0f}, {check}, "
      f"llguidance plain {1000 * (middle - began):.0f} + slices {1000 * (end - middle):.0f}")
