"""tokenizer_json.py GGUF: would a tokenizer cached as tokenizer.json load faster than one built from the GGUF's
lists? The GGUF parse, the build, and `tokenizers.Tokenizer.from_file` of the same tokenizer saved."""
import os
import sys
import tempfile
import time

from tokenizers import Tokenizer

from typewriter.text.gguf_tokenizer import raw_tokenizer_from_gguf
from typewriter.weights.gguf_reader import GGUFReader

path = sys.argv[1]
began = time.perf_counter()
fields = GGUFReader(path).fields
parsed = time.perf_counter()
raw = raw_tokenizer_from_gguf(path, fields)
built = time.perf_counter()
with tempfile.TemporaryDirectory() as folder:
    saved = os.path.join(folder, "tokenizer.json")
    raw.save(saved)
    before = time.perf_counter()
    Tokenizer.from_file(saved)
    loaded = time.perf_counter()
    size = os.path.getsize(saved) >> 20
print(f"GGUF parse {parsed - began:.3f} s, build {built - parsed:.3f} s; from_file {loaded - before:.3f} s ({size} MB)")
