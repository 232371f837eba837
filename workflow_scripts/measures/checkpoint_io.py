"""Reading safetensors checkpoints tensor by tensor: the tensor index, base/final pairing, row windows.

Never loads a whole model, nor a whole large tensor: a tensor is read as dim-0 row windows through
``safe_open`` (``WindowReader``), whose handle is reopened once ``window_bytes`` of the file were
touched, because pages of a safetensors mmap stay in RSS while the handle lives. Used by the
sparsity and overlap stages.
"""

import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from workflow_scripts.models import dtypes

DEFAULT_WINDOW_BYTES = 64 << 20  # touched bytes per side before the mmap handle is reopened
LM_HEAD = "lm_head.weight"
TIED_EMBEDDINGS = ("model.embed_tokens.weight", "embed_tokens.weight", "transformer.wte.weight")


class TensorMismatchError(ValueError):
    """The two checkpoints do not hold the same tensors; the message names the tensor and both files."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    file: Path
    shape: tuple[int, ...]
    dtype: str  # torch-style name, e.g. "bfloat16"

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def checkpoint_files(path: str | os.PathLike) -> tuple[dict[str, Path], str]:
    """Map tensor name -> safetensors file for a model folder, an index json or a single file.

    Returns the map and a description (the index or file) for error messages.
    """
    path = Path(path)
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        single = path / "model.safetensors"
        if index.exists():
            path = index
        elif single.exists():
            path = single
        else:
            found = sorted(path.glob("*.safetensors"))
            if len(found) != 1:
                raise FileNotFoundError(
                    f"{path}: no model.safetensors or model.safetensors.index.json "
                    f"(and {len(found)} other *.safetensors files)"
                )
            path = found[0]
    if not path.exists():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    if path.suffix == ".json":
        with open(path, encoding="utf-8") as fh:
            weight_map = json.load(fh).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{path}: index json has no 'weight_map'")
        files = {name: path.parent / shard for name, shard in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not shard.exists():
                raise FileNotFoundError(f"{path}: shard {shard.name} listed in the index does not exist")
        return files, str(path)
    with safe_open(path, framework="pt") as handle:
        return dict.fromkeys(handle.keys(), path), str(path)


def checkpoint_tensors(path: str | os.PathLike) -> tuple[dict[str, TensorInfo], str]:
    """Name -> TensorInfo (file, shape, dtype) read from the headers only; ordered by file and offset."""
    files, desc = checkpoint_files(path)
    by_file: dict[Path, list[str]] = {}
    for name, file in files.items():
        by_file.setdefault(file, []).append(name)
    infos: dict[str, TensorInfo] = {}
    for file in sorted(by_file):
        wanted = set(by_file[file])
        with safe_open(file, framework="pt") as handle:
            present = handle.offset_keys()
            missing = wanted - set(present)
            if missing:
                raise ValueError(f"{desc}: tensor {sorted(missing)[0]!r} is listed for {file} but not in it")
            for name in present:
                if name in wanted:
                    sl = handle.get_slice(name)
                    dtype = sl.get_dtype()
                    infos[name] = TensorInfo(
                        name, file, tuple(sl.get_shape()), dtypes.from_safetensors(dtype)
                    )
    return infos, desc


@dataclass(frozen=True)
class TensorPair:
    name: str
    base: TensorInfo
    final: TensorInfo
    tied: bool = False


def pair_tensors(
    base: Mapping[str, TensorInfo], final: Mapping[str, TensorInfo], base_desc: str, final_desc: str
) -> list[TensorPair]:
    """Match tensors by name (tied lm_head aliased, see module docstring); raise on any mismatch."""
    base, final = dict(base), dict(final)
    tied: set[str] = set()
    for side, other in ((base, final), (final, base)):
        if LM_HEAD in other and LM_HEAD not in side:
            embedding = next((e for e in TIED_EMBEDDINGS if e in side), None)
            if embedding is not None:
                side[LM_HEAD] = side[embedding]
                tied.add(LM_HEAD)
    for name in base:
        if name not in final:
            raise TensorMismatchError(
                f"tensor {name!r} is in {base[name].file} (base) but missing from {final_desc} (final)"
            )
    for name in final:
        if name not in base:
            raise TensorMismatchError(
                f"tensor {name!r} is in {final[name].file} (final) but missing from {base_desc} (base)"
            )
    pairs = []
    for name, a in base.items():
        b = final[name]
        if a.shape != b.shape:
            raise TensorMismatchError(
                f"tensor {name!r} has shape {list(a.shape)} in {a.file} (base) "
                f"but {list(b.shape)} in {b.file} (final)"
            )
        pairs.append(TensorPair(name, a, b, name in tied))
    return pairs


class WindowReader:
    """Row windows of tensors via safe_open, reopening the handle once ``budget`` bytes were touched.

    A tensor sliced from safe_open is a view of the file's mmap, and touched pages stay resident until
    the mapping goes; reopening bounds that to ~budget per side.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.file: Path | None = None
        self.handle = None
        self.touched = 0

    def rows(self, info: TensorInfo, start: int, stop: int) -> torch.Tensor:
        if self.handle is None or self.file != info.file or self.touched >= self.budget:
            self.handle = None  # drop the old mapping before opening the next
            self.handle = safe_open(info.file, framework="pt")
            self.file, self.touched = info.file, 0
        if not info.shape:
            out = self.handle.get_tensor(info.name)
        else:
            out = self.handle.get_slice(info.name)[start:stop]
        self.touched += out.numel() * out.element_size()
        return out.reshape(-1)

    def close(self) -> None:
        self.handle, self.file = None, None


def row_windows(shape: Sequence[int], window_elems: int) -> Iterator[tuple[int, int]]:
    """Dim-0 row ranges holding about ``window_elems`` elements (at least one row each)."""
    if not shape:
        yield 0, 1
        return
    row = math.prod(shape[1:])
    if row == 0 or shape[0] == 0:
        return
    step = max(1, window_elems // row)
    for start in range(0, shape[0], step):
        yield start, min(start + step, shape[0])


def iter_windows(
    pair: TensorPair, ra: WindowReader, rb: WindowReader, window_elems: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Aligned flat (base, final) row windows of one tensor pair."""
    for start, stop in row_windows(pair.base.shape, window_elems):
        yield ra.rows(pair.base, start, stop), rb.rows(pair.final, start, stop)


def window_elems_for(pairs: Sequence[TensorPair], window_bytes: int) -> int:
    widest = max(
        (max(dtypes.itemsize(p.base.dtype), dtypes.itemsize(p.final.dtype)) for p in pairs), default=4
    )
    return max(1, window_bytes // widest)
