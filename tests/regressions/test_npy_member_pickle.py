"""An object-dtype .npy record inside a torch zip (found by a red-team round).

`numpy.load(path, allow_pickle=True)` opens any zip as an NpzFile, and `["archive/x"]`
unpickles the member `archive/x.npy` (checked by hand with a canary: `builtins.open`
ran). torch never reads the record: ckptguard reports TORCH_UNREFERENCED_RECORD and
declares the record a region, but core.regions judges only a pickle or a zip at the
region's first byte; the .npy header (`\\x93NUMPY`) hides the pickle behind it, so the
verdict stayed `suspicious` with no word of the `os.system` call. Now an .npy region's
header is read and, for an object dtype, the pickle after it is judged. The same pickle as
the record's first byte is REGION_PAYLOAD / unsafe (the control)."""

from __future__ import annotations

import struct

from ckptguard.core.errors import Code
from ckptguard.core.scan import scan_bytes
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import META, state_dict, torch_layout, v2

PAYLOAD = asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "touch /tmp/x"),
              "TUPLE1", "REDUCE", "STOP")


def object_npy(pickled: bytes) -> bytes:
    """A version-1.0 .npy of one object element: header dict padded to 64, then the pickle."""
    header = b"{'descr': '|O', 'fortran_order': False, 'shape': (1,), }"
    header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + pickled


def with_record(name: str, payload: bytes) -> bytes:
    return torch_layout("archive", state_dict(("w", v2("0"))), [("0", bytes(8))],
                        meta=(*META, (name, payload)))


def test_control_a_bare_pickle_record_is_unsafe() -> None:
    assert scan_bytes(with_record("x.pkl", PAYLOAD)).verdict == "unsafe"


def test_object_npy_record_is_unsafe() -> None:
    report = scan_bytes(with_record("x.npy", object_npy(PAYLOAD)))
    assert report.verdict == "unsafe", [f.code for f in report.findings]


def test_a_deflated_npy_record_with_an_object_array_is_unsafe() -> None:
    """The same .npy appended deflated to a torch checkpoint by Python's zipfile: the region
    is judged inflated, header and pickle."""
    import io
    import zipfile

    buf = io.BytesIO(torch_layout("archive", state_dict(("w", v2("0"))), [("0", bytes(8))]))
    with zipfile.ZipFile(buf, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("archive/x.npy", object_npy(PAYLOAD))
    report = scan_bytes(buf.getvalue())
    assert report.verdict == "unsafe", [f.code for f in report.findings]
    assert Code.REGION_PAYLOAD in {f.code for f in report.findings}


def test_a_numeric_npy_record_holding_pickle_bytes_is_not_unsafe() -> None:
    """numpy unpickles only an object dtype: a float array's bytes are data, whatever they
    look like, so they are no evidence (`unsafe` only with evidence)."""
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (%d,), }" % (len(PAYLOAD) // 4)
    header += b" " * ((64 - (10 + len(header) + 1) % 64) % 64) + b"\n"
    npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + PAYLOAD[:len(PAYLOAD) // 4 * 4]
    report = scan_bytes(with_record("x.npy", npy))
    assert report.verdict != "unsafe", [f.code for f in report.findings]
