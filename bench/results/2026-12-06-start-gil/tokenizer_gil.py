"""tokenizer_gil.py [MODEL]: whether `tokenizers` lets go of the GIL while it builds a tokenizer (so it could be built
beside the imports): its three ways from files, with bench/gil_ticker.py's 1 ms ticker beside each; the longest the
ticker was held off."""
import json
import sys
import tempfile
import time
from pathlib import Path

from tokenizers import Tokenizer as RawTokenizer
from tokenizers import models

from typewriter.text.tokenizer import Tokenizer
from typewriter.weights.source import embedded_model_path, open_source

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from gil_ticker import GilTicker

path = Path(sys.argv[1]) if len(sys.argv) > 1 else embedded_model_path()
source, _ = open_source(path)
folder = Path(tempfile.mkdtemp())
Tokenizer.from_gguf(path, source.fields).raw.save(str(folder / "tokenizer.json"))
tokens = source.fields["tokenizer.ggml.tokens"]
(folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}))
(folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(source.fields["tokenizer.ggml.merges"]) + "\n")
text = (folder / "tokenizer.json").read_text()


def held_off(name, build):
    with GilTicker() as ticker:
        began = time.perf_counter()
        build()
        took = time.perf_counter() - began
    print(f"{name}: {1000 * took:.0f} ms, the ticker held off {1000 * ticker.longest_s:.0f} ms")


held_off("Tokenizer.from_file(tokenizer.json)", lambda: RawTokenizer.from_file(str(folder / "tokenizer.json")))
held_off("Tokenizer.from_str", lambda: RawTokenizer.from_str(text))
held_off("BPE.from_file(vocab.json, merges.txt)", lambda: models.BPE.from_file(str(folder / "vocab.json"),
                                                                               str(folder / "merges.txt")))
