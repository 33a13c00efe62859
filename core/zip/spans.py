"""ZipSpans (core.filemap) of an archive the general path parsed: the map's view of it."""

from __future__ import annotations

from collections.abc import Mapping

from ckptguard.core.filemap import ZipSpans
from ckptguard.core.records import record
from ckptguard.core.zip.directory import LocalHeader, ZipDirectory
from ckptguard.core.zip.layout import FLAG_DESCRIPTOR, LOCAL_SIZE
from ckptguard.core.zip.offsets import descriptor_size


@record(slots=True)
class _Row:
    header: int
    data: int      # where the bytes begin (a lower bound until placed, when not `known`)
    size: int
    desc: int      # data descriptor bytes after them
    name: str
    known: bool    # the local header was read


def zip_spans_of(directory: ZipDirectory, locals_: Mapping[int, LocalHeader]) -> ZipSpans:
    """Entries in file order: where each record's header, bytes and descriptor are.

    A record whose local header was not read (a remote scan reads only the ones torch
    needs) has an unknown extra field, so its bytes are placed to end where the next record
    (or the directory) begins, as torch's writer lays them out, when that is at or past the
    lower bound header + 30 + name length; else at the lower bound. No gap can be seen
    without the header (core.zip.checks reports none either), and the column lane, which
    proves the tiling, draws the same map. A data descriptor ends where the next record
    begins if that is inside it (a descriptor without its signature), so the regions of
    such an archive still tile the file."""
    rows: list[_Row] = []
    for e in directory.entries:
        local = locals_.get(e.index)
        data = local.data_offset if local is not None else e.header_offset + LOCAL_SIZE + len(e.name_bytes)
        desc = descriptor_size(e.header_offset, e.compressed_size) if e.flags & FLAG_DESCRIPTOR else 0
        rows.append(_Row(e.header_offset, data, e.compressed_size, desc, e.name, local is not None))
    rows.sort(key=lambda r: (r.header, r.data))
    for i, row in enumerate(rows):
        following = rows[i + 1].header if i + 1 < len(rows) else directory.cd_offset
        if not row.known:
            row.data = max(row.data, following - row.desc - row.size)
        elif row.data + row.size <= following < row.data + row.size + row.desc:
            # a descriptor written without its PK\x07\x08 signature (12 bytes, which
            # core.zip.checks tolerates): the bytes past it are the next record's header
            row.desc = following - row.data - row.size
    tail = directory.zip64_eocd_offset if directory.zip64_eocd_offset is not None \
        else directory.eocd_offset
    return ZipSpans(names=[r.name for r in rows], header=[r.header for r in rows],
                    data=[r.data for r in rows], size=[r.size for r in rows],
                    end=[r.data + r.size + r.desc for r in rows],
                    cd_offset=directory.cd_offset, cd_end=directory.cd_offset + directory.cd_size,
                    tail_start=tail, archive_end=directory.archive_end, file_size=directory.size,
                    prefix=directory.prefix())
