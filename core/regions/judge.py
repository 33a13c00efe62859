"""Regions: bytes torch does not read but another reader would, judged by their content.

Strategy: the format modules only *declare* a region (core.regions.region) where they
already report its position (ZIP_APPENDED_DATA, TORCH_UNREFERENCED_RECORD, an encrypted
entry, an extra tar member, ...). At the end of the scan `judge_regions` reads each region's
first bytes (`Limits.region_sniff_bytes`, one batched read per wave) and reads on only where
those bytes could start something a reader runs:

* a pickle goes through the symbolic VM and the threat analysis, as the main pickle does
  (core.pickle.vm + core.threats.assess); its window grows only while the pickle runs past
  it. Junk that merely parses (weights, padding) imports nothing and adds nothing; a pickle
  that imports is REGION_PICKLE, one with a dangerous global or call REGION_PAYLOAD;
* a zip (a region starting with a local header) is opened in place and each member becomes
  a region one level deeper (`Limits.max_region_depth`); a local record that no directory
  lists is read as a streaming reader reads it (its data is the next region).

What regions read is counted in `io.region_bytes_read` (part of `io.bytes_read`) and paid
from one budget per scan (`Limits.max_region_bytes`, `Limits.max_regions`): a region the
budget cannot pay for is REGION_UNJUDGED (suspicious), never read whole and never `invalid`.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from ckptguard.core.errors import CkptError, Code, Effect, LimitExceeded, SourceError
from ckptguard.core.io.source import ByteSource, BytesSource, WindowSource
from ckptguard.core.limits import Limits
from ckptguard.core.pickle.result import GlobalUse, VmResult
from ckptguard.core.pickle.vm import DOTTED_NAME, run_vm
from ckptguard.core.records import field, record, replace
from ckptguard.core.regions.region import Region
from ckptguard.core.sniff import NUMPY_MAGIC, ZIP_LOCAL_MAGIC, looks_like_pickle
from ckptguard.core.state import Analysis
from ckptguard.core.threats.assess import assess, classify_global
from ckptguard.core.zip.layout import FLAG_DESCRIPTOR, LOCAL_SIZE


@record(slots=True)
class _Budget:
    """What the regions of one scan may still read and how many may still be judged."""

    bytes_left: int
    regions_left: int
    spent: int = 0
    # (source, first byte) -> where the stored pickle judged from there ends: regions that
    # start at one byte and hold all of that pickle (400 zip entries sharing a local header,
    # their sizes apart) run the VM once, not once each (each run may spend a VM's budgets)
    # (and whether what follows it is read as the next region)
    judged: dict[tuple[int, int], tuple[int, bool]] = field(default_factory=dict)

    def pay(self, nbytes: int) -> bool:
        if nbytes > self.bytes_left:
            return False
        self.bytes_left -= nbytes
        self.spent += nbytes
        return True


class _Unjudged(NamedTuple):
    region: Region
    reason: str


def judge_regions(source: ByteSource, an: Analysis) -> None:
    """Judge every region declared so far (see the module docstring); findings go to `an`."""
    if not an.regions:
        return
    limits = an.options.limits
    budget = _Budget(limits.max_region_bytes, limits.max_regions)
    wave: list[tuple[ByteSource, Region]] = [(source, r) for r in an.regions]
    an.regions = []
    # the source itself, not its id(): an inflated inner zip's buffer may be freed and its
    # id reused by the next one
    seen: set[tuple[object, int, int, bool]] = set()
    unjudged: list[_Unjudged] = []
    too_many = f"the region budget ran out (Limits.max_regions = {limits.max_regions})"
    while wave:
        batch: list[tuple[ByteSource, Region]] = []
        for src, region in wave:
            key = (src, region.offset, region.nbytes, region.local_header)
            if key in seen:
                continue
            seen.add(key)
            if budget.regions_left <= 0:
                unjudged.append(_Unjudged(region, too_many))
                continue
            budget.regions_left -= 1
            batch.append((src, region))
        wave = []
        for src, group in _by_source(batch):
            wave += _judge_batch(src, group, an, budget, unjudged)
    an.io["regions"] = len(seen)                 # every distinct region met, nested ones too
    an.io["regions_unjudged"] = len(unjudged)
    an.io["region_bytes_read"] = budget.spent
    _report_unjudged(an, unjudged, limits)


def _by_source(batch: list[tuple[ByteSource, Region]]) -> list[tuple[ByteSource, list[Region]]]:
    groups: dict[int, tuple[ByteSource, list[Region]]] = {}
    for src, region in batch:
        groups.setdefault(id(src), (src, []))[1].append(region)
    return list(groups.values())


def _judge_batch(source: ByteSource, regions: list[Region], an: Analysis, budget: _Budget,
                 unjudged: list[_Unjudged]) -> list[tuple[ByteSource, Region]]:
    """Sniff a batch of regions of one source; judge the pickles; return the members of the
    zips found (the next wave)."""
    limits = an.options.limits
    located = _locate(source, regions, budget, unjudged)
    spans: list[tuple[int, int]] = []
    sniffed: list[tuple[Region, int, int]] = []   # region, data offset, bytes there
    for region, start, nbytes in located:
        first = min(nbytes, limits.region_sniff_bytes)
        if not budget.pay(first):
            unjudged.append(_Unjudged(region, "the region budget ran out (Limits.max_region_bytes)"))
            continue
        spans.append((start, first))
        sniffed.append((region, start, nbytes))
    heads = source.read_many(spans) if spans else []
    after: list[tuple[ByteSource, Region]] = []
    for (region, start, nbytes), raw in zip(sniffed, heads, strict=True):
        content = _Content(source, start, nbytes, region.deflated, raw, limits.region_sniff_bytes)
        head = content.first(limits.region_sniff_bytes)
        if head.startswith(ZIP_LOCAL_MAGIC) and region.depth < limits.max_region_depth:
            members = _zip_members(source, region, start, nbytes, content, an, budget, unjudged)
            after += members if members is not None else _local_record(source, region, start,
                                                                        nbytes, head)
        elif head.startswith(NUMPY_MAGIC):   # before the pickle test: 0x93 is STACK_GLOBAL
            after += _npy_object_pickle(source, region, start, content, an, budget, unjudged)
        elif looks_like_pickle(head):
            after += _judge_pickle(source, region, start, content, an, budget, unjudged)
    return after


class _After:
    """A region's content from `skip` bytes on (what follows an .npy header)."""

    def __init__(self, content: _Content, skip: int) -> None:
        self.content, self.skip = content, skip

    @property
    def data(self) -> bytes:
        return self.content.data[self.skip:]

    @property
    def complete(self) -> bool:
        return self.content.complete

    @property
    def nbytes(self) -> int:
        return self.content.nbytes - self.skip

    def grow(self, want: int, budget: _Budget) -> bool:
        return self.content.grow(want + self.skip, budget)


def _npy_object_pickle(source: ByteSource, region: Region, start: int, content: _Content,
                       an: Analysis, budget: _Budget,
                       unjudged: list[_Unjudged]) -> list[tuple[ByteSource, Region]]:
    """An .npy: `numpy.load(..., allow_pickle=True)` (which opens any zip as an .npz) unpickles
    the data of an object-dtype array, right after the header. That pickle is judged like
    any region's; an array of another dtype is never unpickled."""
    from ckptguard.core.npyheader import declared_header, parse_npy_header  # numpy: .npy only

    limits = an.options.limits
    declared = declared_header(content.first(12))
    if declared is None:
        return []   # a version numpy does not read: it unpickles nothing
    version, text_start, text_len = declared
    header_end = text_start + text_len
    if text_len > limits.max_npy_header_bytes or not content.grow(header_end + 1, budget):
        return []
    try:
        _, _, dtype = parse_npy_header(content.data[text_start:header_end], version,
                                       limits.max_npy_header_bytes)
    except CkptError:
        return []   # numpy refuses the header: it unpickles nothing
    if not dtype.hasobject:
        return []
    return _judge_pickle(source, region, start + header_end, _After(content, header_end),  # type: ignore[arg-type]
                         an, budget, unjudged)


def _locate(source: ByteSource, regions: list[Region], budget: _Budget,
            unjudged: list[_Unjudged]) -> list[tuple[Region, int, int]]:
    """(region, offset of its bytes, their count) — a zip entry's bytes follow its local
    header, whose fixed part says how long its name and extra field are."""
    out: list[tuple[Region, int, int]] = []
    headers = [r for r in regions if r.local_header and r.offset + LOCAL_SIZE <= source.size]
    paid = [r for r in headers if budget.pay(LOCAL_SIZE)]
    for r in headers[len(paid):]:   # every header costs the same: the unpaid ones are the last
        unjudged.append(_Unjudged(r, "the region budget ran out (Limits.max_region_bytes)"))
    fixed = dict(zip((id(r) for r in paid),
                     source.read_many([(r.offset, LOCAL_SIZE) for r in paid]) if paid else [],
                     strict=True))
    for region in regions:
        start = region.offset
        if region.local_header:
            raw = fixed.get(id(region))
            if raw is None or not raw.startswith(ZIP_LOCAL_MAGIC):
                continue   # no local header there: the zip checks already say so
            start += LOCAL_SIZE + int.from_bytes(raw[26:28], "little") \
                + int.from_bytes(raw[28:30], "little")
        nbytes = min(region.nbytes, source.size - start)
        if nbytes > 0:
            out.append((region, start, nbytes))
    return out


class _Content:
    """The first bytes of a region as a reader sees them (inflated when deflated), read on
    demand so a 1 GB region costs only what its judging needs."""

    def __init__(self, source: ByteSource, start: int, nbytes: int, deflated: bool,
                 first_raw: bytes, first: int) -> None:
        self.source, self.start, self.nbytes = source, start, nbytes
        self.read = len(first_raw)
        self.inflater = zlib.decompressobj(-15) if deflated else None
        self.data = b""
        self.broken = False      # a deflate stream that does not inflate: nothing more to see
        self._feed(first_raw, first)   # a deflate bomb inflates no further than asked

    @property
    def complete(self) -> bool:
        if self.inflater is not None:
            return self.broken or self.inflater.eof or (
                self.read >= self.nbytes and not self.inflater.unconsumed_tail)
        return self.read >= self.nbytes

    def first(self, nbytes: int) -> bytes:
        return self.data[:nbytes]

    def grow(self, want: int, budget: _Budget) -> bool:
        """Make at least `want` bytes available (or all there are); False: the budget ran out."""
        while len(self.data) < want and not self.complete:
            if self.inflater is not None and self.inflater.unconsumed_tail:
                self._feed(b"", want)
                continue
            n = min(max(want - len(self.data), 4096), self.nbytes - self.read)
            if not budget.pay(n):
                return False
            chunk = self.source.read_at(self.start + self.read, n)
            self.read += n
            self._feed(chunk, want)
        return True

    def _feed(self, raw: bytes, want: int) -> None:
        if self.inflater is None:
            self.data += raw
            return
        try:
            more = self.inflater.decompress(self.inflater.unconsumed_tail + raw,
                                            max(want - len(self.data), 1))
        except zlib.error:
            self.broken = True
            return
        self.data += more


def _judge_pickle(source: ByteSource, region: Region, start: int, content: _Content,
                  an: Analysis, budget: _Budget,
                  unjudged: list[_Unjudged]) -> list[tuple[ByteSource, Region]]:
    """The symbolic VM over the region's pickle, its window grown only while the pickle runs
    past it; the threat analysis when it imports anything a reader would import. A real
    pickle that stops before the region ends leaves the rest as the next region: a reader
    that calls `pickle.load` again reads on (a harmless pickle first hides nothing)."""
    limits = an.options.limits
    seen = budget.judged.get((id(source), start)) if not region.deflated else None
    if seen is not None and seen[0] <= content.nbytes:   # judged already; what follows is not
        end, follows = seen
        rest = content.nbytes - end
        return [(source, region._replace(offset=start + end, nbytes=rest, local_header=False))] \
            if follows and rest > 0 else []
    base = start if not region.deflated else 0   # inflated bytes have no file offsets
    cap = min(limits.max_pickle_bytes, limits.max_region_bytes)
    window = len(content.data)
    while True:
        vm = run_vm(content.data[:window], base_offset=base, limits=limits)
        truncated = vm.error is not None and vm.error.code is Code.PICKLE_TRUNCATED
        if not truncated or (content.complete and window >= len(content.data)):
            break
        want = min(max(window * 4, 4096), cap)
        if want <= window or not content.grow(want, budget):
            unjudged.append(_Unjudged(region, "its pickle runs past the region budget "
                                      f"(Limits.max_region_bytes = {limits.max_region_bytes})"))
            break
        window = min(want, len(content.data))
    imports = [g for g in vm.globals
               if DOTTED_NAME.fullmatch(g.raw_module) and DOTTED_NAME.fullmatch(g.raw_name)]
    if imports:
        _assess_region(region, start, vm, imports, an)
    elif vm.error is not None and vm.error.code.name.startswith("LIMIT_"):
        unjudged.append(_Unjudged(region, f"its pickle runs past the scanner's limits "
                                  f"({vm.error.message})"))
    follows = vm.protocol is not None or vm.opcode_count > 2   # not junk that hit a '.'
    if vm.complete and not region.deflated:
        budget.judged[(id(source), start)] = (vm.end, follows)
    rest = content.nbytes - vm.end
    if vm.complete and rest > 0 and not region.deflated and follows:
        return [(source, region._replace(offset=start + vm.end, nbytes=rest,
                                          local_header=False))]
    return []


def _assess_region(region: Region, start: int, vm: VmResult, imports: list[GlobalUse],
                   an: Analysis) -> None:
    before = _unsafe_findings(an)
    assess(vm, an, allow=an.options.allow, record=region.record)
    dangerous = [g for g in imports if classify_global(g.module, g.name).status == "dangerous"]
    shown = ", ".join(f"{g.module}.{g.name}" for g in (dangerous or imports)[:3])
    more = f" and {len(imports) - 3} more" if len(imports) > 3 else ""
    what = _describe(region, start)
    if dangerous or _unsafe_findings(an) > before:
        an.add(Code.REGION_PAYLOAD, f"{what} is a pickle that imports {shown}{more}: a payload "
               "that another reader (pickle.load, a zip reader, a custom loader) would run",
               record=region.record, offset=start)
    else:
        an.add(Code.REGION_PICKLE, f"{what} is a pickle that imports {shown}{more}",
               record=region.record, offset=start)


def _unsafe_findings(an: Analysis) -> int:
    """Findings so far whose code makes the verdict unsafe (counted past the listing cap)."""
    return sum(n for (code, _sev), n in an.per_code.items() if code.effect is Effect.UNSAFE)


def _describe(region: Region, start: int) -> str:
    name = f" {region.record!r}" if region.record else ""
    inside = " (inflated)" if region.deflated else ""
    return f"the {region.kind}{name} ({region.nbytes} bytes at {start}){inside}"


def _zip_members(source: ByteSource, region: Region, start: int, nbytes: int, content: _Content,
                 an: Analysis, budget: _Budget,
                 unjudged: list[_Unjudged]) -> list[tuple[ByteSource, Region]] | None:
    """A zip inside a region: its directory is read in place (paid from the budget) and every
    member becomes a region one level deeper. None: no archive there."""
    from ckptguard.core.zip.directory import read_directory

    limits = an.options.limits
    inner: ByteSource
    if region.deflated:   # only in memory: as much as the budget pays for
        if not content.grow(limits.max_region_bytes, budget) or not content.complete:
            unjudged.append(_Unjudged(region, "a deflated zip larger than the region budget"))
            return []
        inner = BytesSource(content.data, name=region.record or region.kind)
    else:
        inner = WindowSource(source, start, nbytes, region.record or region.kind)
    outer_read = source.stats.bytes_read
    try:
        directory = read_directory(inner, _inner_limits(limits, budget))
    except SourceError:
        raise
    except LimitExceeded as exc:
        unjudged.append(_Unjudged(region, f"the zip inside it is too large ({exc.message})"))
        return []
    except CkptError:
        return None   # a local header without an archive behind it
    finally:
        if not region.deflated:   # the window read through the outer source
            budget.pay(min(source.stats.bytes_read - outer_read, budget.bytes_left))
    label = region.record or f"{region.kind}@{start}"
    # stored in place: the members' offsets are the file's; inflated: the buffer's
    outer, base = (inner, 0) if region.deflated else (source, start)
    return [(outer, Region("zip member", base + e.header_offset, e.compressed_size,
                           f"{label}::{e.name}", deflated=e.method == 8, local_header=True,
                           depth=region.depth + 1))
            for e in directory.entries]


def _local_record(source: ByteSource, region: Region, start: int, nbytes: int,
                  head: bytes) -> list[tuple[ByteSource, Region]]:
    """A local record no central entry lists (smuggled before or between records): streaming
    readers (Java's ZipInputStream, stream-unzip, `unzip` recovering) walk local headers
    and read it, so its data is a region one level deeper."""
    if region.deflated or len(head) < LOCAL_SIZE:
        return []
    flags, method = int.from_bytes(head[6:8], "little"), int.from_bytes(head[8:10], "little")
    csize = int.from_bytes(head[18:22], "little")
    n, m = int.from_bytes(head[26:28], "little"), int.from_bytes(head[28:30], "little")
    room = nbytes - LOCAL_SIZE - n - m
    if flags & FLAG_DESCRIPTOR or csize > room:   # sizes deferred to a data descriptor: up to the end
        csize = room
    name = head[LOCAL_SIZE:LOCAL_SIZE + n].decode("utf-8", "replace")
    return [(source, Region("local record", start, csize, name or None, deflated=method == 8,
                            local_header=True, depth=region.depth + 1))]


def _inner_limits(limits: Limits, budget: _Budget) -> Limits:
    """A nested directory may be as large as what the budget still pays for."""
    return replace(limits, max_central_dir_bytes=min(limits.max_central_dir_bytes,
                                                     budget.bytes_left),
                   max_zip_entries=min(limits.max_zip_entries, max(budget.regions_left, 0)))


def _report_unjudged(an: Analysis, unjudged: list[_Unjudged], limits: Limits) -> None:
    listed = limits.max_region_findings
    for item in unjudged[:listed]:
        r = item.region
        an.add(Code.REGION_UNJUDGED, f"the {r.kind}{f' {r.record!r}' if r.record else ''} "
               f"({r.nbytes} bytes at {r.offset}) was not judged: {item.reason}",
               record=r.record, offset=r.offset)
    if len(unjudged) > listed:
        an.add(Code.REGION_UNJUDGED, f"... and {len(unjudged) - listed} more regions not "
               f"judged (the scan's region budget: {limits.max_regions} regions, "
               f"{limits.max_region_bytes} bytes)")
