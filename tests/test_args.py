"""The options every model command shares (commands/args.py): --weights' help says which format is the fast one."""

from __future__ import annotations

import pytest

from typewriter import cli


def test_the_weights_help_names_int8_lite_as_the_fast_one_and_xlas_int8_as_slower_for_one_row(capsys):
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "int8-lite is the fast one" in help_text
    assert "XLA's int8 4x fewer bytes than fp32 but slower for one row" in help_text
    assert "int8 is faster" not in help_text
