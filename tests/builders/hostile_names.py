"""Checkpoints whose tensor names repeat one memoized key many times (issue 14's report-size
family): tiny pickles that name every tensor through `depth` nested dicts of one key."""

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
