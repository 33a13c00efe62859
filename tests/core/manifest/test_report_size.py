"""A report's size follows what the pickle says (issue 14): tensors under many nested dicts
keyed by one memoized long string do not repeat that key once per level and tensor.

Bound: report JSON bytes <= 8 x (decompressed pickle bytes + zip directory bytes) + 2 KiB per
tensor. The directories count since the report's file map (`regions`, issue 17) has rows per
zip entry: a one-tensor checkpoint's map is 2 KB, more than 8 x its 200-byte pickle."""

from __future__ import annotations

import io
import json
import zipfile

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Code
from ckptguard.core.report import NAME_MARK
from ckptguard.core.scan import scan_bytes
from ckptguard.core.state import ScanOptions
from tests.builders.hostile_names import memoized_key_checkpoint


def _directory_bytes(data: bytes) -> int:
    """Local headers, central directory and end record: the metadata besides the pickle."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        entries = zf.infolist()
    return 22 + sum(30 + 46 + 2 * (len(i.orig_filename.encode()) + len(i.extra)) + len(i.comment)
                    for i in entries)


def _report_bytes(data: bytes, engine: str = "auto") -> tuple[int, dict[str, object]]:
    report = scan_bytes(data, options=ScanOptions(engine=engine)).to_json()  # type: ignore[arg-type]
    return len(json.dumps(report).encode()), report


def test_the_issue_case_is_linear_in_the_pickle() -> None:
    """256 dicts deep, 1,000 tensors, one memoized 1,000-character key: was 513 MB."""
    data, pickle_bytes = memoized_key_checkpoint(256, 1_000, "k" * 1_000)
    size, report = _report_bytes(data)
    assert report["verdict"] == "safe"
    assert size <= 8 * pickle_bytes + 2048 * 1_000, size
    tensors = report["tensors"]
    assert isinstance(tensors, list) and len(tensors) == 1_000
    names = [t["name"] for t in tensors]
    assert len(set(names)) == 1_000 and all(NAME_MARK in n for n in names)
    assert all(t["path"][-1] == NAME_MARK + t["name"][-64:] for t in tensors)
    codes = [f["code"] for f in report["findings"]]  # type: ignore[union-attr]
    assert codes == [Code.LIMIT_NAME]


_KEY_CHARS = st.sampled_from(["k", ".", "\u00e9", "\u4e2d", "\U0001f600", '"', "\\", "\x01", "7"])


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(depth=st.integers(1, 64), tensors=st.integers(1, 40),
       key=st.lists(_KEY_CHARS, min_size=1, max_size=12).map("".join),
       repeat=st.integers(1, 400), engine=st.sampled_from(["auto", "general"]))
def test_memoized_keys_never_blow_the_report_up(depth: int, tensors: int, key: str,
                                                repeat: int, engine: str) -> None:
    data, pickle_bytes = memoized_key_checkpoint(depth, tensors, key * repeat)
    size, report = _report_bytes(data, engine)
    assert report["verdict"] == "safe"
    metadata = pickle_bytes + _directory_bytes(data)
    assert size <= 8 * metadata + 2048 * tensors, (size, pickle_bytes, tensors)
    names = [t["name"] for t in report["tensors"]]  # type: ignore[union-attr]
    assert len(set(names)) == tensors
