"""Text in and out: tokenizers, chat templates, incremental detokenizing, stop sequences."""
