"""A region: a byte range torch skips but another reader would parse, declared by the
format modules where they report its position, judged at the end of the scan
(core.regions.judge). Pure data, so every layer may declare one.
"""

from __future__ import annotations

from ckptguard.core.typenames import NamedTuple

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Literal, TypeAlias

RegionKind: TypeAlias = ('Literal["prefix", "appended", "gap", "unreferenced record", "refused entry", '
                         '"shadowed entry", "outside-prefix entry", "zip member", "npz member", '
                         '"tar member", "local record"]')


class Region(NamedTuple):
    """A byte range torch skips. `offset` is its first byte, or its zip local header's.
    (A tuple: a 200,000-member archive declares 200,000 of them.)"""

    kind: RegionKind
    offset: int
    nbytes: int                   # bytes as stored (a zip entry's compressed size)
    record: str | None = None     # the archive member, when it is one
    deflated: bool = False        # a raw deflate stream (zip method 8): inflated to judge
    local_header: bool = False    # `offset` is a zip local header; the bytes follow it
    depth: int = 0                # 1 for a member of a zip found inside a region, ...


def declare(regions: list[Region], kind: RegionKind, offset: int, nbytes: int, *,
            record: str | None = None) -> None:
    """Queue the raw bytes [offset, offset + nbytes) (in `Analysis.regions`) for judging."""
    if nbytes > 0:
        regions.append(Region(kind, offset, nbytes, record))


def declare_entry(regions: list[Region], kind: RegionKind, *, header_offset: int,
                  compressed_size: int, method: int, record: str) -> None:
    """Queue a zip entry's bytes as a reader that ignores its flags and method sees them:
    deflated bytes inflated, any other method (and an encrypted flag) read as stored."""
    if compressed_size > 0:
        regions.append(Region(kind, header_offset, compressed_size, record,
                              deflated=method == 8, local_header=True))
