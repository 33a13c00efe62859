"""Fixtures for the zip tests: real torch.save files (torch is the oracle here only)."""

from __future__ import annotations

import random
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
from torch.utils.serialization import config as ser_config  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int8, torch.uint8,
          torch.bool, torch.float64, torch.complex64, torch.int16]


@dataclass(frozen=True)
class TorchFile:
    path: Path
    alignment: int
    prefix: str

    def storages(self) -> list[tuple[str, int]]:
        """(key, nbytes) in pickle first-encounter order: torch >= 2.7 numbers keys that way."""
        with zipfile.ZipFile(self.path) as z:
            sizes = {i.filename.rsplit("/", 1)[1]: i.file_size for i in z.infolist()
                     if i.filename.startswith(f"{self.prefix}/data/")}
        return [(k, sizes[k]) for k in sorted(sizes, key=int)]


@contextmanager
def storage_alignment(alignment: int) -> Iterator[None]:
    old = ser_config.save.storage_alignment
    ser_config.save.storage_alignment = alignment
    try:
        yield
    finally:
        ser_config.save.storage_alignment = old


def _random_state(rng: random.Random, n: int) -> dict[str, Any]:
    sd: dict[str, Any] = {}
    for i in range(n):
        dtype = rng.choice(DTYPES)
        shape = [rng.randint(0, 5) for _ in range(rng.randint(0, 3))]
        if rng.random() < 0.1:
            shape = [0]
        t = torch.zeros(shape, dtype=dtype) if dtype in (torch.bool,) else (
            torch.arange(int(torch.tensor(shape).prod()) if shape else 1).reshape(shape).to(dtype))
        sd[f"t{i}"] = t
        if rng.random() < 0.15 and t.numel() > 1:
            sd[f"v{i}"] = t.view(-1)[1:]          # a view: repeats storage key
    return sd


def _contents(rng: random.Random) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    a = torch.arange(6, dtype=torch.float32).view(2, 3)
    out.append(("ex1", {"a": a, "b": torch.ones(5, dtype=torch.float16), "c": a[1],
                        "e": torch.empty(0, dtype=torch.int64),
                        "d": torch.tensor([1, 2, 3], dtype=torch.uint16)}))
    out.append(("empty_only", {"e": torch.empty(0), "f": torch.empty(0, 3)}))
    out.append(("single", torch.ones(3)))
    out.append(("nested", {"layers": [{"w": torch.randn(3, 3), "b": torch.zeros(3)} for _ in range(4)],
                           "step": 7}))
    lin = torch.nn.Linear(4, 3)
    out.append(("module_sd", lin.state_dict()))
    out.append(("params", {"p": torch.nn.Parameter(torch.ones(2, 2))}))
    out.append(("big_names", {("x" * 200) + str(i): torch.ones(i + 1) for i in range(5)}))
    out.append(("many120", _random_state(rng, 120)))
    out.append(("random30", _random_state(rng, 30)))
    return out


@pytest.fixture(scope="session")
def torch_files(tmp_path_factory: pytest.TempPathFactory) -> list[TorchFile]:
    """>= 30 torch.save files: 9 contents x alignments 1/16/64/4096 (64 is torch's default)."""
    root = tmp_path_factory.mktemp("torch_files")
    rng = random.Random(2131)
    files: list[TorchFile] = []
    for alignment in (1, 16, 64, 4096):
        for stem, obj in _contents(rng):
            path = root / f"{stem}_a{alignment}.pt"
            with storage_alignment(alignment):
                torch.save(obj, path)
            files.append(TorchFile(path, alignment, path.stem))
    return files


@pytest.fixture(scope="session")
def ex1(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FORMATS.md §1.4's worked example, saved with torch's defaults."""
    path = tmp_path_factory.mktemp("ex") / "ex1.pt"
    a = torch.arange(6, dtype=torch.float32).view(2, 3)
    sd = {"a": a, "b": torch.ones(5, dtype=torch.float16), "c": a[1],
          "e": torch.empty(0, dtype=torch.int64), "d": torch.tensor([1, 2, 3], dtype=torch.uint16)}
    torch.save(sd, path)
    return path
