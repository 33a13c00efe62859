"""Checkpoints whose report repeats one memoized value many times (issue 14's report-size
family): tiny pickles that name every tensor through `depth` nested dicts of one key, views
sharing one long shape or storage key, globals sharing one long module name."""

from __future__ import annotations

import io
import zipfile


def memoized_key_checkpoint(depth: int, tensors: int, key: str) -> tuple[bytes, int]:
    """(torch.save bytes, decompressed pickle bytes) of `tensors` tensors under `depth` dicts."""
    import torch

    tree: dict[str, object] = {f"t{i}": torch.zeros(1) for i in range(tensors)}
    for _ in range(depth):
        tree = {key: tree}
    buf = io.BytesIO()
    torch.save(tree, buf)
    data = buf.getvalue()
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        pickle_bytes = sum(i.file_size for i in zf.infolist() if i.filename.endswith(".pkl"))
    return data, pickle_bytes


# Pickles whose report rows repeat one memoized value: each returns (file bytes, decompressed
# pickle bytes, tensors the pickle declares).

def _views(n: int, storage: str, first: list[object], again: list[object]) -> list[object]:
    """`n` views of storage `storage` as one dict; `first` / `again` build the shared size and
    stride tuples (memo 1 and 2) the first time / every later time."""
    from tests.builders.torchlayout import _int

    body: list[object] = [("PROTO", 2), "EMPTY_DICT", "MARK"]
    for i in range(n):
        body += [("BINUNICODE", f"t{i}"), ("GLOBAL", "torch._utils", "_rebuild_tensor_v2"),
                 "MARK", "MARK", ("BINUNICODE", "storage"), ("GLOBAL", "torch", "FloatStorage"),
                 ("BINUNICODE", storage) if i == 0 else ("BINGET", 3), *([("BINPUT", 3)] if i == 0 else []),
                 ("BINUNICODE", "cpu"), _int(1), "TUPLE", "BINPERSID", _int(0),
                 *(first if i == 0 else again), "NEWFALSE",
                 ("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE", "TUPLE",
                 "REDUCE"]
    return [*body, "SETITEMS", "STOP"]


def memoized_shape_views(n: int, ndim: int) -> tuple[bytes, int, int]:
    """`n` one-element views whose size and stride are one memoized `ndim`-tuple of ones."""
    from tests.builders.pickle_asm import asm
    from tests.builders.torchlayout import _int, torch_layout

    ones = [_int(1)] * ndim
    first = ["MARK", *ones, "TUPLE", ("BINPUT", 1), "MARK", *ones, "TUPLE", ("BINPUT", 2)]
    pkl = asm(*_views(n, "0", first, [("BINGET", 1), ("BINGET", 2)]))   # type: ignore[arg-type]
    return torch_layout("archive", pkl, [("0", b"\0" * 4)]), len(pkl), n


def memoized_storage_views(n: int, key: str) -> tuple[bytes, int, int]:
    """`n` one-element views of one storage whose key (a memoized string) is `key`."""
    from tests.builders.pickle_asm import asm
    from tests.builders.torchlayout import _int, torch_layout

    first = ["MARK", _int(1), "TUPLE", ("BINPUT", 1), "MARK", _int(1), "TUPLE", ("BINPUT", 2)]
    pkl = asm(*_views(n, key, first, [("BINGET", 1), ("BINGET", 2)]))   # type: ignore[arg-type]
    return torch_layout("archive", pkl, [(key, b"\0" * 4)]), len(pkl), n


def memoized_module_globals(n: int, module: str) -> tuple[bytes, int, int]:
    """A plain pickle importing `n` distinct globals of one memoized module name."""
    from tests.builders.pickle_asm import asm

    body: list[object] = [("PROTO", 4), ("BINUNICODE", module), "MEMOIZE"]
    for i in range(n):
        body += [("BINGET", 0), ("SHORT_BINUNICODE", f"n{i}"), "STACK_GLOBAL", "POP"]
    pkl = asm(*body, "NONE", "STOP")   # type: ignore[arg-type]
    return pkl, len(pkl), 0
