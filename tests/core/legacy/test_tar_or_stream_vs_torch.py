"""Whether torch.load reads a legacy file as a .tar or as a stream: `tarfile.open` decides,
and a file can be both (its first pickle's string holding a tar). A divergence hunt found the
scan's probe stopped early: two chained pax headers, or more than eight, made a tar torch
refuses (and whose `pickle` member torch.load(weights_only=False) runs) read as a clean
stream, `safe`; a pax record tarfile refuses made a stream torch loads read as a tar. Each
case here is answered by torch.load in this process (tests/core/legacy/conftest.py); a case
whose answer depends on the Python version is judged both ways and never `safe`."""

from __future__ import annotations

import io
import struct
import tarfile
from pathlib import Path

import pytest

from ckptguard.core.errors import Code
from ckptguard.core.limits import Limits
from ckptguard.core.scan import scan_path
from ckptguard.core.state import ScanOptions
from tests.core.legacy.conftest import MAGIC, PROTOCOL, assert_same_outcome

pytestmark = pytest.mark.torch

ENGINES = ("auto", "exact")
EVIL_PROTOCOL0 = b"cos\nsystem\n(S'true'\ntR."
_W = (b"\x80\x02}q\x00X\x01\x00\x00\x00wq\x01ctorch._utils\n_rebuild_tensor_v2\nq\x02((X\x07\x00\x00"
      b"\x00storageq\x03ctorch\nFloatStorage\nq\x04X\x01\x00\x00\x000q\x05X\x03\x00\x00\x00cpuq\x06"
      b"K\x04Ntq\x07QK\x00K\x04\x85q\x08K\x01\x85q\x09\x89ccollections\nOrderedDict\nq\x0a)Rq\x0b"
      b"tq\x0cRq\x0ds.")
EVIL_MAIN = b"\x80\x02cos\nsystem\nX\x04\x00\x00\x00true\x85R."
KEYS = b"\x80\x02]q\x00X\x01\x00\x00\x000q\x01a."
BLOCKS = struct.pack("<q", 4) + struct.pack("<4f", 1, 2, 3, 4)


def _header(kind: bytes, size: int = 0, name: bytes = b"") -> bytearray:
    h = bytearray(512)
    h[:len(name)] = name
    h[124:136] = b"%011o\0" % size
    h[156:157] = kind
    h[257:265] = b"ustar\x0000"
    return h


def _checksummed(block: bytearray) -> bytes:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def _polyglot(tar: bytes, main: bytes = _W) -> bytes:
    """`tar` whose first header also starts a legacy stream: the magic, the protocol, then a
    sys_info string holding the rest of `tar`; then the stream's main pickle, keys, blocks."""
    lead = MAGIC + PROTOCOL + b"\x80\x02X"
    lead += struct.pack("<I", len(tar) - len(lead) - 4)
    first = bytearray(tar[:512])
    first[:len(lead)] = lead
    return _checksummed(first) + tar[512:] + b"." + main + KEYS + BLOCKS


def _pax_record(key: bytes, value: bytes) -> bytes:
    """`"%d %s=%s\\n"`, the length counting itself."""
    rest = b" %s=%s\n" % (key, value)
    n = len(rest) + 1
    while len(b"%d" % n) + len(rest) != n:
        n += 1
    return b"%d" % n + rest


def _tar_with_pax(chain: int, pickle_member: bytes = EVIL_PROTOCOL0) -> bytes:
    """A tar of torch's three members, each behind a pax header, after `chain` - 1 global
    pax headers."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in {"storages": b"I0\n.(l.", "tensors": b"I0\n.", "pickle": pickle_member}.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.pax_headers = len(data), 0, {"comment": "b"}
            tar.addfile(info, io.BytesIO(data))
    body = buf.getvalue()
    record = _pax_record(b"comment", b"a")
    globals_ = b"".join(_checksummed(_header(b"g", len(record))) + record.ljust(512, b"\0")
                        for _ in range(chain - 1))
    return globals_ + body


def _cases() -> dict[str, bytes]:
    blocks3 = b"".join(_checksummed(_header(b"x")) for _ in range(3))
    sparse = _header(b"S", 0, b"file")
    sparse[483:495] = b"not octal!!\0"
    return {
        "2 chained pax headers, then the members": _polyglot(_tar_with_pax(2)),
        "12 chained pax headers, then the members": _polyglot(_tar_with_pax(12)),
        "3 pax headers, a bad block, a zip magic":
            _polyglot(blocks3 + b"junk".ljust(512, b"-") + b"PK\x03\x04"),
        "a GNU sparse header with a bad real size": _polyglot(_checksummed(sparse) + bytes(512)),
    }


@pytest.mark.parametrize("name", list(_cases()))
@pytest.mark.parametrize("engine", ENGINES)
def test_tar_or_stream_as_torch_decides(tmp_path: Path, name: str, engine: str,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)   # torch names the file as it was given: relative here
    path = Path("case.pt")
    path.write_bytes(_cases()[name])
    report = scan_path(path, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
    assert_same_outcome(report, path)
    if report.format == "torch-tar":   # its pickle member would run os.system
        assert report.verdict == "unsafe"
    assert Code.TORCH_TAR_UNDECIDED not in {f.code for f in report.findings}


@pytest.mark.parametrize("main", [_W, EVIL_MAIN], ids=["clean stream", "evil stream"])
@pytest.mark.parametrize("engine", ENGINES)
def test_pax_records_tarfile_versions_differ_on_are_judged_both_ways(
        tmp_path: Path, main: bytes, engine: str) -> None:
    """'0 a=b': a record of length 0 (this Python's tarfile refuses it, so torch reads the
    stream; not every CPython's tarfile did): never `safe`, and the stream's call is found."""
    record = b"0 a=b\n"
    tar = _checksummed(_header(b"x", len(record))) + record.ljust(512, b"\0") \
        + _checksummed(_header(b"0", 0, b"file"))
    path = tmp_path / "pax.pt"
    path.write_bytes(_polyglot(tar, main))
    report = scan_path(path, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
    codes = {f.code for f in report.findings}
    assert Code.TORCH_TAR_UNDECIDED in codes and report.verdict != "safe"
    assert report.weights_only.error_type == "Unmodelled"
    assert (report.verdict == "unsafe") is (main is EVIL_MAIN)


def test_a_chain_past_the_probe_cap_is_judged_both_ways(tmp_path: Path) -> None:
    """A pax header whose records run past Limits.max_tar_probe_bytes: torch reads a tar, the
    scan cannot tell within its cap; the tar's pickle member is judged all the same."""
    limits = Limits(max_tar_probe_bytes=4096)
    records = b"".join(_pax_record(b"comment", b"a" * 87) for _ in range(60))
    big = _checksummed(_header(b"x", len(records))) + records.ljust(-(-len(records) // 512) * 512, b"\0")
    path = tmp_path / "long.pt"
    path.write_bytes(_polyglot(big + _tar_with_pax(1)))
    report = scan_path(path, options=ScanOptions(limits=limits))
    assert Code.TORCH_TAR_UNDECIDED in {f.code for f in report.findings}
    assert report.verdict == "unsafe"   # the tar's pickle member: os.system
    assert not report.weights_only.loadable


def test_a_key_list_naming_a_view_is_not_modelled(tmp_path: Path) -> None:
    """A divergence hunt: keys ['0', 'v1'] where 'v1' is a view of '0': torch reads the second
    block through the view, into the root's bytes (it loads [9., 9.]); the scan listed the root
    block's values ([2., 3.]), `safe`. It says it does not model that."""
    import torch

    from tests.core.legacy.conftest import stream

    pid = (b"(X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpu"
           b"K\x04(X\x02\x00\x00\x00v1K\x01K\x02ttQ")
    main = (b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n(" + pid
            + b"K\x00K\x02\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtRs.")
    path = tmp_path / "views.pt"
    path.write_bytes(stream(main, ["0", "v1"], [(4, struct.pack("<4f", 1, 2, 3, 4)),
                                                 (2, struct.pack("<2f", 9, 9))]))
    assert torch.load(path, weights_only=True)["w"].tolist() == [9.0, 9.0]
    for engine in ENGINES:
        report = scan_path(path, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
        assert report.verdict == "suspicious" and report.weights_only.error_type == "Unmodelled"
        assert "names the view 'v1'" in (report.weights_only.error or "")


@pytest.mark.parametrize("engine", ENGINES)
def test_an_undecided_tar_behind_a_plain_pickle_is_judged_both_ways(tmp_path: Path,
                                                                    engine: str) -> None:
    """A review: a pax body tarfile versions read apart ('junk\\n'), then a member whose pickle
    calls os.system, the whole file also a pickle of one string (no legacy magic): the sniff
    took the undecided tar for no tar, the file for a plain pickle, and said `safe`."""
    body = b"junk\n"
    member = EVIL_PROTOCOL0

    def build(length: int) -> bytes:
        first = _header(b"x", len(body), name=b"\x80\x02X" + struct.pack("<I", length))
        return (_checksummed(first) + body.ljust(512, b"\0")
                + _checksummed(_header(b"0", len(member), b"storages")) + member.ljust(512, b"\0")
                + bytes(1024))
    data = build(len(build(0)) - 7) + b"."
    path = tmp_path / "undecided.pt"
    path.write_bytes(data)
    report = scan_path(path, options=ScanOptions(engine=engine))  # type: ignore[arg-type]
    assert Code.TORCH_TAR_UNDECIDED in {f.code for f in report.findings}
    assert report.verdict == "unsafe"


@pytest.mark.parametrize("bad", ["sparse entry", "padding", "long length", "X header"])
def test_tar_headers_tarfile_refuses_or_reads_apart_are_never_a_plain_tar(bad: str) -> None:
    """tarfile refuses a sparse header whose sparse entries are not numbers (on every
    version); the others (junk in a pax body's padding, a record length of more than 20
    digits, a Solaris X header's records) versions read apart: undecided, never True."""
    from ckptguard.core.sniff import tar_probe

    if bad == "sparse entry":
        block = _header(b"S", 0, b"file")
        block[386:398] = b"not a number"
        assert tar_probe(_checksummed(block) + bytes(512))[0] is False
        return
    record = _pax_record(b"comment", b"a")
    kind, padding = b"x", b"\0"
    if bad == "padding":
        padding = b"z"
    elif bad == "long length":
        record = b"0" * 4400 + record
    else:
        kind, record = b"X", b"0 a=b\n"
    head = (_checksummed(_header(kind, len(record))) + record.ljust(512, padding)
            + _checksummed(_header(b"0", 0, b"file")))
    assert tar_probe(head)[0] is None
