"""core.scan: any bytes -> a Report; only unreadable input raises."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ckptguard.core.errors import Code, SourceError
from ckptguard.core.io.source import BytesSource
from ckptguard.core.scan import scan_path, scan_source
from tests.builders.pickle_asm import asm


def _codes(report) -> set[str]:  # type: ignore[no-untyped-def]
    return {f.code for f in report.findings}


def test_empty_input_is_invalid() -> None:
    report = scan_source(BytesSource(b""))
    assert report.verdict == "invalid" and Code.FORMAT_EMPTY in _codes(report)


def test_unknown_bytes_are_suspicious_not_safe() -> None:
    report = scan_source(BytesSource(b"\x7fELF\x02\x01\x01" + b"\0" * 64))
    assert report.format == "unknown" and report.verdict == "suspicious"


def test_missing_file_raises_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError):
        scan_path(tmp_path / "nope.pt")


def test_plain_pickle_of_plain_data_is_safe() -> None:
    report = scan_source(BytesSource(pickle.dumps({"lr": 0.1, "steps": [1, 2]}, protocol=2)))
    assert report.format == "pickle"
    assert report.verdict == "safe", report.findings
    assert report.weights_only.policy_accepts
    # torch.load reads a non-zip file as its legacy format: the first pickle is no magic number
    assert (report.weights_only.loadable, report.weights_only.error_type, report.weights_only.error) \
        == (False, "RuntimeError", "Invalid magic number; corrupt file?")


def test_plain_pickle_with_os_system_is_unsafe(tmp_path: Path) -> None:
    canary = tmp_path / "pwned"
    data = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", f"touch {canary}"),
               "TUPLE1", "REDUCE", "STOP")
    report = scan_source(BytesSource(data))
    assert report.verdict == "unsafe"
    assert not report.weights_only.loadable
    assert "blocked" in (report.weights_only.error or "")
    assert any(g.full == "os.system" and g.status == "dangerous" for g in report.globals)
    assert not canary.exists()


def test_truncated_malicious_pickle_still_shows_its_global() -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "subprocess", "Popen"), ("BINUNICODE", "id"))
    report = scan_source(BytesSource(data))
    assert report.verdict == "unsafe"
    assert Code.PICKLE_TRUNCATED in _codes(report)


def test_second_pickle_after_stop_is_found() -> None:
    hidden = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "id"), "TUPLE1",
                 "REDUCE", "STOP")
    report = scan_source(BytesSource(pickle.dumps([1, 2], protocol=2) + hidden))
    assert Code.PICKLE_SECOND_PICKLE in _codes(report)
    assert report.verdict == "unsafe"


def test_trailing_garbage_is_reported() -> None:
    report = scan_source(BytesSource(pickle.dumps([1], protocol=2) + b"\xff\xfe garbage"))
    assert Code.PICKLE_TRAILING_DATA in _codes(report)
    assert report.verdict == "suspicious"


def test_report_json_has_the_contract_fields() -> None:
    out = scan_source(BytesSource(pickle.dumps([1], protocol=2))).to_json()
    for key in ("schema_version", "scanner", "source", "format", "verdict", "weights_only",
                "globals", "findings", "tensors", "storages", "io", "timings_ms"):
        assert key in out
    assert out["scanner"]["policy"] == "torch-2.13-weights-only"
    assert set(out["weights_only"]) >= {"loadable", "error", "unsafe_globals"}


def test_the_memory_cap_met_in_a_system_call_is_the_memory_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under RLIMIT_AS a lazy import can fail with OSError(ENOMEM) where Python allocates
    nothing itself (measured on Debian's 3.11.2: importlib listing a directory): that is the
    memory limit (RESOURCE_LIMIT), not a scanner bug with a traceback (INTERNAL_ERROR)."""
    import errno

    from ckptguard.core import scan as scan_module

    def out_of_memory(*args: object) -> None:
        raise OSError(errno.ENOMEM, "Cannot allocate memory", "/some/package")

    monkeypatch.setattr(scan_module, "_analyze", out_of_memory)
    codes = _codes(scan_source(BytesSource(pickle.dumps([1], protocol=2))))
    assert Code.RESOURCE_LIMIT in codes and Code.INTERNAL_ERROR not in codes


def test_every_manifest_row_serialises_each_of_its_fields_once() -> None:
    """Tensor, storage and region rows are written out as dict displays (for speed): their
    keys must be the rows' own fields, in order, with every value (a new field that the
    display forgets would silently drop out of the report)."""
    from ckptguard.core.filemap import Region
    from ckptguard.core.report import StorageEntry, TensorEntry

    for row_type in (TensorEntry, StorageEntry, Region):
        fields = row_type._fields
        row = row_type(*(f"value-{i}" for i in range(len(fields))))
        out = row.to_json()
        assert list(out) == list(fields)
        assert [str(v) if not isinstance(v, list) else "".join(v) for v in out.values()] == \
            [f"value-{i}" for i in range(len(fields))]


def test_torchs_answer_on_a_plain_pickle_reuses_the_policy_replay(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pickle without persistent ids reads alike with and without torch's storage hook:
    its first (only) pickle is not emulated a second time for torch.load's literal answer."""
    from ckptguard.core.formats import torch_legacy

    def twice(*args: object, **kwargs: object) -> None:
        raise AssertionError("the first pickle was emulated again")

    monkeypatch.setattr(torch_legacy, "emulate", twice)
    report = scan_source(BytesSource(pickle.dumps({"steps": list(range(1000))}, protocol=2)))
    assert (report.weights_only.error, report.weights_only.policy_accepts) == \
        ("Invalid magic number; corrupt file?", True)


def test_torchs_answer_on_a_npy_reads_no_weights() -> None:
    """torch.load refuses a .npy at its first byte (STACK_GLOBAL, "Unsupported operand 147"):
    finding that out reads the head, not the array."""
    import io

    import numpy as np

    buf = io.BytesIO()
    np.save(buf, np.zeros(1_000_000, dtype=np.float32))
    report = scan_source(BytesSource(buf.getvalue()))
    assert (report.weights_only.error, report.verdict) == ("Unsupported operand 147", "safe")
    assert report.io["bytes_read"] < 400_000


def test_a_scanner_bug_is_a_finding_and_a_logged_traceback(monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """An exception the scan does not expect becomes INTERNAL_ERROR (invalid), and the
    traceback goes to the "ckptguard.scan" logger for the operators (core.scan imports
    logging only then, so a clean scan's start does not pay for it)."""
    import ckptguard.core.scan as scan_module

    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(scan_module, "_analyze", broken)
    with caplog.at_level("ERROR", logger="ckptguard.scan"):
        report = scan_source(BytesSource(pickle.dumps({"a": 1}), name="x.pkl"))
    assert report.verdict == "invalid"
    assert [f.message for f in report.findings if f.code == Code.INTERNAL_ERROR] == ["RuntimeError: a bug"]
    assert [(r.name, r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("ckptguard.scan", "internal error while scanning x.pkl", True)]
