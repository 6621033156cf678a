"""How often the embedded model loops, per repetition penalty: the measurement behind the default of 1.1.

    .venv/bin/python bench/repetition.py 1.0 1.1

Each penalty answers 3 tutoring questions with 3 seeds (450 tokens, the default temperature and system prompt,
all 9 batched in one engine). An answer counts as looping when under 80% of its word 4-grams are distinct.
"""

from __future__ import annotations

import queue
import sys

from typewriter.runners.xla.tf_env import prepare_environment

QUESTIONS = ["Explain fractions to me with a short list.", "Why do we need to learn algebra?",
             "Tell me about the water cycle."]


def distinct_4grams(text: str) -> float:
    words = text.split()
    grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
    return len(set(grams)) / max(1, len(grams))


def main(penalties: list[float]) -> None:
    prepare_environment(None)
    from typewriter.assemble import load
    from typewriter.engine.request import Finished, GenerationRequest, SamplingParams, Token

    # The 9 answers are submitted at once to 9 slots, so every one finds a slot free and none waits.
    engine, tokenizer, _ = load(None, slots=9, max_context=1024, max_queue=0, prefill_budget=256)
    try:
        for penalty in penalties:
            events: queue.SimpleQueue = queue.SimpleQueue()
            texts: dict[str, str] = {}
            for q, question in enumerate(QUESTIONS):
                ids = tokenizer.encode_chat([{"role": "user", "content": question}])
                for seed in range(3):
                    rid = f"{penalty}-{q}-{seed}"
                    texts[rid] = ""
                    params = SamplingParams(max_new_tokens=450, seed=seed, repetition_penalty=penalty)
                    engine.submit(GenerationRequest(rid, ids, params), events.put)
            done = 0
            while done < len(texts):
                event = events.get()
                if isinstance(event, Token):
                    texts[event.request_id] += event.text
                elif isinstance(event, Finished):
                    done += 1
            scores = [distinct_4grams(t) for t in texts.values()]
            looping = sum(s < 0.8 for s in scores)
            print(f"repetition_penalty {penalty}: {looping} of {len(scores)} answers loop "
                  f"(distinct 4-grams mean {sum(scores) / len(scores):.2f}, min {min(scores):.2f})", flush=True)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main([float(a) for a in sys.argv[1:]] or [1.0, 1.1])
