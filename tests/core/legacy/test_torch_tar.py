"""core.formats.torch_tar: the pre-0.2 .tar layout — refused like torch, pickles still judged."""

from __future__ import annotations

import io
import pickle
import struct
import tarfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Code
from ckptguard.core.formats.torch_tar import TAR_ERROR
from ckptguard.core.scan import scan_path
from ckptguard.core.sniff import is_tar
from tests.builders.legacy_tar import legacy_tar
from tests.builders.pickle_asm import asm
from tests.core.legacy.conftest import assert_same_outcome

EVIL = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "true"), "TUPLE1", "REDUCE",
           "STOP")


def storages_member(storage_header: bytes | None = None) -> bytes:
    """pickled count, per storage pickled (key, location, type) + i64 count + data, views list."""
    header = storage_header or asm(("PROTO", 2), ("BINUNICODE", "k1"), ("BINUNICODE", "cpu"),
                                   ("GLOBAL", "torch", "FloatStorage"), "TUPLE3", "STOP")
    return (pickle.dumps(1, protocol=2) + header + struct.pack("<q", 2) + b"\0" * 8
            + pickle.dumps([], protocol=2))


def tensors_member(tensor_header: bytes | None = None) -> bytes:
    header = tensor_header or pickle.dumps(("t1", "k1", None), protocol=2)
    shape = struct.pack("<i", 1) + b"\0" * 4 + struct.pack("<q", 2) + struct.pack("<q", 1)
    return pickle.dumps(1, protocol=2) + header + shape + struct.pack("<q", 0)


def base_members(**over: bytes) -> dict[str, bytes]:
    members = {"sys_info": pickle.dumps({"little_endian": True}, protocol=2),
               "storages": storages_member(), "tensors": tensors_member(),
               "pickle": pickle.dumps({"w": "t1"}, protocol=2)}
    members.update(over)
    return members


@pytest.mark.torch
def test_refused_like_torch(write: Any) -> None:
    path = write(legacy_tar(base_members()))
    report = scan_path(path)
    assert report.format == "torch-tar"
    assert Code.TORCH_LEGACY_TAR in {f.code for f in report.findings}
    assert report.weights_only.error == TAR_ERROR
    assert_same_outcome(report, path)
    assert report.verdict == "suspicious"


@pytest.mark.parametrize("where", ["pickle", "storages", "tensors", "storage_header"])
def test_hostile_pickles_inside_are_found(where: str, write: Any) -> None:
    over = {"pickle": {"pickle": EVIL}, "storages": {"storages": EVIL + b"rest"},
            "tensors": {"tensors": tensors_member(EVIL)},
            "storage_header": {"storages": storages_member(EVIL)}}[where]
    report = scan_path(write(legacy_tar(base_members(**over))))
    assert report.verdict == "unsafe"
    assert {(g.full, g.status) for g in report.globals} >= {("os.system", "dangerous")}


def test_all_zero_first_block_is_a_tar_to_torch() -> None:
    """tarfile.open accepts an all-zero first block (an empty archive): torch refuses it."""
    assert is_tar(b"\0" * 512)
    assert not is_tar(b"\0" * 511)


@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=512, max_size=512), st.booleans(), st.sampled_from([b"0", b"L", b"x", b"5"]))
def test_is_tar_agrees_with_tarfile(block: bytes, fix_checksum: bool, kind: bytes) -> None:
    """Differential: our header check vs CPython's tarfile.open on the same first block."""
    b = bytearray(block)
    b[156:157] = kind
    if fix_checksum:
        for lo, hi in ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (329, 337),
                       (337, 345)):
            b[lo:hi] = b"0" * (hi - lo - 1) + b"\0"
        b[148:156] = b" " * 8
        b[148:156] = b"%06o\0 " % (sum(b) & 0o777777)
    data = bytes(b) + b"\0" * 1024
    try:
        tarfile.open(fileobj=io.BytesIO(data), mode="r:").close()
        expected = True
    except tarfile.TarError:
        expected = False
    assert is_tar(data) == expected


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_long_name_header_chains(fmt: int) -> None:
    """A GNU long-name or pax header is a tar only if the header after it is valid too."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        info = tarfile.TarInfo("p" * 150 + "/pickle")
        tar.addfile(info, io.BytesIO(b""))
    data = buf.getvalue()
    from ckptguard.core.sniff import tar_probe

    needed = tar_probe(data[:512])[0]
    assert type(needed) is int and needed > 512 and not is_tar(data[:512])
    head = data[:needed]
    while type(needed := tar_probe(head)[0]) is int:   # (a pax body, then the next header)
        head = data[:needed]
    assert needed is True and is_tar(head)
    broken = data[:1024] + b"\xff" * 512
    assert not is_tar(broken)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_mutated_tars_never_crash(data: st.DataObject) -> None:
    from ckptguard.core.io.source import BytesSource
    from ckptguard.core.scan import scan_source

    base = bytearray(_BASE_TAR)
    for _ in range(data.draw(st.integers(1, 6))):
        pos = data.draw(st.integers(0, len(base) - 1))
        base[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(base)))
    report = scan_source(BytesSource(bytes(base[:cut])))
    assert not any(f.code == Code.INTERNAL_ERROR for f in report.findings), report.findings
    if report.format == "torch-tar":
        assert not report.weights_only.loadable


_BASE_TAR = legacy_tar(base_members(pickle=EVIL))
