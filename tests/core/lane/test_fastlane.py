"""The fast lane takes exactly the clean torch-layout archives and otherwise declines, and
whichever path runs, the report is the general path's (tests/differential holds the same
check over the torch-written corpus)."""

from __future__ import annotations

import gc
import io
import struct
import zipfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Decline
from ckptguard.core.io.source import BytesSource, FileSource
from ckptguard.core.lane import torch_zip as fastlane
from ckptguard.core.limits import Limits
from ckptguard.core.pickle.fast import tokenize as pickletoken
from ckptguard.core.pickle.fast.column_stubs import RebuildCall
from ckptguard.core.scan import scan_path, scan_source
from ckptguard.core.state import Analysis, ScanOptions
from ckptguard.core.zip import columns
from ckptguard.core.zip.columns import REMOTE_LOCALS
from tests.agreement import assert_agree, reports
from tests.agreement import comparable as comparable_report
from tests.builders.pickle_asm import asm
from tests.builders.torchlayout import META, state_dict, torch_layout, v2

F8 = b"\x00" * 8          # the bytes of a 2-element float32 storage


def comparable(path: Path) -> dict[str, Any]:
    out = scan_path(path).to_json()
    out.pop("timings_ms")
    out.pop("io")
    return out


def both_paths(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The lane's report and the general path's (tests/agreement)."""
    got = reports(path, ("auto", "general"))
    return got["auto"], got["general"]


def lane_takes(data: bytes) -> bool:
    return fastlane.try_torch_zip(BytesSource(data), Analysis())


def _plain() -> bytes:
    return torch_layout("ex", state_dict(("a", v2("0")), ("b", v2("1"))), [("0", F8), ("1", F8)])


def _nested() -> bytes:
    pkl = asm(("PROTO", 2), "EMPTY_DICT", "MARK",
              ("BINUNICODE", "m"), "EMPTY_DICT", ("BINUNICODE", "w"), *v2("0"), "SETITEM",
              ("BINUNICODE", "l"), "EMPTY_LIST", *v2("1"), "APPEND",
              ("BINUNICODE", "step"), ("BININT1", 7), "SETITEMS", "STOP")
    return torch_layout("ex", pkl, [("0", F8), ("1", F8)])


def _parameter() -> bytes:
    pkl = state_dict(("p", [("GLOBAL", "torch._utils", "_rebuild_parameter"), "MARK", *v2("0"),
                            "NEWTRUE", ("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE",
                            "REDUCE", "TUPLE", "REDUCE"]))
    return torch_layout("ex", pkl, [("0", F8)])


def _tied_views() -> bytes:
    pkl = state_dict(("a", v2("0", numel=4)), ("b", v2("0", numel=4, offset=2, size=(2,))),
                     ("t", v2("0", numel=4, size=(2, 2), stride=(1, 2))))
    return torch_layout("ex", pkl, [("0", b"\x00" * 16)])


def _ordereddict_attribute() -> bytes:
    """A module state_dict: OrderedDict items, then BUILD sets attributes (here a tensor)."""
    pkl = asm(("PROTO", 2), ("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE",
              "MARK", ("BINUNICODE", "w"), *v2("0"), "SETITEMS",
              "EMPTY_DICT", ("BINUNICODE", "_extra"), *v2("1"), "SETITEM", "BUILD", "STOP")
    return torch_layout("ex", pkl, [("0", F8), ("1", F8)])


def _module_state_dict() -> bytes:
    """What torch.save(module.state_dict()) writes: the items, then BUILD sets `_metadata`
    (an OrderedDict of {'version': n} dicts). Here the state also holds the root itself
    (walked once) and a tensor (a child, named after the items)."""
    od = [("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE"]
    pkl = asm(("PROTO", 2), *od, ("BINPUT", 0), "MARK", ("BINUNICODE", "w"), *v2("0"), "SETITEMS",
              "EMPTY_DICT", "MARK",
              ("BINUNICODE", "_metadata"), *od, ("BINUNICODE", ""), "EMPTY_DICT",
              ("BINUNICODE", "version"), ("BININT1", 1), "SETITEM", "SETITEM",
              ("BINUNICODE", "root"), ("BINGET", 0),
              ("BINUNICODE", "_extra"), *v2("1"), "SETITEMS", "BUILD", "STOP")
    return torch_layout("ex", pkl, [("0", F8), ("1", F8)])


def _binstring_key() -> bytes:
    """A key written as SHORT_BINSTRING (utf-8 bytes): named by its decoded text."""
    pkl = asm(("PROTO", 2), "EMPTY_DICT", ("SHORT_BINSTRING", "größe".encode()), *v2("0"),
              "SETITEM", "STOP")
    return torch_layout("ex", pkl, [("0", F8)])


def _touching_headers() -> bytes:
    """An empty serialization id written as zipfile writes it (no extra field, no data
    descriptor) before the metadata records: its local header and name end where the next
    local header starts, so the lane reads the two in one read and cuts it."""
    return torch_layout("ex", state_dict(("a", v2("0")), ("b", v2("1"))), [("0", F8), ("1", F8)],
                        meta=[(".data/serialization_id", b""), *META],
                        bare=frozenset({".data/serialization_id"}))


def _central_order(order: str) -> bytes:
    """_plain() with its central records reversed or rotated: the central order is not the
    file order, which the lane's columns sort by."""
    data = _plain()
    z64 = data.rfind(b"PK\x06\x06")
    cd_size, cd_offset = struct.unpack_from("<QQ", data, z64 + 40)
    records = [b"PK\x01\x02" + r for r in data[cd_offset:cd_offset + cd_size].split(b"PK\x01\x02")[1:]]
    records = records[::-1] if order == "reversed" else records[1:] + records[:1]
    return data[:cd_offset] + b"".join(records) + data[cd_offset + cd_size:]


TAKEN = {"binstring-key": _binstring_key, "plain": _plain, "nested": _nested,
         "parameter": _parameter, "tied-views": _tied_views,
         "ordereddict-attribute": _ordereddict_attribute, "module-state-dict": _module_state_dict,
         "touching-local-headers": _touching_headers,
         "central-order-reversed": lambda: _central_order("reversed"),
         "central-order-rotated": lambda: _central_order("rotated")}


def _declined() -> dict[str, bytes]:
    one = [("0", F8)]
    two = [("0", F8), ("1", F8)]
    return {
        # a tensor whose key is set again: torch still ran (and checked) its rebuild call
        "dup-key-drops-a-tensor": torch_layout("ex", state_dict(("a", v2("0")), ("a", v2("1"))), two),
        "call-left-on-the-stack": torch_layout("ex", asm(
            ("PROTO", 2), *v2("1"), "EMPTY_DICT", "MARK", ("BINUNICODE", "a"), *v2("0"),
            "SETITEMS", "STOP"), two),
        "view-past-storage": torch_layout("ex", state_dict(("a", v2("0", size=(3,)))), one),
        "grad-on-int": torch_layout("ex", state_dict(
            ("a", v2("0", numel=1, storage="LongStorage", requires_grad=True))), one),
        # one key spelling two record names: the joined-names comparison must not match it
        "storage-key-with-newline": torch_layout("ex", state_dict(("a", v2("0\nex/data/1"))), two),
        "first-storage-not-0": torch_layout("ex", state_dict(("a", v2("1"))), [("1", F8)]),
        "record-size-mismatch": torch_layout("ex", state_dict(("a", v2("0"))), [("0", b"\x00" * 12)]),
        "unreferenced-record": torch_layout("ex", state_dict(("a", v2("0"))), [*one, ("9", F8)]),
        "ordereddict-with-args": torch_layout("ex", asm(
            ("PROTO", 2), ("GLOBAL", "collections", "OrderedDict"), "EMPTY_LIST", "TUPLE1",
            "REDUCE", ("BINUNICODE", "a"), *v2("0"), "SETITEM", "STOP"), one),
        "build-on-a-tensor": torch_layout("ex", state_dict(("a", [*v2("0"), "EMPTY_DICT", "BUILD"])), one),
        "newobj": torch_layout("ex", asm(
            ("PROTO", 2), ("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "NEWOBJ",
            ("BINUNICODE", "a"), *v2("0"), "SETITEM", "STOP"), one),
        "pop-opcode": torch_layout("ex", state_dict(("a", v2("0")), extra=[("BININT1", 1), "POP"]), one),
        "bare-storage": torch_layout("ex", asm(
            ("PROTO", 2), "EMPTY_DICT", ("BINUNICODE", "s"), "MARK", ("BINUNICODE", "storage"),
            ("GLOBAL", "torch", "FloatStorage"), ("BINUNICODE", "0"), ("BINUNICODE", "cpu"),
            ("BININT1", 2), "TUPLE", "BINPERSID", "SETITEM", "STOP"), one),
        "tensor-as-key": torch_layout("ex", asm(
            ("PROTO", 2), "EMPTY_DICT", *v2("0"), ("BININT1", 1), "SETITEM", "STOP"), one),
        "conj-bit": torch_layout("ex", state_dict(("a", [
            *v2("0")[:-2], "EMPTY_DICT", ("BINUNICODE", "conj"), "NEWTRUE", "SETITEM",
            "TUPLE", "REDUCE"])), one),
        "storage-on-xla": torch_layout("ex", state_dict(("a", [
            *(("BINUNICODE", "xla:0") if o == ("BINUNICODE", "cpu") else o for o in v2("0"))])), one),
        "big-endian": torch_layout("ex", state_dict(("a", v2("0"))), one,
                                   meta=[*META[:3], ("byteorder", b"big")]),
        "bytes-appended": _plain() + b"junk",
        "names-equal-when-lower-cased": torch_layout("ex", state_dict(("a", v2("0"))), one,
                                                     meta=[*META, ("VERSION", b"3\n")]),
        # torch finds "VERSION" (miniz folds case), the general path calls it unreferenced
        "meta-name-in-upper-case": torch_layout("ex", state_dict(("a", v2("0"))), one,
                                                meta=[("VERSION", b"3\n"), *META[1:]]),
        "storage-name-in-upper-case": torch_layout("ex", state_dict(("a", v2("0"))), [],
                                                   meta=[*META, ("DATA/0", F8)]),
        # numel x 4 wraps to 8 in int64 arithmetic: torch sees a size mismatch
        "numel-that-wraps": torch_layout("ex", state_dict(("a", v2("0", numel=(1 << 62) + 2))), one),
        "offset-that-wraps": torch_layout("ex", state_dict(("a", v2("0", offset=(1 << 63) - 1))), one),
        # SHORT_BINSTRING: torch decodes it as utf-8 (torch.load's encoding): invalid -> refused
        "key-not-utf8": torch_layout("ex", asm(
            ("PROTO", 2), "EMPTY_DICT", ("SHORT_BINSTRING", b"\xff"), *v2("0"), "SETITEM", "STOP"), one),
        "misaligned-data": torch_layout("ex", state_dict(("a", v2("0")), ("b", v2("1"))), two,
                                        alignment=16),
    }


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_lane_takes_clean_archives_with_the_general_report(
        case: str, tmp_path: Path) -> None:
    data = TAKEN[case]()
    path = tmp_path / "x.pt"
    path.write_bytes(data)
    assert lane_takes(data)
    fast, slow = both_paths(path)
    assert fast == slow
    assert fast["verdict"] == "safe" and fast["tensors"]
    if case in ("ordereddict-attribute", "module-state-dict"):   # BUILD's attributes are
        assert [t["name"] for t in fast["tensors"]] == ["w", "_extra"]  # children too


@pytest.mark.parametrize("cap", [None, 1])
def test_touching_local_headers_share_a_read_up_to_the_cap(
        cap: int | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Touching local headers share a read up to COALESCE_MAX (+ one header); past it the run
    is split. Either way each header is found in its read, and the lane takes the file."""
    path = tmp_path / "x.pt"
    path.write_bytes(_touching_headers())
    if cap is not None:
        monkeypatch.setattr(columns, "COALESCE_MAX", cap)
    source = FileSource(path)
    reads: list[list[tuple[int, int]]] = []
    read_many = source.read_many
    monkeypatch.setattr(source, "read_many", lambda spans: reads.append(list(spans)) or read_many(spans))
    assert fastlane.try_torch_zip(source, Analysis())
    entries = 8   # data.pkl, 2 storages, the serialization id, 4 metadata records
    assert len(reads[0]) == (entries - 1 if cap is None else entries)   # the local headers
    fast, slow = both_paths(path)
    assert fast == slow


@pytest.mark.parametrize("n", [999, 1000, 2000, 2001])
@pytest.mark.parametrize("container", ["dict", "list"])
def test_lane_takes_torch_saves_of_every_batch_count(
        n: int, container: str, tmp_path: Path) -> None:
    """pickle writes items in batches of 1000 (MARK ... SETITEMS/APPENDS), and an exact
    multiple of 1000 ends with an empty batch: the lane must still take the file."""
    torch = pytest.importorskip("torch")
    tensors = [torch.full((2,), float(i)) for i in range(n)]
    obj: Any = {f"t{i}": t for i, t in enumerate(tensors)} if container == "dict" else tensors
    path = tmp_path / "x.pt"
    torch.save(obj, path)
    assert lane_takes(path.read_bytes())
    fast, slow = both_paths(path)
    assert fast == slow and len(fast["tensors"]) == n


@pytest.mark.parametrize("case", ["nested", "module-state-dict", "tied-views"])
@pytest.mark.parametrize("spare", [-1, 0])
def test_the_lane_keeps_the_cap_on_manifest_items(case: str, spare: int) -> None:
    """Limits.max_manifest_dims counts the path, shape and stride items of every tensor
    entry (core.manifest.build): past it the report is the general path's capped one."""
    data = {"nested": _nested, "module-state-dict": _module_state_dict,
            "tied-views": _tied_views}[case]()
    rows = scan_source(BytesSource(data), options=ScanOptions(engine="general")).tensors
    cap = sum(len(t.path) + len(t.shape) + len(t.stride) for t in rows) + spare
    limits = Limits(max_manifest_dims=cap)
    report = assert_agree(data, label=f"{case} cap {cap}", limits=limits)
    assert fastlane.try_torch_zip(BytesSource(data), Analysis(ScanOptions(limits=limits))) \
        is (spare >= 0)
    assert (report["verdict"] == "safe") is (spare >= 0)


@pytest.mark.parametrize("case", sorted(_declined()))
def test_lane_declines_anything_else(case: str, tmp_path: Path) -> None:
    data = _declined()[case]
    path = tmp_path / "x.pt"
    path.write_bytes(data)
    assert not lane_takes(data)
    fast, slow = both_paths(path)
    assert fast == slow


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_lane_equals_the_exact_interpreters(case: str, tmp_path: Path) -> None:
    """Not only the general path's C-speed fast path: the exact emulation agrees too."""
    path = tmp_path / "x.pt"
    path.write_bytes(TAKEN[case]())
    assert_agree(path, ("auto", "exact"), label=case)


def test_the_lane_takes_a_plain_torch_save_on_this_python(tmp_path: Path) -> None:
    """Not skipped on any Python: the C-speed paths run on CPython 3.11.0-3.11.4 too (the walk
    uses no possessive repeat or atomic group, whose 3.11.0-3.11.4 `re` gets wrong)."""
    import torch

    path = tmp_path / "x.pt"
    torch.save({f"layer.{i}.weight": torch.zeros(2, 3) for i in range(50)}, path)
    assert lane_takes(path.read_bytes())
    assert pickletoken.tokenize(_nested_pickle(), lambda name: True).end > 0


def _nested_pickle() -> bytes:
    import pickle
    return pickle.dumps({"a": [1, 2, (3, 4)], "b": "x" * 300}, protocol=2)


def test_a_global_the_walk_did_not_see_is_declined() -> None:
    """The C unpickler's GLOBALs must be the walk's, in order (a second line of defence)."""
    data = asm(("PROTO", 2), ("GLOBAL", "collections", "OrderedDict"), "STOP")

    class Probe(pickletoken.StubUnpickler):
        def make_stub(self, module: str, name: str) -> object:
            return (module, name)

    seen = pickletoken.Tokens(globals=[("collections", "OrderedDict", "collections",
                                        "OrderedDict", 2)], end=len(data))
    assert Probe(data, seen).load_or_decline() == ("collections", "OrderedDict")
    unseen = pickletoken.Tokens(end=len(data))   # as if the walk had skipped the GLOBAL
    with pytest.raises(Decline, match="not seen by the opcode walk"):
        Probe(data, unseen).load_or_decline()


def test_declining_leaves_the_analysis_untouched() -> None:
    an = Analysis()
    assert not fastlane.try_torch_zip(BytesSource(_declined()["view-past-storage"]), an)
    assert an == Analysis()


def test_nothing_of_the_value_graph_outlives_the_scan(tmp_path: Path) -> None:
    """No reference cycle keeps the stubs alive: they are freed without the cyclic GC."""
    path = tmp_path / "x.pt"
    path.write_bytes(_plain())
    was = gc.isenabled()
    gc.disable()
    try:
        report = scan_path(path)
        alive = [o for o in gc.get_objects() if isinstance(o, RebuildCall)]
    finally:
        if was:
            gc.enable()
    assert len(report.tensors) == 2 and alive == []


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_archives_get_the_general_report(data: st.DataObject, tmp_path_factory: Any) -> None:
    base = bytearray(_nested() if data.draw(st.booleans()) else _tied_views())
    # half the time only data.pkl changes (it starts at 64): the archive stays clean, so
    # the lane's pickle checks, not its archive checks, decide
    pickle_only = data.draw(st.booleans())
    low, high = 0, len(base)
    if pickle_only:
        low, high = 64, base.find(b"PK\x07\x08")
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(low, high - 1))
        base[at] = data.draw(st.integers(0, 255))
    if not pickle_only and data.draw(st.booleans()):
        base = base[:data.draw(st.integers(0, len(base)))]
    path = tmp_path_factory.mktemp("m") / "x.pt"
    path.write_bytes(bytes(base))
    fast, slow = both_paths(path)
    assert fast == slow
    event(f"lane took it: {lane_takes(bytes(base))}")


# Generated state_dicts around the lane's value checks: sizes, strides, offsets and numels
# at and past the bounds (and past int64), storage types, grads, key encodings, duplicate
# keys, nesting. Whatever the lane decides, the report must be the general path's.
_STORAGES = {"FloatStorage": 4, "LongStorage": 8, "HalfStorage": 2, "BoolStorage": 1,
             "ComplexDoubleStorage": 16}
_BIG = st.sampled_from([0, 1, 2, 3, 7, (1 << 28) - 1, 1 << 28, (1 << 31) - 1, 1 << 32,
                        (1 << 62) + 2, (1 << 63) - 1, 1 << 64])


def _small_or_big(draw: st.DrawFn, small: int) -> int:
    return draw(_BIG) if draw(st.integers(0, 7)) == 0 else draw(st.integers(0, small))


@st.composite
def _tensor_ops(draw: st.DrawFn, key: str) -> tuple[list[object], bytes]:
    storage = draw(st.sampled_from(sorted(_STORAGES)))
    numel = _small_or_big(draw, 8)
    dims = draw(st.integers(0, 3))
    size = tuple(_small_or_big(draw, 3) for _ in range(dims))
    stride = tuple(_small_or_big(draw, 2) for _ in range(dims))
    ops = v2(key, numel=numel, offset=_small_or_big(draw, 2), size=size, stride=stride,
             requires_grad=draw(st.integers(0, 3)) == 0, storage=storage)
    nbytes = numel * _STORAGES[storage]
    if nbytes > 256 or draw(st.integers(0, 9)) == 0:   # a record of the wrong size
        nbytes = draw(st.integers(0, 16))
    return ops, b"\0" * nbytes


def _wrapped(draw: st.DrawFn, ops: list[object]) -> list[object]:
    """The tensor as is, as a Parameter, or inside a list / tuple."""
    how = draw(st.integers(0, 5))
    if how == 0:
        return [("GLOBAL", "torch._utils", "_rebuild_parameter"), "MARK", *ops,
                "NEWTRUE" if draw(st.booleans()) else "NEWFALSE",
                ("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE", "TUPLE", "REDUCE"]
    if how == 1:
        return ["EMPTY_LIST", *ops, "APPEND"]
    if how == 2:
        return ["MARK", ("BININT1", 7), *ops, "TUPLE"]
    return ops


@st.composite
def _state_dicts(draw: st.DrawFn) -> bytes:
    count = draw(st.integers(1, 4))
    ordered = draw(st.booleans())   # a module state_dict: OrderedDict root (+ BUILD)
    root: list[object] = ([("GLOBAL", "collections", "OrderedDict"), "EMPTY_TUPLE", "REDUCE"]
                          if ordered else ["EMPTY_DICT"])
    body: list[object] = [("PROTO", 2), *root, "MARK"]
    records = []
    for i in range(count):
        ops, data = draw(_tensor_ops(str(i)))
        ops = _wrapped(draw, ops)
        name = f"w{i}" if draw(st.integers(0, 5)) else draw(st.sampled_from(["w0", "größe"]))
        key: list[object] = [("SHORT_BINSTRING", name.encode()) if draw(st.booleans())
                             else ("BINUNICODE", name)]
        if draw(st.integers(0, 9)) == 0:   # a tuple key: the C-speed paths leave it alone
            key = [("BININT1", i), ("BINUNICODE", name), "TUPLE2"]
        if draw(st.integers(0, 4)) == 0:   # nested one level down
            body += [*key, "EMPTY_DICT", ("BINUNICODE", "inner"), *ops, "SETITEM"]
        else:
            body += [*key, *ops]
        records.append((str(i), data))
    body.append("SETITEMS")
    if ordered and draw(st.booleans()):
        body += ["EMPTY_DICT", ("BINUNICODE", "_metadata"), "EMPTY_DICT", "SETITEM", "BUILD"]
    return torch_layout("ex", asm(*body, "STOP"), records)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_state_dicts())
def test_generated_state_dicts_get_the_general_report(data: bytes, tmp_path_factory: Any) -> None:
    path = tmp_path_factory.mktemp("g") / "x.pt"
    path.write_bytes(data)
    fast, slow = both_paths(path)
    assert fast == slow
    event(f"lane took it: {lane_takes(data)}")


class _RemoteLike(BytesSource):
    """Bytes read as a remote source is: random reads are not cheap, so a scan reads only the
    local headers torch's offset chain needs (core.formats.torch_zip, core.zip.columns)."""

    random_access_cheap = False


def _remote_reports(data: bytes) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the lane's report, the general path's) of `data` read as a remote source, with the
    local-header counts (what was read differs in spans, not in what was judged)."""
    out = []
    for engine in ("auto", "general"):
        report = scan_source(_RemoteLike(data, name="x.pt"),
                             options=ScanOptions(engine=engine))  # type: ignore[arg-type]
        view = comparable_report(report)
        view["zip_io"] = {k: report.io.get(k) for k in ("zip_local_headers_read", "zip_entries")}
        out.append(view)
    return out[0], out[1]


@pytest.mark.parametrize("case", sorted(TAKEN))
def test_the_lane_takes_remote_archives_with_the_general_report(case: str) -> None:
    data = TAKEN[case]()
    assert fastlane.try_torch_zip(_RemoteLike(data), Analysis())
    fast, slow = _remote_reports(data)
    assert fast == slow
    # exactly the local headers of REMOTE_LOCALS's records are read, whatever the archive holds
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        wanted = sum(name.partition("/")[2] in REMOTE_LOCALS for name in archive.namelist())
    assert fast["verdict"] == "safe" and fast["zip_io"]["zip_local_headers_read"] == wanted


@pytest.mark.parametrize("case", sorted(_declined()))
def test_remote_archives_the_lane_declines_get_the_general_report(case: str) -> None:
    fast, slow = _remote_reports(_declined()[case])
    assert fast == slow


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_remote_archives_get_the_general_report(data: st.DataObject) -> None:
    """Mutations anywhere, the local headers a remote scan does not read included."""
    base = bytearray(_nested() if data.draw(st.booleans()) else _tied_views())
    for _ in range(data.draw(st.integers(1, 4))):
        base[data.draw(st.integers(0, len(base) - 1))] = data.draw(st.integers(0, 255))
    fast, slow = _remote_reports(bytes(base))
    assert fast == slow
    event(f"lane took it: {fastlane.try_torch_zip(_RemoteLike(bytes(base)), Analysis())}")


def test_a_remote_scan_reads_the_local_header_of_every_record_the_lane_reads() -> None:
    """The lane reads torch's metadata records at their data offsets; on a remote source only
    REMOTE_LOCALS have their local headers read, so every one of them must be listed there
    (a record added to the lane but not there made every remote lane scan decline)."""
    from ckptguard.core.torch.container import META_RECORDS, SERIALIZATION_ID
    from ckptguard.core.zip.columns import REMOTE_LOCALS

    assert set(META_RECORDS) | {SERIALIZATION_ID} <= set(REMOTE_LOCALS)


def test_a_surprise_in_the_lane_is_a_logged_decline(monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Any exception in the lane hands the file to the general path (the authority) and
    leaves a debug record with its traceback on "ckptguard.fastlane"."""
    def broken(*args: object) -> None:
        raise KeyError("a bug")

    monkeypatch.setattr(fastlane, "_judge", broken)
    with caplog.at_level("DEBUG", logger="ckptguard.fastlane"):
        assert fastlane.try_torch_zip(BytesSource(b"PK\x05\x06" + bytes(18)), Analysis()) is False
    assert [(r.name, r.getMessage(), r.exc_info is not None) for r in caplog.records] == [
        ("ckptguard.fastlane", "fast lane declined with an exception", True)]
