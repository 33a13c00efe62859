"""ZipSpans (core.filemap) of an archive the general path parsed: the map's view of it."""

from __future__ import annotations

from collections.abc import Mapping

from ckptguard.core.filemap import ZipSpans
from ckptguard.core.zip.directory import LocalHeader, ZipDirectory
from ckptguard.core.zip.layout import FLAG_DESCRIPTOR, LOCAL_SIZE
from ckptguard.core.zip.offsets import descriptor_size


def zip_spans_of(directory: ZipDirectory, locals_: Mapping[int, LocalHeader]) -> ZipSpans:
    """Entries in file order: where each record's header, bytes and descriptor are (without
    its local header, the bytes start at the lower bound header + 30 + name length)."""
    rows = []
    for e in directory.entries:
        local = locals_.get(e.index)
        data = local.data_offset if local is not None else e.header_offset + LOCAL_SIZE + len(e.name_bytes)
        desc = descriptor_size(e.header_offset, e.compressed_size) if e.flags & FLAG_DESCRIPTOR else 0
        rows.append((e.header_offset, data, e.compressed_size, data + e.compressed_size + desc, e.name))
    rows.sort()
    tail = directory.zip64_eocd_offset if directory.zip64_eocd_offset is not None \
        else directory.eocd_offset
    return ZipSpans(names=[r[4] for r in rows], header=[r[0] for r in rows],
                    data=[r[1] for r in rows], size=[r[2] for r in rows], end=[r[3] for r in rows],
                    cd_offset=directory.cd_offset, cd_end=directory.cd_offset + directory.cd_size,
                    tail_start=tail, archive_end=directory.archive_end, file_size=directory.size,
                    prefix=directory.prefix())
