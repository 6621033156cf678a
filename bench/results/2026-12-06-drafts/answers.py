"""answers.py MODEL OUT.json [GSM8K]: greedy answers (no drafts, up to 256 tokens) of q4-blocks to bench/drafts.py's
questions, saved with their prompts for policies.py and guesses_by_match.py. MODEL "-": the embedded model. Run from
the repository root with PYTHONPATH=backend."""
import json
import sys

sys.path.insert(0, "bench")
from drafts import questions

from typewriter.assemble import load
from typewriter.config import lite_cache_dir
from typewriter.engine.request import GenerationRequest, SamplingParams, Token

model = None if sys.argv[1] == "-" else sys.argv[1]
engine, tokenizer, _ = load(model, slots=1, max_context=2048, max_queue=0, prefill_budget=16,
                            weight_format="q4-blocks", program_cache=lite_cache_dir(), draft_tokens=0)
saved = []
for kind, asked in questions(int(sys.argv[3]) if len(sys.argv) > 3 else 8).items():
    for i, question in enumerate(asked):
        prompt = tokenizer.encode_chat([{"role": "user", "content": question}])
        request = GenerationRequest(f"{kind}{i}", prompt, SamplingParams(max_new_tokens=256, temperature=0.0))
        ids = [e.token_id for e in engine.stream(request) if isinstance(e, Token)]
        saved.append({"kind": kind, "prompt": prompt, "answer": ids})
engine.shutdown()
with open(sys.argv[2], "w") as f:
    json.dump(saved, f)
