"""weights/ggml_types.py against the installed gguf-py: every type both know has one name, number and block size;
a type only one of them knows is refused by name when a tensor of it is asked for."""

import gguf

from typewriter.weights.ggml_types import GGML_QUANT_SIZES, GGMLQuantizationType


def test_every_type_both_know_has_the_same_number_and_block_as_gguf_py():
    theirs = {t.name: t for t in gguf.GGMLQuantizationType}
    shared = [t for t in GGMLQuantizationType if t.name in theirs]
    assert len(shared) >= 30, "gguf-py and this table share too few types to be the same numbering"
    for ours in shared:
        assert int(ours) == int(theirs[ours.name]), ours.name
        assert GGML_QUANT_SIZES[ours] == gguf.GGML_QUANT_SIZES[theirs[ours.name]], ours.name
    assert set(GGML_QUANT_SIZES) == set(GGMLQuantizationType)


def test_the_types_the_loader_supports_are_among_them():
    from typewriter.weights.gguf_file import SUPPORTED_TYPES

    assert set(GGML_QUANT_SIZES) >= SUPPORTED_TYPES
