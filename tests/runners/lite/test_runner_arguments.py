"""What LiteRunner refuses before it does any work."""

from __future__ import annotations

import pytest
from tiny_model import tiny_config

from typewriter.runners.lite.runner import LiteRunner


def test_a_lite_runner_with_neither_weights_nor_programs_says_so():
    with pytest.raises(ValueError, match="weights or from its programs"):
        LiteRunner(tiny_config(), None, slots=1, max_len=32, max_chunk=16, kernel=None)
