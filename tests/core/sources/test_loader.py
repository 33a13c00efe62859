"""Tensors read over HTTP Range are byte-equal to torch.load's, one ranged read each.

The manifest here is built from torch + zipfile (an oracle independent of core.scan),
so these tests pin the loader's bytes -> array step; tests/e2e/test_remote_scan.py runs
the same comparison through the real scanner.
"""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from ckptguard.core.io.http import HttpSource
from ckptguard.core.io.source import BytesSource
from ckptguard.core.loader import RemoteCheckpoint, TensorUnreadable, numpy_dtype
from ckptguard.core.report import Report, SourceInfo, StorageEntry, TensorEntry
from ckptguard.core.torch.dtypes import ITEMSIZE
from tests.core.sources.conftest import mixed_state

torch = pytest.importorskip("torch")


def torch_bytes(t: object) -> bytes:
    c = t.detach().contiguous().reshape(-1)  # type: ignore[attr-defined]
    return bytes(c.view(torch.uint8).numpy().tobytes()) if c.numel() else b""


def oracle_manifest(data: bytes, state: dict[str, object]) -> Report:
    """TensorEntries from torch's own tensors and the zip's local headers."""
    zf = zipfile.ZipFile(io.BytesIO(data))
    starts: dict[str, int] = {}
    for info in zf.infolist():
        h = info.header_offset
        n, m = int.from_bytes(data[h + 26:h + 28], "little"), int.from_bytes(data[h + 28:h + 30], "little")
        starts[info.filename.split("/", 1)[1]] = h + 30 + n + m
    keys: dict[int, str] = {}
    tensors, storages = [], []
    for name, t in state.items():
        t = t.detach()  # type: ignore[attr-defined]
        ptr = t.untyped_storage().data_ptr()
        if ptr not in keys:
            keys[ptr] = str(len(keys))
            dt = str(t.dtype).removeprefix("torch.")
            nb = t.untyped_storage().nbytes()
            storages.append(StorageEntry(keys[ptr], dt, nb // t.element_size(), nb, "cpu",
                                         f"archive/data/{keys[ptr]}", starts[f"data/{keys[ptr]}"], True))
        key = keys[ptr]
        dtype = str(t.dtype).removeprefix("torch.")
        numel = t.numel()
        span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))
        nbytes = span * ITEMSIZE[dtype] if numel else 0
        tensors.append(TensorEntry(name, [name], dtype, list(t.shape), list(t.stride()),
                                   t.storage_offset(), key, "tensor", False,
                                   starts[f"data/{key}"] + t.storage_offset() * ITEMSIZE[dtype], nbytes))
    return Report(source=SourceInfo(kind="bytes"), tensors=tensors, storages=storages)


@pytest.fixture
def cold_source(server, guard):
    """A source whose cache holds only 512 head/tail bytes: every tensor read hits the wire."""
    src = HttpSource(server.url("/small.pt"), guard=guard, head_bytes=512, tail_bytes=512,
                     speculate=False)
    yield src
    src.close()


def test_every_tensor_is_byte_equal_to_torch_load(cold_source, server, small_ckpt) -> None:
    state = mixed_state()
    loaded = torch.load(io.BytesIO(small_ckpt), weights_only=True)
    ckpt = RemoteCheckpoint(cold_source, oracle_manifest(small_ckpt, state))
    headers = {i.filename: i.header_offset for i in zipfile.ZipFile(io.BytesIO(small_ckpt)).infolist()}
    ckpt.read_tensor(next(iter(loaded)))   # the first read also fetches the central directory
    for name, ref in loaded.items():
        before = server.requests
        entry = ckpt.entry(name)
        arr = ckpt.read_tensor(name)
        assert arr.shape == tuple(ref.shape), name
        assert arr.dtype == numpy_dtype(entry.dtype), name
        assert arr.tobytes() == torch_bytes(ref), name
        if entry.nbytes and server.requests > before:
            # one ranged read: from the record's local header (where its data begins is
            # checked) to the end of the tensor's span
            start = headers[f"archive/data/{entry.storage}"]
            assert server.requests - before == 1
            assert server.log[-1].range == f"bytes={start}-{entry.data_offset + entry.nbytes - 1}"


def test_values_not_just_bytes(cold_source, small_ckpt) -> None:
    state = mixed_state()
    ckpt = RemoteCheckpoint(cold_source, oracle_manifest(small_ckpt, state))
    np.testing.assert_array_equal(ckpt.read_tensor("transposed"), state["base"].t().numpy())  # type: ignore[attr-defined]
    np.testing.assert_array_equal(ckpt.read_tensor("strided"), state["base"][1::2, ::2].numpy())  # type: ignore[index]
    bf = ckpt.read_tensor("bf16")
    np.testing.assert_array_equal(bf.astype(np.float32), state["bf16"].float().numpy())  # type: ignore[attr-defined]
    assert ckpt.read_tensor("scalar").shape == () and float(ckpt.read_tensor("scalar")) == 3.5
    assert ckpt.read_tensor("empty").shape == (0, 4)


def test_read_tensors_is_one_wave(cold_source, server, small_ckpt) -> None:
    state = mixed_state()
    ckpt = RemoteCheckpoint(cold_source, oracle_manifest(small_ckpt, state))
    rt0, n0 = cold_source.round_trips, server.requests
    got = ckpt.read_tensors(state)
    assert cold_source.round_trips - rt0 == 1
    assert server.requests - n0 <= 2   # tensors sit within 64 KiB of each other: coalesced
    loaded = torch.load(io.BytesIO(small_ckpt), weights_only=True)
    assert {k: v.tobytes() for k, v in got.items()} == {k: torch_bytes(v) for k, v in loaded.items()}


def test_local_bytes_source_gives_the_same_arrays(small_ckpt) -> None:
    state = mixed_state()
    ckpt = RemoteCheckpoint(BytesSource(small_ckpt), oracle_manifest(small_ckpt, state))
    assert ckpt.read_tensor("f8e4").tobytes() == torch_bytes(state["f8e4"])


def test_unknown_name_and_lying_manifest(small_ckpt) -> None:
    state = mixed_state()
    report = oracle_manifest(small_ckpt, state)
    ckpt = RemoteCheckpoint(BytesSource(small_ckpt), report)
    with pytest.raises(KeyError):
        ckpt.read_tensor("nope")
    # a view whose strides reach past the bytes the manifest says it spans
    bad = report.tensors[0]
    report.tensors[0] = bad._replace(stride=[100, 1])
    with pytest.raises(TensorUnreadable):
        RemoteCheckpoint(BytesSource(small_ckpt), report).read_tensor(bad.name)
    report.tensors[0] = bad._replace(stride=[-1, 1], shape=[3, 4])
    with pytest.raises(TensorUnreadable):
        RemoteCheckpoint(BytesSource(small_ckpt), report).read_tensor(bad.name)


def test_big_endian_storages_are_swapped_like_torch() -> None:
    # FORMATS.md §2.5: typed storages are swapped by element size, complex by half of it
    data = np.arange(4, dtype=">f4").tobytes() + np.array([1 + 2j], dtype=">c8").tobytes()
    from ckptguard.core.errors import Code
    from ckptguard.core.report import Finding
    report = Report(source=SourceInfo(kind="bytes"), findings=[Finding(Code.TORCH_BIG_ENDIAN, "big")],
                    storages=[StorageEntry("0", "float32", 4, 16, "cpu", None, 0, True),
                              StorageEntry("1", "complex64", 1, 8, "cpu", None, 16, True),
                              StorageEntry("2", "uint8", 8, 8, "cpu", None, 0, True)],
                    tensors=[TensorEntry("a", ["a"], "float32", [4], [1], 0, "0", "tensor", False, 0, 16),
                             TensorEntry("c", ["c"], "complex64", [1], [1], 0, "1", "tensor", False, 16, 8),
                             TensorEntry("u", ["u"], "uint16", [4], [1], 0, "2", "tensor", False, 0, 8)])
    ckpt = RemoteCheckpoint(BytesSource(data), report)
    np.testing.assert_array_equal(ckpt.read_tensor("a"), np.arange(4, dtype=np.float32))
    assert ckpt.read_tensor("c")[0] == 1 + 2j
    # UntypedStorage pids (v3 dtypes) are never swapped: torch reads them as stored
    assert ckpt.read_tensor("u").tobytes() == data[:8]


def test_unmappable_dtype() -> None:
    with pytest.raises(TensorUnreadable):
        numpy_dtype("quint4x2")


def test_safetensors_over_http(server, guard, tmp_path) -> None:
    st = pytest.importorskip("safetensors.torch")
    from ckptguard.core.loader import open_checkpoint

    g = torch.Generator().manual_seed(3)
    tensors = {f"blocks.{i}.attn.weight": torch.randn(4, 3, generator=g).bfloat16() for i in range(3000)}
    tensors["f8"] = torch.randn(16, generator=g).to(torch.float8_e4m3fn)
    tensors["i32"] = torch.arange(7, dtype=torch.int32)
    data = st.save(tensors)
    assert int.from_bytes(data[:8], "little") > 65536  # the header outgrows the head read
    server.files["/m.safetensors"] = data
    with open_checkpoint(server.url("/m.safetensors"), guard=guard) as ckpt:
        assert ckpt.report.format == "safetensors" and len(ckpt.names) == len(tensors)
        header_requests = ckpt.source.stats.requests - 1  # minus the concurrent tail read
        assert header_requests <= 2
        got = ckpt.read_tensors(["f8", "i32", "blocks.7.attn.weight"])
    for name in got:
        assert got[name].tobytes() == torch_bytes(tensors[name]), name
        assert got[name].shape == tuple(tensors[name].shape)


def test_a_name_two_tensors_share_is_refused_not_guessed(tmp_path) -> None:
    """{0: a, "0": b} names both tensors "0": reading "0" must not return one of them silently."""
    from ckptguard.core.loader import open_checkpoint

    path = tmp_path / "alike.pt"
    torch.save({0: torch.zeros(2), "0": torch.ones(3), "x": torch.arange(4.0)}, path)
    with open_checkpoint(str(path)) as ckpt:
        assert [t.name for t in ckpt.report.tensors] == ["0", "0", "x"]
        with pytest.raises(KeyError, match="2 tensors are named '0'"):
            ckpt.read_tensor("0")
        assert np.array_equal(ckpt.read_tensor("x"), np.arange(4.0, dtype=np.float32))
