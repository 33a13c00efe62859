"""Issue 18 items 1-2: a payload in bytes torch skips is found, judged and named.

Every carrier of tests/builders/carriers.py holds an `os.system` pickle (built with the
assembler) where torch does not look; the scan must say `unsafe`, name `os.system`, and name
the region (kind, offset, record). The same carriers with a harmless pickle stay out of
`unsafe`, and a region's cost is bounded by one budget per scan.
"""

from __future__ import annotations

import io
import pickle
import zipfile
import zlib
from pathlib import Path

import pytest

from ckptguard.core import records
from ckptguard.core.errors import Code, Effect
from ckptguard.core.limits import DEFAULT_LIMITS
from ckptguard.core.report import Report
from ckptguard.core.scan import scan_bytes, scan_path
from ckptguard.core.state import ScanOptions
from tests.builders.carriers import (
    CARRIERS,
    PREFIX,
    appended,
    clean_archive,
    gap_between_records,
    huge_gap,
    junk_prefix_unadjusted,
    prepended_local_record,
    unreferenced_record,
)
from tests.builders.pickle_asm import asm
from tests.core.zip.zipbuild import Member, build_zip

PAYLOAD = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "echo pwned"), "TUPLE1",
              "REDUCE", "STOP")
HARMLESS = pickle.dumps({"lr": 0.1, "steps": [1, 2, 3]}, protocol=2)


def _region_payloads(report: Report) -> list[tuple[str, str | None, int | None]]:
    return [(f.message, f.record, f.offset) for f in report.findings
            if f.code is Code.REGION_PAYLOAD]


@pytest.mark.parametrize("carrier", list(CARRIERS))
def test_payload_in_every_carrier_is_unsafe_and_named(carrier: str) -> None:
    build, kind = CARRIERS[carrier]
    report = scan_bytes(build(PAYLOAD))
    assert report.verdict == "unsafe"
    named = [f for f in report.findings if f.code is Code.PICKLE_DANGEROUS_GLOBAL]
    assert any("os.system" in f.message for f in named), report.findings
    assert ("os", "system") in {(g.module, g.name) for g in report.globals}
    if kind is not None:   # the region is named: its kind, where it is, which record
        regions = _region_payloads(report)
        assert any(msg.startswith(f"the {kind}") and "os.system" in msg and offset is not None
                   for msg, _record, offset in regions), report.findings


@pytest.mark.parametrize("carrier", list(CARRIERS))
def test_the_same_carrier_with_a_harmless_pickle_is_not_unsafe(carrier: str) -> None:
    """Control: the carrier's layout alone earns its position findings; only a layout that
    is unsafe by itself (two entries one name: readers disagree) stays unsafe."""
    build, _kind = CARRIERS[carrier]
    report = scan_bytes(build(HARMLESS))
    unsafe = {f.code for f in report.findings if f.code.effect is Effect.UNSAFE}
    assert unsafe <= {Code.ZIP_DUPLICATE_NAME}, [(f.code, f.message) for f in report.findings]
    assert not _region_payloads(report)


def test_appended_payload_offset_and_cost() -> None:
    clean = clean_archive()
    report = scan_bytes(appended(PAYLOAD))
    assert _region_payloads(report)[0][2] == len(clean)
    global_offsets = [f.offset for f in report.findings if f.code is Code.PICKLE_DANGEROUS_GLOBAL]
    assert global_offsets == [len(clean) + PAYLOAD.index(b"cos")]   # the GLOBAL opcode itself
    assert report.io["region_bytes_read"] == len(PAYLOAD)   # sniffed once, no more
    assert report.io["regions"] == 1


def test_unreferenced_record_names_its_record_and_data_offset() -> None:
    data = unreferenced_record(PAYLOAD)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        info = zf.getinfo(f"{PREFIX}/extra.pkl")
        assert zf.read(info) == PAYLOAD                    # what another reader gets
    (_message, record, offset), = _region_payloads(scan_bytes(data))
    assert record == f"{PREFIX}/extra.pkl"
    assert offset is not None and data[offset:offset + len(PAYLOAD)] == PAYLOAD


def test_gap_payload_is_where_the_finding_says() -> None:
    data = gap_between_records(PAYLOAD)
    report = scan_bytes(data)
    assert Code.ZIP_UNREFERENCED_DATA in {f.code for f in report.findings}
    (_message, record, offset), = _region_payloads(report)
    assert record is None and offset is not None
    assert data[offset:offset + len(PAYLOAD)] == PAYLOAD


def test_a_clean_checkpoint_has_no_region_cost() -> None:
    report = scan_bytes(clean_archive())
    assert report.verdict == "safe"
    assert "region_bytes_read" not in report.io


# -- item 2: a prefix whose bytes the archive's offsets do not count -------------------------

@pytest.mark.torch
def test_prefixed_zip_is_read_as_zipfile_reads_it_and_torch_refuses_it(tmp_path: Path) -> None:
    """torch 2.13 does not load a zip with bytes prepended that its offsets do not count
    (miniz takes offsets as written; a file not starting with PK\\x03\\x04 goes down the legacy
    path), with or without weights_only; Python's zipfile reads it. We read the archive as
    zipfile does: the payload inside is found, and weights_only says torch's refusal."""
    import torch

    for stub in (b"\x7fELF" + b"\x00" * 60, b"PK\x03\x04" + b"\x00" * 60):
        path = tmp_path / "prefixed.pt"
        path.write_bytes(build_zip([Member(f"{PREFIX}/data.pkl", PAYLOAD),
                                    Member(f"{PREFIX}/version", b"3\n")],
                                   prepend=stub, relative_offsets=True))
        with zipfile.ZipFile(path) as zf:
            assert zf.read(f"{PREFIX}/data.pkl") == PAYLOAD
        errors = []
        for weights_only in (True, False):
            with pytest.raises(Exception) as exc:   # the legacy unpickler's or miniz's error
                torch.load(path, weights_only=weights_only)
            errors.append(str(exc.value).splitlines()[0])
        report = scan_path(path)
        assert report.verdict == "unsafe"
        assert any(f.code is Code.PICKLE_DANGEROUS_GLOBAL and f.record == f"{PREFIX}/data.pkl"
                   for f in report.findings)
        prefix = [f for f in report.findings if f.code is Code.ZIP_PREPENDED_DATA]
        assert prefix and prefix[0].offset == 0 and f"{len(stub)} bytes" in prefix[0].message
        assert report.weights_only.loadable is False
        if stub.startswith(b"PK\x03\x04"):   # torch takes the zip path: miniz's own words
            assert report.weights_only.error == errors[0]


@pytest.mark.torch
def test_prefixed_clean_checkpoint_is_no_longer_invalid(tmp_path: Path) -> None:
    """Was `invalid` ("bad signature"); now the archive is judged: suspicious, not unsafe."""
    path = tmp_path / "prefixed.pt"
    path.write_bytes(junk_prefix_unadjusted(clean_archive_pickle()))
    report = scan_path(path)
    assert report.verdict == "suspicious", report.findings
    assert report.format == "torch-zip"


def clean_archive_pickle() -> bytes:
    from tests.builders.carriers import CLEAN_PKL
    return CLEAN_PKL


@pytest.mark.torch
def test_a_local_record_before_the_archive_loads_in_torch_yet_is_judged(tmp_path: Path) -> None:
    """Offsets absolute, file still starts with PK\\x03\\x04: torch loads the archive and never
    sees the record before it; a streaming reader (local headers from byte 0) reads it first."""
    import torch

    path = tmp_path / "x.pt"
    path.write_bytes(prepended_local_record(PAYLOAD))
    assert torch.load(path, weights_only=True)["w"].tolist() == [1.0, 1.0]
    report = scan_path(path)
    assert report.verdict == "unsafe"
    (message, record, _offset), = _region_payloads(report)
    assert message.startswith("the local record") and record == f"{PREFIX}/extra.pkl"


# -- one budget per scan ----------------------------------------------------------------------

def test_a_huge_pickle_like_region_is_not_read_whole(tmp_path: Path) -> None:
    """A 1 GB region that starts like a pickle whose string never ends: the window grows
    only to the budget, then the region is REGION_UNJUDGED (suspicious, not invalid)."""
    path = tmp_path / "big.pt"
    huge_gap(path, asm(("PROTO", 2), ("RAW", b"X" + (100 << 20).to_bytes(4, "little"))))
    limits = records.replace(DEFAULT_LIMITS, max_region_bytes=1 << 20)
    report = scan_path(path, options=ScanOptions(limits=limits))
    assert report.verdict == "suspicious", report.findings
    assert report.io["region_bytes_read"] <= limits.max_region_bytes
    assert report.io["bytes_read"] < 2 * limits.max_region_bytes
    assert any(f.code is Code.REGION_UNJUDGED and "budget" in f.message for f in report.findings)


def test_a_huge_region_that_is_no_pickle_costs_one_sniff(tmp_path: Path) -> None:
    path = tmp_path / "big.pt"
    huge_gap(path, b"")   # zeros: no opcode is 0x00
    report = scan_path(path)
    assert Code.ZIP_UNREFERENCED_DATA in {f.code for f in report.findings}
    assert report.io["region_bytes_read"] == DEFAULT_LIMITS.region_sniff_bytes
    assert report.io["bytes_read"] < 1 << 20
    assert report.verdict == "suspicious"


def test_a_200000_member_archive_is_judged_up_to_the_budget() -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for i in range(200_000):
            zf.writestr(f"m/{i}", PAYLOAD if i == 199_999 else b"\x00\x00")
    report = scan_bytes(buf.getvalue())
    limits = DEFAULT_LIMITS
    assert report.io["regions"] <= limits.max_regions + 200_000   # counted, not all judged
    assert report.io["regions_unjudged"] == 200_000 - limits.max_regions
    assert report.io["region_bytes_read"] <= limits.max_region_bytes
    unjudged = [f for f in report.findings if f.code is Code.REGION_UNJUDGED]
    assert 0 < len(unjudged) <= limits.max_region_findings + 1
    # the payload sits past the budget: never `safe`, never claimed `unsafe` without evidence
    assert report.verdict == "suspicious"


def test_budget_spent_leaves_the_rest_unjudged_not_invalid() -> None:
    limits = records.replace(DEFAULT_LIMITS, max_regions=1)
    data = build_zip([Member("a/data.pkl", HARMLESS), Member("a/x", PAYLOAD),
                      Member("a/y", PAYLOAD)])
    report = scan_bytes(data, options=ScanOptions(limits=limits))
    assert report.io["regions_unjudged"] == 1
    assert Code.REGION_UNJUDGED in {f.code for f in report.findings}
    assert report.verdict == "unsafe"   # the region it could pay for holds the payload


def test_a_deflate_bomb_region_inflates_only_what_judging_needs() -> None:
    """A deflated unreferenced record that inflates to 24 MB, starting like a pickle whose
    string never ends: inflated only up to the budget's window, then REGION_UNJUDGED."""
    body = asm(("PROTO", 2), ("RAW", b"X" + (20 << 20).to_bytes(4, "little"))) + bytes(24 << 20)
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    bomb = compressor.compress(body) + compressor.flush()
    data = build_zip([Member(f"{PREFIX}/data.pkl", HARMLESS), Member(f"{PREFIX}/version", b"3\n"),
                      Member(f"{PREFIX}/extra.pkl", body, method=8, payload=bomb)])
    limits = records.replace(DEFAULT_LIMITS, max_region_bytes=1 << 20)
    report = scan_bytes(data, options=ScanOptions(limits=limits))
    assert report.verdict == "suspicious", report.findings
    assert report.io["region_bytes_read"] <= len(bomb)
    assert any(f.code is Code.REGION_UNJUDGED and f.record == f"{PREFIX}/extra.pkl"
               for f in report.findings)


def test_a_remote_scan_judges_regions_in_two_more_round_trips() -> None:
    """Over HTTP Range requests the regions' local headers and first bytes are fetched in
    batches (one round trip each per wave), not one request per region."""
    from ckptguard.core.io.http import HttpSource
    from ckptguard.core.io.urlguard import UrlGuard
    from ckptguard.core.scan import scan_source
    from tests.rangeserver import RangeServer

    pads = tuple((f"pad{i}.bin", bytes(100_000)) for i in range(6))
    data = clean_archive(extra=(*pads[:3], ("extra.pkl", PAYLOAD), *pads[3:]))
    assert len(data) > 500_000   # the payload is neither in the head nor in the tail read
    trips = {}
    for max_regions in (0, DEFAULT_LIMITS.max_regions):
        limits = records.replace(DEFAULT_LIMITS, max_regions=max_regions)
        with RangeServer({"/m.pt": data}) as srv, \
                HttpSource(srv.url("/m.pt"), guard=UrlGuard(allowlist=("127.0.0.1",))) as src:
            report = scan_source(src, options=ScanOptions(limits=limits))
            trips[max_regions] = src.round_trips
    assert report.verdict == "unsafe"
    (_message, record, _offset), = _region_payloads(report)
    assert record == f"{PREFIX}/extra.pkl"
    assert report.io["regions"] == 7 and report.io["regions_unjudged"] == 0
    assert trips[DEFAULT_LIMITS.max_regions] <= trips[0] + 2, trips
