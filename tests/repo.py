"""Where things are: the repository's root and the folders tests read, whatever folder a test file is in."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
GOLDEN_DIR = TESTS / "golden"
BENCH = ROOT / "bench"
