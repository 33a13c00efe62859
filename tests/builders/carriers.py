"""Carriers: a payload pickle hidden in a region torch does not read but another reader would.

Each builder takes the payload's bytes and returns a whole file: a clean torch archive (built
with `torchlayout`, or `zipbuild` where a field must be forced) with the payload appended,
prepended, between records, in a record no storage references, in an entry torch refuses,
inside a zip inside a region, ... `CARRIERS` maps each name to its builder and to the
region kind (core.regions.RegionKind) the scan must name.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tests.builders.legacy_tar import legacy_tar
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import META, state_dict, torch_layout, v2
from tests.core.zip.zipbuild import Member, build_zip

PREFIX = "archive"
CLEAN_PKL = state_dict(("w", v2("0")))
WEIGHTS = (("0", b"\x00\x00\x80?" * 2),)   # two float32 ones


def clean_archive(*, extra: tuple[tuple[str, bytes], ...] = ()) -> bytes:
    """A torch.save-shaped archive of {'w': tensor([1., 1.])} (+ extra records after META)."""
    return torch_layout(PREFIX, CLEAN_PKL, WEIGHTS, meta=(*META, *extra))


def _members(data_pkl: bytes = CLEAN_PKL) -> list[Member]:
    """The records of a torch archive as zipbuild members (stored, no padding)."""
    return [Member(f"{PREFIX}/data.pkl", data_pkl), Member(f"{PREFIX}/data/0", WEIGHTS[0][1]),
            *(Member(f"{PREFIX}/{name}", body) for name, body in META)]


def local_record(name: str, data: bytes) -> bytes:
    """A stored local record (header + data) that no central entry lists."""
    raw = name.encode()
    return struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0x0800, 0, 0, 0, zlib.crc32(data),
                       len(data), len(data), len(raw), 0) + raw + data


def appended(payload: bytes) -> bytes:
    return clean_archive() + payload


def appended_after_a_harmless_pickle(payload: bytes) -> bytes:
    """A harmless pickle first, the payload after its STOP: a sniffer that stops at the
    first pickle sees nothing; a reader that calls pickle.load twice runs it."""
    return clean_archive() + pickle.dumps({"step": 1}, protocol=2) + payload


def appended_zip(payload: bytes) -> bytes:
    """A second archive appended: every zip reader (miniz, zipfile) takes the LAST end record,
    so zipfile reads the appended archive (its offsets shifted) and torch fails."""
    return clean_archive() + torch_layout("evil", payload, ())


def zip_in_record(payload: bytes) -> bytes:
    """An unreferenced record that is itself an archive holding the payload: a zip inside a
    region, opened in place."""
    return clean_archive(extra=(("extra.zip", torch_layout("evil", payload, ())),))


def zip_in_gap(payload: bytes) -> bytes:
    members = _members()
    members[2].gap_before = generic_zip_member(payload)
    return build_zip(members)


def junk_prefix_unadjusted(payload: bytes) -> bytes:
    """Bytes before an archive whose offsets do not count them (`cat stub x.zip`): Python's
    zipfile reads the archive, torch does not. The payload is the archive's own data.pkl."""
    return build_zip(_members(payload), prepend=b"\x7fELF" + b"\x00" * 60, relative_offsets=True)


def prepended_pickle(payload: bytes) -> bytes:
    """The payload first, the archive after it (offsets unadjusted): pickle.load runs it."""
    return build_zip(_members(), prepend=payload, relative_offsets=True)


def prepended_local_record(payload: bytes) -> bytes:
    """A local record before the first listed one (offsets absolute): torch loads the archive;
    a streaming reader that walks local headers reads the payload first."""
    return build_zip(_members(), prepend=local_record(f"{PREFIX}/extra.pkl", payload))


def gap_between_records(payload: bytes) -> bytes:
    members = _members()
    members[1].gap_before = payload
    return build_zip(members)


def unreferenced_record(payload: bytes) -> bytes:
    return clean_archive(extra=(("extra.pkl", payload),))


def unreferenced_deflated(payload: bytes) -> bytes:
    return build_zip([*_members(), Member(f"{PREFIX}/extra.pkl", payload, method=8)])


def encrypted_flag_entry(payload: bytes) -> bytes:
    """An entry flagged encrypted whose bytes are stored plain: torch refuses it, a reader
    that ignores the flag reads the payload."""
    return build_zip([*_members(), Member(f"{PREFIX}/extra.pkl", payload, flags=0x0801)])


def unsupported_method_entry(payload: bytes) -> bytes:
    return build_zip([*_members(), Member(f"{PREFIX}/extra.pkl", payload, method=99,
                                          payload=payload)])


def shadowed_duplicate(payload: bytes) -> bytes:
    """Two entries named data.pkl; torch reads the clean one, the other holds the payload."""
    members = _members()
    return build_zip([*members, Member(f"{PREFIX}/DATA.pkl", payload)])


def generic_zip_member(payload: bytes) -> bytes:
    """A zip that is no checkpoint layout, its payload in a member without a .pkl name."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model/config.json", b"{}")
        zf.writestr("model/weights.bin", payload)
    return buf.getvalue()


def npz_member(payload: bytes) -> bytes:
    """An .npz whose second member is named like an array but holds the payload."""
    arr = io.BytesIO()
    np.save(arr, np.ones(2, dtype=np.float32))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("a.npy", arr.getvalue())
        zf.writestr("b.npy", payload)
    return buf.getvalue()


def tar_member(payload: bytes) -> bytes:
    """A legacy torch .tar with an extra member (torch reads sys_info, pickle, storages and
    tensors by name; a custom loader may unpickle anything else)."""
    count = asm(("PROTO", 2), ("BININT1", 0), "STOP")
    members = {"sys_info": asm(("PROTO", 2), "EMPTY_DICT", "STOP"), "storages": count,
               "tensors": count, "pickle": asm(("PROTO", 2), "EMPTY_DICT", "STOP"),
               "extra.pkl": payload}
    return legacy_tar(members)


def tar_sys_info(payload: bytes) -> bytes:
    """torch's own legacy loader unpickles sys_info (without weights_only) before anything."""
    count = asm(("PROTO", 2), ("BININT1", 0), "STOP")
    return legacy_tar({"sys_info": payload, "storages": count, "tensors": count,
                       "pickle": asm(("PROTO", 2), "EMPTY_DICT", "STOP")})


def huge_gap(path: Path, gap_head: bytes, gap_size: int = 1 << 30) -> None:
    """A clean archive with a `gap_size`-byte gap before its central directory that starts
    with `gap_head` (sparse: a 1 GB region costs no disk). An appended region cannot be this
    large: zip readers look for the end record in the last 64 KiB only."""
    data = build_zip([Member(f"{PREFIX}/data.pkl", pickle.dumps({"lr": 0.1}, protocol=2)),
                      Member(f"{PREFIX}/version", b"3\n")])
    eocd = data.rindex(b"PK\x05\x06")
    cd_offset = int.from_bytes(data[eocd + 16:eocd + 20], "little")
    tail = bytearray(data[cd_offset:])
    tail[eocd - cd_offset + 16:eocd - cd_offset + 20] = (cd_offset + gap_size).to_bytes(4, "little")
    with path.open("wb") as f:
        f.write(data[:cd_offset] + gap_head)
        f.seek(cd_offset + gap_size)
        f.write(tail)


# name -> (builder, region kind the finding names; None: judged as the file's own content)
CARRIERS: dict[str, tuple[Callable[[bytes], bytes], str | None]] = {
    "appended": (appended, "appended"),
    "appended_after_a_harmless_pickle": (appended_after_a_harmless_pickle, "appended"),
    "appended_zip": (appended_zip, None),
    "zip_in_record": (zip_in_record, "zip member"),
    "zip_in_gap": (zip_in_gap, "zip member"),
    "junk_prefix_unadjusted": (junk_prefix_unadjusted, None),
    "prepended_pickle": (prepended_pickle, "prefix"),
    "prepended_local_record": (prepended_local_record, "local record"),
    "gap_between_records": (gap_between_records, "gap"),
    "unreferenced_record": (unreferenced_record, "unreferenced record"),
    "unreferenced_deflated": (unreferenced_deflated, "unreferenced record"),
    "encrypted_flag_entry": (encrypted_flag_entry, "refused entry"),
    "unsupported_method_entry": (unsupported_method_entry, "refused entry"),
    "shadowed_duplicate": (shadowed_duplicate, "shadowed entry"),
    "generic_zip_member": (generic_zip_member, "zip member"),
    "npz_member": (npz_member, "npz member"),
    "tar_member": (tar_member, "tar member"),
    "tar_sys_info": (tar_sys_info, "tar member"),
}
