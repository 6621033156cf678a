"""tokenizer_parts.py [MODEL]: a GGUF's tokenizer in one process, ms, three times each: Tokenizer.from_gguf (what a
load does now: the spellings and the facts from the file's lists), then its BPE built (`prepare`), and the BPE's
two parts alone (the merges split into pairs; `models.BPE` over the vocabulary and the pairs)."""
import sys
import time
from pathlib import Path

from tokenizers import models

from typewriter.text.tokenizer import Tokenizer
from typewriter.weights.source import embedded_model_path, open_source

path = Path(sys.argv[1]) if len(sys.argv) > 1 else embedded_model_path()
fields = open_source(path)[0].fields
ids = {t: i for i, t in enumerate(fields["tokenizer.ggml.tokens"])}
for _ in range(3):
    began = time.perf_counter()
    tokenizer = Tokenizer.from_gguf(path, fields)
    loaded = time.perf_counter()
    tokenizer.prepare()
    built = time.perf_counter()
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
    split = time.perf_counter()
    models.BPE(vocab=ids, merges=merges)
    bpe = time.perf_counter()
    print(f"{path.name}: at load {1000 * (loaded - began):.0f}, the BPE later {1000 * (built - loaded):.0f} "
          f"(pairs {1000 * (split - built):.0f}, models.BPE {1000 * (bpe - split):.0f})")
