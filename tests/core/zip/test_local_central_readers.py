"""Which local/central header differences make real readers read other bytes or names?

Differential: each archive is read by torch 2.13's reader (PyTorchFileReader: miniz), Python's
zipfile, Info-ZIP `unzip -p`, Java's streaming ZipInputStream and 7-Zip's `7z x` (the last three
when installed), and core.zip.checks' verdict is checked against what they did:

* ZIP_LOCAL_CENTRAL_COSMETIC (a note) or no finding: no reader reads other bytes or another
  name than torch reads; a reader may refuse or warn (unzip's exit status, a Java exception);
* ZIP_LOCAL_CENTRAL_MISMATCH (unsafe): some pair of readers reads different bytes or names.

Duplicate names likewise: ZIP_DUPLICATE_IDENTICAL only when every reader, whichever entry it
picks, reads the same bytes.
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Code
from ckptguard.core.io.source import BytesSource
from ckptguard.core.state import Analysis
from ckptguard.core.zip.checks import check_archive
from ckptguard.core.zip.directory import read_directory, read_local_headers
from tests.components import missing
from tests.core.zip.zipbuild import Member, build_zip

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

DATA = bytes(range(64)) + b"PAYLOAD!"
NAME = b"ex/data/0"
NON_ASCII = "ex/data/é".encode()
LOCAL_CRC_AT = 14      # offset of the CRC-32 in a local header
JAVA_READER = Path(__file__).parent / "readers" / "ZipStream.java"


def _deflated(data: bytes, level: int) -> bytes:
    co = zlib.compressobj(level, zlib.DEFLATED, -15)
    return co.compress(data) + co.flush()


@dataclass(frozen=True)
class Variant:
    """How the local header of the record `NAME` (or `name`) differs from its central entry."""

    local_name: bytes | None = None
    central_flags: int = 0x0800
    local_flags: int | None = None
    local_method: int | None = None
    central_method: int = 0
    local_sizes: tuple[int, int] | None = None
    descriptor: bool = False
    local_crc: int | None = None
    name: bytes = NAME
    data: bytes = DATA

    def archive(self) -> bytes:
        payload = _deflated(self.data, 6) if self.central_method == 8 else self.data
        target = Member(self.name, self.data, method=self.central_method, flags=self.central_flags,
                        local_name=self.local_name, local_flags=self.local_flags,
                        local_method=self.local_method, local_sizes=self.local_sizes,
                        descriptor=self.descriptor, payload=payload)
        blob = bytearray(build_zip([Member("ex/data.pkl", b"\x80\x02N."), target,
                                    Member("ex/version", b"3\n")]))
        if self.local_crc is not None:
            struct.pack_into("<I", blob, blob.find(b"PK\x03\x04", 1) + LOCAL_CRC_AT, self.local_crc)
        return bytes(blob)


def _verdict(blob: bytes) -> set[Code]:
    src = BytesSource(blob)
    directory = read_directory(src)
    an = Analysis()
    check_archive(directory, read_local_headers(src, directory.entries), an, source=src)
    return {f.code for f in an.findings}


@dataclass(frozen=True)
class Read:
    """What one reader made of the record: the name it gives it (torch: the raw bytes) and the
    bytes it reads, each None where it refused."""

    name: bytes | None
    data: bytes | None


def _torch(path: Path, name: bytes) -> Read:
    try:
        reader = torch._C.PyTorchFileReader(str(path))
        return Read(name, bytes(reader.get_record(name.split(b"/", 1)[1].decode("utf-8"))))
    except RuntimeError:
        return Read(None, None)


def _zipfile(blob: bytes) -> Read:
    """zipfile lists the name from the central directory even where it refuses the bytes."""
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        [info] = [i for i in z.infolist() if i.filename.startswith("ex/data/")]
        name = info.filename.encode("utf-8")
        try:
            return Read(name, z.read(info))
        except (zipfile.BadZipFile, RuntimeError, NotImplementedError, zlib.error):
            return Read(name, None)


def _unzip(path: Path, name: bytes) -> Read:
    """`unzip -p`: whatever it writes out, even with a warning or a CRC error (rc 1 or 2)."""
    done = subprocess.run(["unzip", "-p", str(path), name], capture_output=True, timeout=60,
                          check=False)
    return Read(name, done.stdout) if done.returncode in (0, 1, 2) and done.stdout else Read(None, None)


def _sevenzip(path: Path, out: Path, *, keep: str = "-aoa") -> dict[bytes, bytes | None]:
    """`7z x` into `out`, as people unpack an archive: each extracted file under ex/data/ (or
    ex/DATA/) by its name. On a header error 7-Zip leaves an empty file and exits 2: that is a refusal
    (None). `keep` picks among entries of one name: -aoa overwrites (the last one wins),
    -aos skips (the first one wins). `7z x -so` is not used: like `unzip -p` it writes every
    entry of the name one after another."""
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run(["7z", "x", "-y", keep, f"-o{out}", str(path)], capture_output=True,
                          timeout=60, check=False)
    found = [f for f in sorted(out.rglob("*"))
             if f.is_file() and f.relative_to(out).as_posix().lower().startswith("ex/data/")]
    return {os.fsencode(f.relative_to(out).as_posix()):
            f.read_bytes() if done.returncode == 0 or f.stat().st_size else None for f in found}


def _sevenzip_record(path: Path, out: Path) -> Read:
    reads = _sevenzip(path, out)
    assert len(reads) <= 1, reads
    return next((Read(name, data) if data is not None else Read(None, None)
                 for name, data in reads.items()), Read(None, None))


@pytest.fixture(scope="session")
def java_reader(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    if shutil.which("javac") is None or shutil.which("java") is None:
        return None
    out = tmp_path_factory.mktemp("java")
    subprocess.run(["javac", "-d", str(out), str(JAVA_READER)], check=True, timeout=300)
    return out


def _java(classes: Path, paths: list[Path]) -> Iterator[list[Read]]:
    """ZipInputStream over each file (one JVM for all), with UTF-8 and with Cp437 names (the
    local UTF-8 flag decides): the record under ex/data/, if any, per pass."""
    done = subprocess.run(["java", "-cp", str(classes), "ZipStream", *map(str, paths)],
                          capture_output=True, text=True, timeout=300, check=True)
    passes = [p.split("FILE\n")[1:] for p in done.stdout.split("PASS ")[1:]]
    for blocks in zip(*passes, strict=True):
        yield [_java_record(block) for block in blocks]


def _java_record(block: str) -> Read:
    for line in block.splitlines():
        parts = line.split(" ")
        if parts[0] == "ENTRY" and len(parts) == 3:
            name = bytes.fromhex(parts[1])
            if name.startswith(b"ex/data/"):
                return Read(name, bytes.fromhex(parts[2]))
    return Read(None, None)


def _disagree(reads: list[Read]) -> bool:
    """Do two readers name the record differently, or read different bytes from it?"""
    names = {r.name for r in reads if r.name is not None}
    return len(names) > 1 or len({r.data for r in reads if r.data is not None}) > 1


# Every kind of difference, measured (the experiment behind core.zip.checks' split).
MATRIX: dict[str, tuple[Variant, Code | None]] = {
    "clean": (Variant(), None),
    "name, same length": (Variant(local_name=b"ex/data/9"), Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    "name, other length": (Variant(local_name=b"ex/data/00"), Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    # stored bytes that are also a deflate stream: a reader that believes the local method
    # inflates them into other bytes
    "method 8 in the local header only": (Variant(local_method=8, data=_deflated(b"other " * 9, 9)),
                                          Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    "method 0 locally, deflated centrally": (Variant(central_method=8, local_method=0),
                                              Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    "local sizes smaller": (Variant(local_sizes=(8, 8)), Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    "local sizes larger": (Variant(local_sizes=(70, 70)), Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    "UTF-8 flag centrally only, non-ASCII name": (
        Variant(name=NON_ASCII, local_flags=0), Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    "UTF-8 flag locally only, non-ASCII name": (
        Variant(name=NON_ASCII, central_flags=0, local_flags=0x0800), Code.ZIP_LOCAL_CENTRAL_MISMATCH),
    "local CRC": (Variant(local_crc=0xDEADBEEF), Code.ZIP_LOCAL_CENTRAL_COSMETIC),
    "descriptor bit locally, sizes kept": (Variant(local_flags=0x0808),
                                           Code.ZIP_LOCAL_CENTRAL_COSMETIC),
    "descriptor bit locally, sizes deferred": (
        Variant(local_flags=0x0808, local_sizes=(0, 0), descriptor=True),
        Code.ZIP_LOCAL_CENTRAL_COSMETIC),
    "descriptor bit locally, wrong sizes there": (
        Variant(local_flags=0x0808, local_sizes=(8, 8), descriptor=True),
        Code.ZIP_LOCAL_CENTRAL_COSMETIC),
    "descriptor bit centrally only": (Variant(central_flags=0x0808, local_flags=0x0800,
                                              descriptor=True), Code.ZIP_LOCAL_CENTRAL_COSMETIC),
    "UTF-8 flag locally only, ASCII name": (Variant(central_flags=0, local_flags=0x0800),
                                            Code.ZIP_LOCAL_CENTRAL_COSMETIC),
    "deflate option bit": (Variant(local_flags=0x0802), Code.ZIP_LOCAL_CENTRAL_COSMETIC),
    "encrypted bit locally only": (Variant(local_flags=0x0801), Code.ZIP_LOCAL_CENTRAL_COSMETIC),
    "strong-encryption bit locally only": (Variant(local_flags=0x0840),
                                           Code.ZIP_LOCAL_CENTRAL_COSMETIC),
    "masked-header bit locally only": (Variant(local_flags=0x2800), Code.ZIP_LOCAL_CENTRAL_COSMETIC),
}


def test_the_split_follows_what_torch_zipfile_unzip_and_java_read(
        tmp_path: Path, java_reader: Path | None) -> None:
    has_unzip = shutil.which("unzip") is not None
    if not has_unzip and java_reader is None:
        pytest.skip("neither Info-ZIP unzip nor a JDK is installed: only torch and zipfile read")
    paths: dict[str, Path] = {}
    for label, (variant, _) in MATRIX.items():
        paths[label] = tmp_path / f"{len(paths)}.zip"
        paths[label].write_bytes(variant.archive())
    java = dict(zip(paths, _java(java_reader, list(paths.values())), strict=True)) \
        if java_reader is not None else {}
    for label, (variant, expected) in MATRIX.items():
        blob = variant.archive()
        found = _verdict(blob) & {Code.ZIP_LOCAL_CENTRAL_MISMATCH, Code.ZIP_LOCAL_CENTRAL_COSMETIC}
        assert found == ({expected} if expected else set()), label
        reads = [_torch(paths[label], variant.name), _zipfile(blob)]
        reads += [_unzip(paths[label], variant.name)] if has_unzip else []
        reads += java.get(label, [])
        reads += [_sevenzip_record(paths[label], tmp_path / "7z")] if shutil.which("7z") else []
        assert reads[0].data == variant.data, label   # torch reads the central directory's bytes
        if expected is Code.ZIP_LOCAL_CENTRAL_MISMATCH and has_unzip and java_reader is not None:
            assert _disagree(reads), f"{label}: no two readers disagree: {reads}"
        elif expected is not Code.ZIP_LOCAL_CENTRAL_MISMATCH:
            assert not _disagree(reads), f"{label}: readers disagree: {reads}"


FLAG_BITS = (0x0001, 0x0002, 0x0004, 0x0008, 0x0040, 0x0800, 0x2000)


@st.composite
def variants(draw: st.DrawFn) -> Variant:
    name = draw(st.sampled_from([NAME, NON_ASCII]))
    # a non-ASCII name without the central UTF-8 flag is ZIP_BAD_NAME: readers already name
    # it differently, whatever the local header says
    central_flags = 0x0800 if name == NON_ASCII else draw(st.sampled_from([0, 0x0800]))
    flip = sum(draw(st.sets(st.sampled_from(FLAG_BITS), max_size=3)))
    sizes = draw(st.sampled_from([None, None, (0, 0), (8, 8), (len(DATA), len(DATA))]))
    return Variant(
        name=name, central_flags=central_flags, local_flags=central_flags ^ flip,
        local_name=draw(st.sampled_from([None, None, name[:-1] + b"9"])),
        central_method=draw(st.sampled_from([0, 8])),
        local_method=draw(st.sampled_from([None, None, 0, 8])), local_sizes=sizes,
        descriptor=draw(st.booleans()),
        local_crc=draw(st.sampled_from([None, None, 0, 0xDEADBEEF])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(variant=variants())
def test_a_note_never_hides_readers_that_disagree(tmp_path: Path, variant: Variant) -> None:
    """Whatever the local header says: unless the finding is ZIP_LOCAL_CENTRAL_MISMATCH,
    torch, zipfile and unzip read the same bytes under the same name (or refuse)."""
    blob = variant.archive()
    codes = _verdict(blob)
    if Code.ZIP_LOCAL_CENTRAL_MISMATCH in codes:
        return
    path = tmp_path / "v.zip"
    path.write_bytes(blob)
    reads = [_torch(path, variant.name), _zipfile(blob)]
    if shutil.which("unzip") is not None:
        reads.append(_unzip(path, variant.name))
    if shutil.which("7z") is not None:
        reads.append(_sevenzip_record(path, tmp_path / "7z"))
    assert not _disagree(reads), (variant, codes, reads)


def test_sevenzip_reads_torchs_bytes_or_refuses_unless_the_split_says_mismatch(tmp_path: Path) -> None:
    """7-Zip checks each local header against its central entry: measured (7-Zip 26.02), it
    refuses (exit 2, "Headers Error", an empty file) on a differing name, method, sizes, CRC or
    most flag bits, and reads the central directory's bytes where it goes on (data-descriptor
    bit, the UTF-8 flag). So it never reads other bytes where the split says cosmetic; which
    cases it refuses may change between versions, so only that is asserted."""
    if shutil.which("7z") is None:
        missing("7-Zip (7z, Debian package p7zip-full) is not installed")
    for label, (variant, expected) in MATRIX.items():
        path = tmp_path / f"{label}.zip"
        path.write_bytes(variant.archive())
        seven = _sevenzip_record(path, tmp_path / "7z")
        if expected is None:
            assert seven == Read(variant.name, variant.data), label
        if expected is not Code.ZIP_LOCAL_CENTRAL_MISMATCH:
            assert not _disagree([_torch(path, variant.name), seven]), (label, seven)


# --- duplicate names ------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(copies=st.lists(st.tuples(st.sampled_from([b"A" * 40, b"A" * 39 + b"B", b""]),
                                 st.sampled_from([0, 8]), st.sampled_from([1, 9]),
                                 st.sampled_from([b"ex/data/0", b"ex/DATA/0"])),
                       min_size=2, max_size=4))
def test_duplicates_are_a_note_only_when_every_reader_reads_the_same_bytes(
        tmp_path: Path, copies: list[tuple[bytes, int, int, bytes]]) -> None:
    """Entries of one name (exact or case-folded): ZIP_DUPLICATE_IDENTICAL iff they use one
    method and hold the same bytes; then torch's pick and zipfile's read the same bytes."""
    members = [Member("ex/data.pkl", b"\x80\x02N."), Member("ex/version", b"3\n")]
    members += [Member(name, data, method=method,
                       payload=_deflated(data, level) if method == 8 else None)
                for data, method, level, name in copies]
    blob = build_zip(members)
    codes = _verdict(blob)
    same = len({(data, method) for data, method, _, _ in copies}) == 1
    assert (Code.ZIP_DUPLICATE_NAME in codes) is not same, (copies, codes)
    assert Code.ZIP_DUPLICATE_IDENTICAL in codes or not same, (copies, codes)
    path = tmp_path / "d.zip"
    path.write_bytes(blob)
    reader = torch._C.PyTorchFileReader(str(path))
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        for name in {name for _, _, _, name in copies}:
            if same:
                assert bytes(reader.get_record(name.decode()[3:])) == z.read(name.decode())
    if same and shutil.which("7z") is not None:   # 7-Zip's first and last pick
        torch_reads = {name: bytes(reader.get_record(name.decode()[3:]))
                       for _, _, _, name in copies}
        for keep in ("-aos", "-aoa"):
            assert _sevenzip(path, tmp_path / "7z", keep=keep) == torch_reads, (keep, copies)


def test_sevenzip_picks_the_first_or_the_last_of_a_duplicate_name(tmp_path: Path) -> None:
    """`7z x` writes every entry of a name to one file: with -aoa the last one stays, with
    -aos the first. Two copies with other bytes: the pick depends on a flag, so the split's
    ZIP_DUPLICATE_NAME (unsafe) is right; identical copies read the same either way."""
    if shutil.which("7z") is None:
        missing("7-Zip (7z, Debian package p7zip-full) is not installed")
    for first, last in ((b"A" * 40, b"B" * 40), (b"A" * 40, b"A" * 40)):
        blob = build_zip([Member("ex/data.pkl", b"\x80\x02N."), Member("ex/data/0", first),
                          Member("ex/data/0", last)])
        path = tmp_path / "d.zip"
        path.write_bytes(blob)
        picks = {keep: _sevenzip(path, tmp_path / "7z", keep=keep)[NAME] for keep in ("-aos", "-aoa")}
        assert picks == {"-aos": first, "-aoa": last}
        assert (Code.ZIP_DUPLICATE_NAME in _verdict(blob)) is (first != last)


def test_duplicates_past_the_comparison_budget_stay_evidence() -> None:
    """Not compared is not proven identical: past Limits.max_duplicate_bytes the duplicates of
    a name stay ZIP_DUPLICATE_NAME, and the message says why."""
    from ckptguard.core.limits import DEFAULT_LIMITS
    from ckptguard.core.records import replace
    from ckptguard.core.state import ScanOptions

    blob = build_zip([Member("ex/data.pkl", b"\x80\x02N."), Member("ex/data/0", DATA),
                      Member("ex/data/0", DATA)])
    assert _verdict(blob) >= {Code.ZIP_DUPLICATE_IDENTICAL}
    src = BytesSource(blob)
    directory = read_directory(src)
    an = Analysis(options=ScanOptions(limits=replace(DEFAULT_LIMITS, max_duplicate_bytes=len(DATA))))
    check_archive(directory, read_local_headers(src, directory.entries), an, source=src)
    [f] = [f for f in an.findings if f.code is Code.ZIP_DUPLICATE_NAME]
    assert "not compared" in f.message and "max_duplicate_bytes" in f.message


@pytest.mark.parametrize("same", [True, False])
def test_a_checkpoint_with_a_record_written_twice(tmp_path: Path, same: bool) -> None:
    """`zipfile.ZipFile(ckpt, "a").writestr(name, ...)` for a record already there (a repack
    that rewrites one storage): torch.load loads the file; the scan calls it unsafe only when
    the second copy holds other bytes."""
    import warnings

    from ckptguard.core.scan import scan_path

    path = tmp_path / "twice.pt"
    torch.save({"w": torch.ones(4)}, path)
    with zipfile.ZipFile(path) as z:
        [name] = [n for n in z.namelist() if n.endswith("/data/0")]
        data = z.read(name)
    with warnings.catch_warnings(), zipfile.ZipFile(path, "a") as z:
        warnings.simplefilter("ignore")          # zipfile: "Duplicate name"
        z.writestr(name, data if same else bytes(len(data)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert torch.load(path, weights_only=True)["w"].shape == (4,)
    report = scan_path(path)
    codes = {f.code for f in report.findings}
    assert (Code.ZIP_DUPLICATE_NAME in codes) is not same
    assert (Code.ZIP_DUPLICATE_IDENTICAL in codes) is same
    assert (report.verdict == "unsafe") is not same, report.verdict
