"""torch.load's checks of a zip checkpoint's small records, before it unpickles (FORMATS.md §1.1, §2.5).

The record names torch reads besides data.pkl and the storages, and what it raises on their
contents: the version record, byteorder, storage alignment and serialization id. The
general path (core.formats.torch_zip) and the fast lane (core.lane.torch_zip) both apply
them; the general path adds the checks on the archive around them (miniz's).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ckptguard.core.torch.torch_error import TorchError, cpp_error

META_RECORDS = ("version", ".data/version", "byteorder", ".format_version", ".storage_alignment")
SERIALIZATION_ID = ".data/serialization_id"
KNOWN_RECORDS = frozenset(("data.pkl", SERIALIZATION_ID, *META_RECORDS))
SMALL_RECORD_MAX = 4096


def serialization_id_error(meta: Mapping[str, bytes]) -> TorchError | None:
    """torch.load logs `zip_file.serialization_id()` after unpickling: pybind11 decodes the
    record as UTF-8, strictly."""
    try:
        meta.get(".data/serialization_id", b"").decode("utf-8")
    except UnicodeDecodeError as exc:
        return TorchError("UnicodeDecodeError", str(exc))
    return None


def version_error(meta: Mapping[str, bytes]) -> TorchError | None:
    """torch's check of the version record (inline_container.cc)."""
    version = meta.get(".data/version", meta.get("version"))
    if version is None:
        return TorchError("RuntimeError", 'Expected hasRecord("version") to be true, but got false.  '
                          "(Could this error message be improved?  If so, please report an enhancement "
                          "request to PyTorch.)")
    # `version_ = std::stoull(text)` into an int64_t: strtoull's leading spaces, sign and
    # digits; a minus negates modulo 2**64 ("-18446744073709551615" is 1); a magnitude past
    # 2**64 - 1 throws out_of_range (IndexError: stoull); the int64 cast wraps past 2**63
    m = re.match(rb"\s*([+-]?)(\d+)", version)
    if m is None:
        return cpp_error(b"[enforce fail at inline_container.cc:215] . Couldn't parse the version "
                         + version + b" as Long Long.")
    magnitude = int(m.group(2))
    if magnitude >= 1 << 64:
        return TorchError("IndexError", "stoull")
    unsigned = (-magnitude if m.group(1) == b"-" else magnitude) % (1 << 64)
    number = unsigned - (1 << 64) if unsigned >= 1 << 63 else unsigned
    if number < 1:
        return TorchError("RuntimeError", f"[enforce fail at inline_container.cc:219] . Attempted to read "
                          f"a PyTorch file with version {number}, but the minimum supported version for "
                          "reading is 1. Your PyTorch script module file is too old. Please regenerate it "
                          "with latest version of PyTorch to mitigate this issue.")
    if number > 10:
        return TorchError("RuntimeError", f"[enforce fail at inline_container.cc:230] . Attempted to read "
                          f"a PyTorch file with version {number}, but the maximum supported version for "
                          "reading is 10. The version of your PyTorch installation may be too old, please "
                          "upgrade PyTorch to latest version to mitigate this issue.")
    return None


def layout_error(meta: Mapping[str, bytes]) -> TorchError | None:
    """torch's checks of the byteorder and storage alignment records."""
    byteorder = meta.get("byteorder")
    if byteorder is not None and byteorder not in (b"little", b"big"):
        try:
            text = byteorder.decode()
        except UnicodeDecodeError as exc:   # torch: "Unknown endianness type: " + data.decode()
            return TorchError("UnicodeDecodeError", str(exc))
        return TorchError("ValueError", "Unknown endianness type: " + text)
    align = meta.get(".storage_alignment")
    if align is not None and parse_int(align) is None:
        return TorchError("ValueError", f"invalid literal for int() with base 10: {align!r}")
    return None


def storage_alignment(meta: Mapping[str, bytes]) -> int:
    """The alignment torch's offset chain uses (64 when absent, zero or unparsable)."""
    return parse_int(meta.get(".storage_alignment", b"64")) or 64


def parse_int(raw: bytes) -> int | None:
    try:
        return int(raw)
    except ValueError:
        return None
