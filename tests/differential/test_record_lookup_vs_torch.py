"""How torch finds a zip's records, vs the scan: miniz looks names up case-insensitively, so
`VERSION`, `.DATA/VERSION`, `BYTEORDER` and `.STORAGE_ALIGNMENT` are the records torch reads
(and a `BYTEORDER` of `big` byte-swaps every storage). Each case is answered by torch.load in
a fresh process (tests/core/torch_rules/oracle.py); the tensors' values by `torch.load` here
and by `ckptguard get`'s reader (core.loader).

Also the oracle's own normalisation (tests/differential/torch_answer.py) on the three shapes
of torch's weights-only message: after its marker, after a blank line, and on the first line
("... must be imported to load DTensors")."""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from pathlib import Path

import pytest

from ckptguard.core.loader import open_checkpoint
from ckptguard.core.scan import scan_path
from tests.core.torch_rules.oracle import run_oracle, write_zip
from tests.differential.torch_answer import torch_first_line

pytestmark = pytest.mark.torch


def _saved() -> list[tuple[str, bytes]]:
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({"a": torch.arange(4.0), "b": torch.arange(1, 5, dtype=torch.int16)}, buf)
    with zipfile.ZipFile(buf) as zf:
        return [(i.filename, zf.read(i)) for i in zf.infolist()]


def _renamed(entries: list[tuple[str, bytes]], old: str, new: str, data: bytes | None = None
             ) -> list[tuple[str, bytes]]:
    prefix = entries[0][0].split("/")[0]
    return [(f"{prefix}/{new}", body if data is None else data) if name == f"{prefix}/{old}"
            else (name, body) for name, body in entries]


def _added(entries: list[tuple[str, bytes]], rel: str, data: bytes, *, first: bool = False
           ) -> list[tuple[str, bytes]]:
    prefix = entries[0][0].split("/")[0]
    return [(f"{prefix}/{rel}", data), *entries] if first else [*entries, (f"{prefix}/{rel}", data)]


def _prefixed(entries: list[tuple[str, bytes]], prefix: str) -> list[tuple[str, bytes]]:
    return [(prefix + name[name.index("/"):], body) for name, body in entries]


def _without_utf8_flag(data: bytes) -> bytes:
    """The archive with general-purpose bit 11 cleared everywhere: names stay UTF-8 bytes,
    which zip readers then decode as cp437 (torch compares the bytes)."""
    out = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        infos = zf.infolist()
        for info in infos:
            struct.pack_into("<H", out, info.header_offset + 6, info.flag_bits & ~0x800)
    eocd = data.rindex(b"PK\x05\x06")
    pos = struct.unpack_from("<I", data, eocd + 16)[0]
    for info in infos:
        struct.pack_into("<H", out, pos + 8, info.flag_bits & ~0x800)
        nlen, xlen, clen = struct.unpack_from("<HHH", data, pos + 28)
        pos += 46 + nlen + xlen + clen
    return bytes(out)


NO_UTF8_FLAG = {"é/ without the UTF-8 flag", "ü☃/ without the UTF-8 flag"}
CASES = {
    "VERSION": lambda e: _renamed(e, "version", "VERSION"),
    "BYTEORDER big": lambda e: _renamed(e, "byteorder", "BYTEORDER", b"big"),
    "ByteOrder big before byteorder": lambda e: _added(e, "ByteOrder", b"big", first=True),
    ".DATA/VERSION 99": lambda e: _added(e, ".DATA/VERSION", b"99"),
    ".STORAGE_ALIGNMENT x": lambda e: _renamed(e, ".storage_alignment", ".STORAGE_ALIGNMENT", b"x"),
    "Data/0 for data/0": lambda e: _renamed(e, "data/0", "Data/0"),
    # the prefix is bytes to torch: a name that is not ASCII, with or without the flag
    "é/ with the UTF-8 flag": lambda e: _prefixed(e, "é"),
    "é/ without the UTF-8 flag": lambda e: _prefixed(e, "é"),
    "ü☃/ with the UTF-8 flag": lambda e: _prefixed(e, "ü☃"),
    "ü☃/ without the UTF-8 flag": lambda e: _prefixed(e, "ü☃"),
}


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, object]]]:
    tmp = tmp_path_factory.mktemp("lookup")
    entries = _saved()
    paths = {}
    for n, (name, edit) in enumerate(CASES.items()):
        path = tmp / f"case{n}.pt"
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
            for member, body in edit(entries):
                zf.writestr(member, body)
        path.write_bytes(_without_utf8_flag(buf.getvalue()) if name in NO_UTF8_FLAG else buf.getvalue())
        paths[name] = path
    results = run_oracle([{"path": str(p), "mode": "load"} for p in paths.values()], tmp)
    return {name: (paths[name], res) for name, res in zip(paths, results, strict=True)}


@pytest.mark.parametrize("name", list(CASES))
def test_records_are_found_as_torch_finds_them(answers: dict[str, tuple[Path, dict[str, object]]],
                                               name: str) -> None:
    torch = pytest.importorskip("torch")
    path, want = answers[name]
    report = scan_path(path)
    wo = report.weights_only
    assert wo.loadable == want["ok"], (name, wo.error_type, wo.error, want)
    if not want["ok"]:
        assert wo.error_type == want["type"], (name, wo.error, want)
        assert report.verdict != "safe"
        return
    loaded = torch.load(path, weights_only=True)
    with open_checkpoint(str(path)) as ck:
        for key, tensor in loaded.items():
            assert ck.read_tensor(key).tolist() == tensor.tolist(), (name, key)
    # every record torch reads is referenced, in whatever case it is spelled
    assert "TORCH_UNREFERENCED_RECORD" not in {f.code.value for f in report.findings}, name


def test_the_oracle_keeps_the_unpicklers_line_in_each_message_shape(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pickles = {   # PROTO 2, GLOBAL, STOP
        "unsafe global": b"\x80\x02cos\nsystem\n.",                 # after 'WeightsUnpickler error: '
        "blocked module": b"\x80\x02csubprocess\nrun\n.",           # after a blank line
        "DTensor": b"\x80\x02ctorch.distributed.tensor\nDTensor\n.",  # on the first line
    }
    paths = {name: write_zip(tmp_path / f"{n}.pt", pkl) for n, (name, pkl) in enumerate(pickles.items())}
    results = run_oracle([{"path": str(p), "mode": "load"} for p in paths.values()], tmp_path)
    for (name, path), res in zip(paths.items(), results, strict=True):
        assert not res["ok"] and res["type"] == "UnpicklingError", (name, res)
        wo = scan_path(path).weights_only
        assert torch_first_line(pickle.UnpicklingError(res["msg"])) == wo.error, (name, res["msg"])


def _version_texts() -> list[bytes]:
    """The version record as std::stoull reads it: spaces, a sign, digits around every bound
    (1 and 10, 2**63 where the int64 cast wraps, 2**64 where stoull throws), trailing text."""
    import random

    rng = random.Random(7)
    bounds = [0, 1, 3, 10, 11, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 3, 10**30]
    texts = [b"", b" ", b"-", b"+", b"abc", b"3abc", b"0x3", b"\x0b3", b"3 4", b"\xff"]
    for number in bounds:
        texts += [sign + str(number).encode() for sign in (b"", b"+", b"-")]
        if 0 < number < 2**64:   # a minus wraps modulo 2**64: "-(2**64 - n)" is n
            texts.append(b"-" + str(2**64 - number).encode())
    for _ in range(40):
        number = rng.choice([rng.randrange(12), rng.choice(bounds) + rng.randrange(-2, 3),
                             rng.randrange(2**66)])
        texts.append(rng.choice([b"", b" ", b"\t\n", b"\r\x0c"]) + rng.choice([b"", b"+", b"-"])
                     + str(abs(number)).encode() + rng.choice([b"", b"\n", b" junk", b".5"]))
    return list(dict.fromkeys(texts))


def test_the_version_record_is_parsed_as_torch_parses_it(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({"a": torch.ones(2)}, buf)
    with zipfile.ZipFile(buf) as zf:
        entries = [(i.filename, zf.read(i)) for i in zf.infolist()]
    texts = _version_texts()
    paths = []
    for n, text in enumerate(texts):
        path = tmp_path / f"v{n}.pt"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
            for member, body in _renamed(entries, "version", "version", text):
                zf.writestr(member, body)
        paths.append(path)
    results = run_oracle([{"path": str(p), "mode": "load"} for p in paths], tmp_path)
    for text, path, want in zip(texts, paths, results, strict=True):
        wo = scan_path(path).weights_only
        got = (wo.loadable, wo.error_type, wo.error)
        expected = (want["ok"], want.get("type"),
                    None if want["ok"] else str(want["msg"]).split("\n", 1)[0])
        assert got == expected, (text, got, want)
