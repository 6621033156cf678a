"""heap.py's `release_mapped`: the runner lets go of each program file's pages once LiteRT has made its
interpreter, so a start never holds the files and XNNPACK's packed copies of them at once; a load lets go of the
model file's once everything is made from it."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from typewriter import assemble
from typewriter.config import WeightFormat
from typewriter.heap import release_mapped
from typewriter.runners.options import RunnerOptions

MIB = 1 << 20


def resident_kib(path: Path) -> int:
    """What /proc/self/smaps counts resident of the mappings of `path`."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                inside = len(fields) == 6 and fields[5] == str(path.resolve())
            elif inside and fields[0] == "Rss:":
                total += int(fields[1])
    return total


def test_one_file_or_a_folder_is_let_go_and_read_again_from_the_file(tmp_path):
    a, b = tmp_path / "a.tflite", tmp_path / "b.tflite"
    a.write_bytes(b"\1" * MIB)
    b.write_bytes(b"\2" * MIB)
    mapped = {path: np.memmap(path, mode="r") for path in (a, b)}
    assert int(mapped[a].sum()) == MIB and int(mapped[b].sum()) == 2 * MIB  # every page touched
    assert resident_kib(a) == resident_kib(b) == 1024
    assert release_mapped(a) == MIB
    assert resident_kib(a) == 0 and resident_kib(b) == 1024  # only that file's
    assert release_mapped(tmp_path / "a") == 0  # a name that only begins like it is not it
    assert release_mapped(tmp_path) == 2 * MIB and resident_kib(b) == 0
    assert int(mapped[a].sum()) == MIB and int(mapped[b].sum()) == 2 * MIB  # the same bytes, from the files


def mapped(path: Path) -> bool:
    with open("/proc/self/maps") as maps:
        return any(line.rstrip("\n").endswith(" " + str(path.resolve())) for line in maps)


def test_a_load_lets_go_of_the_model_file_s_pages_and_reads_them_again_when_asked(tiny_gguf, tmp_path):
    """q4-blocks packs every matrix from the mapped file, then keeps it mapped for the embedding rows: what packing
    read is let go at the end of the load, and a step reads its tokens' rows back from the file."""
    path = Path(tiny_gguf)
    options = RunnerOptions(WeightFormat.Q4_BLOCKS, 64, slots=1, program_cache=str(tmp_path / "lite"))
    runner = assemble.open_runner(path, options).runner
    assert mapped(path) and resident_kib(path) == 0
    logits = runner.extend(0, 0, [5, 9, 40])
    assert np.isfinite(logits).all() and resident_kib(path) > 0  # the rows read again, from the file
