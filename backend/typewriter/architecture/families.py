"""Model families: what differs between a Llama, a GPT-2 and a Phi-3, each in its own small module. A family is a
name table (canonical tensor name -> where GGUF and Hugging Face keep it, and its shape), a config reader, and,
where its block is not the Llama block, a decoder that overrides the Llama block's pieces (runners/xla/gpt2.py).

    family = family_of_gguf("gpt2")          # or family_of_hf(["GPT2LMHeadModel"]); None: not supported
    table = name_table(cfg.family)           # expected_shapes(cfg), source_names(canonical, GGUF | HF)
"""

from __future__ import annotations

from types import ModuleType

# GGUF `general.architecture` / Hugging Face `architectures` -> family
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gpt2": "gpt2", "phi3": "phi3"}
HF_ARCHITECTURES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "llama", "Qwen2ForCausalLM": "llama",
                    "GPT2LMHeadModel": "gpt2", "Phi3ForCausalLM": "phi3"}
LLAMA_BLOCK = frozenset({"llama", "phi3"})  # families whose block is the Llama block (runners/xla/model.py)


def family_of_gguf(arch: str | None) -> str | None:
    return GGUF_ARCHITECTURES.get(arch or "")


def family_of_hf(archs: list[str]) -> str | None:
    return next((HF_ARCHITECTURES[a] for a in archs if a in HF_ARCHITECTURES), None)


def name_table(family: str) -> ModuleType:
    """The family's name table module: `expected_shapes(cfg)`, `source_names(canonical, source)`,
    `HF_TRANSPOSED` (canonical names Hugging Face stores [in, out]) and, where tensors are fused,
    `fused_part(canonical, cfg)`."""
    if family == "gpt2":
        from . import gpt2_names

        return gpt2_names
    if family == "phi3":
        from . import phi3_names

        return phi3_names
    from . import llama_names as names

    return names


def supported() -> list[tuple[str, str, str]]:
    families = sorted(set(GGUF_ARCHITECTURES.values()) | set(HF_ARCHITECTURES.values()))
    return [(f, ", ".join(a for a, g in GGUF_ARCHITECTURES.items() if g == f),
             ", ".join(a for a, g in HF_ARCHITECTURES.items() if g == f)) for f in families]


def describe() -> str:
    """What `--model` accepts, for `typewriter models` and the --model help."""
    lines = ["--model takes a GGUF file, a Hugging Face model directory (config.json, *.safetensors, tokenizer.json)",
             "or a directory from `typewriter export`; these families load:"]
    for family, gguf, hf in supported():
        lines.append(f"  {family:6} GGUF general.architecture: {gguf}; Hugging Face architectures: {hf}")
    lines += ["tokenizers: byte-level BPE (GGUF 'gpt2', tokenizer.json ByteLevel) and SentencePiece BPE with byte",
              "fallback (GGUF 'llama', tokenizer.json Metaspace or the legacy normalizer); RoPE: plain only (a",
              "rope scaling type is refused at load); GGUF types: F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K-Q6_K"]
    return "\n".join(lines)
