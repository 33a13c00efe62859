"""torch's words for every refusal: the scan's `weights_only` against torch.load itself.

`weights_only.loadable` is what `torch.load(path, weights_only=True)` does with this very
file, for every format, and `weights_only.error` is torch's first line. Two sets:
- every format's benign files (pickles, NumPy, safetensors under both names, zips of
  other tools): torch's literal answer, while the verdict follows `policy_accepts`, so a
  clean file stays `safe`;
- a generated set of refusals: a torch.save zip and a legacy stream cut at many offsets and
  with bytes flipped in every header field, and non-checkpoints (text, JSON, random bytes).

The one normalisation: for an `UnpicklingError` the report keeps the restricted unpickler's
own line, which torch wraps in its "Weights only load failed..." text
(tests/differential/torch_answer.py).
torch names the file by the path it was given: the tests load by bare name from the
file's folder, as the scan names it.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import re
import warnings
import zipfile
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptguard.core.scan import scan_path
from tests.differential.torch_answer import torch_answer

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
pytestmark = pytest.mark.torch


Answer = tuple[bool, str | None, str | None]   # (loadable, error type, first line)


def _torch(path: Path) -> Answer:
    return torch_answer(path.name)   # by bare name from its folder, as the scan names it


def _agree(path: Path) -> tuple[object, Answer]:
    report = scan_path(path)
    wo = report.weights_only
    return report, (wo.loadable, wo.error_type, wo.error)


# -- every format's benign files ----------------------------------------------------------------

def _benign(folder: Path) -> Iterator[tuple[str, Path]]:
    from safetensors.numpy import save_file

    def put(name: str, data: bytes) -> tuple[str, Path]:
        path = folder / name
        path.write_bytes(data)
        return name, path

    values = {"lr": 0.1, "steps": [1, 2, 3], "name": "run", "ok": True, "none": None}
    for proto in (2, 3):
        yield put(f"config{proto}.pkl", pickle.dumps(values, protocol=proto))
    yield put("ordered.pkl", pickle.dumps(OrderedDict(a=1, b=(2.5, -3)), protocol=2))
    yield put("int.pkl", pickle.dumps(7, protocol=2))
    yield put("nested.pkl", pickle.dumps({"a": {"b": [{"c": 1}]}}, protocol=2))
    for name, array in (("f32", np.arange(6, dtype=np.float32).reshape(2, 3)),
                        ("i64", np.arange(3)), ("bool", np.array([True, False]))):
        buf = io.BytesIO()
        np.save(buf, array)
        yield put(f"{name}.npy", buf.getvalue())
    buf = io.BytesIO()
    np.savez(buf, x=np.arange(3), y=np.ones(2))
    yield put("arrays.npz", buf.getvalue())
    buf = io.BytesIO()
    np.savez_compressed(buf, x=np.arange(3))
    yield put("compressed.npz", buf.getvalue())
    save_file({"w": np.arange(4, dtype=np.float32), "b": np.zeros(2, dtype=np.int8)},
              str(folder / "model.safetensors"))
    yield "model.safetensors", folder / "model.safetensors"
    yield put("model.bin", (folder / "model.safetensors").read_bytes())   # the same bytes
    yield put("empty.safetensors.bin", b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.export.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),))
        torch.export.save(program, folder / "model.pt2")   # torch.load: no data.pkl
    yield "model.pt2", folder / "model.pt2"


def test_every_format_answers_as_torch_load(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name, path in _benign(tmp_path):
        report, ours = _agree(path)
        assert ours == _torch(path), name
        # the verdict follows the policy: no pickle, or only allowlisted globals
        assert report.weights_only.policy_accepts, (name, report.weights_only)   # type: ignore[attr-defined]
        assert report.verdict == "safe", (name, report.findings)   # type: ignore[attr-defined]


def test_a_pickle_the_policy_refuses_is_refused_in_the_unpicklers_words(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "sklearn.pkl"
    path.write_bytes(pickle.dumps({"when": __import__("datetime").date(2024, 1, 2)}, protocol=2))
    report, ours = _agree(path)
    assert ours == _torch(path)
    assert ours[0] is False and not report.weights_only.policy_accepts   # type: ignore[attr-defined]
    assert report.verdict == "suspicious"   # type: ignore[attr-defined]


# -- a generated set of refusals -------------------------------------------------------------------

def _zip_fields(data: bytes) -> list[int]:
    """Offsets of every header field of a zip: local, central, zip64 and end records."""
    out: list[int] = []
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            h = info.header_offset
            out += [h, h + 4, h + 6, h + 8, h + 18, h + 22, h + 26, h + 28, h + 30]
    cd = data.rfind(b"PK\x01\x02", 0)
    first_cd = data.find(b"PK\x01\x02")
    for pos in range(first_cd, cd + 1):
        if data[pos:pos + 4] == b"PK\x01\x02":
            out += [pos, pos + 10, pos + 20, pos + 24, pos + 28, pos + 30, pos + 42, pos + 46]
    for sig in (b"PK\x06\x06", b"PK\x06\x07", b"PK\x05\x06"):
        at = data.rfind(sig)
        if at >= 0:
            out += [at, at + 8, at + 10, at + 12, at + 16, at + 24, at + 32, at + 40, at + 48]
    return sorted({o for o in out if 0 <= o < len(data)})


def _refusals(folder: Path) -> Iterator[tuple[str, bytes]]:
    rng = random.Random(18)
    state = {"w": torch.arange(40.0).reshape(5, 8), "b": torch.ones(3, dtype=torch.int8)}
    buf = io.BytesIO()
    torch.save(state, buf)
    zipped = buf.getvalue()
    buf = io.BytesIO()
    torch.save(state, buf, _use_new_zipfile_serialization=False)
    legacy = buf.getvalue()
    for label, data in (("zip", zipped), ("legacy", legacy)):
        cuts = set(range(1, len(data), max(1, len(data) // 60))) | {len(data) - k for k in range(1, 30)}
        for cut in sorted(c for c in cuts if 0 < c < len(data)):
            yield f"{label}-cut-{cut}", data[:cut]
    for at in _zip_fields(zipped):
        for flip in (0x01, 0x80, 0xFF):
            bad = bytearray(zipped)
            bad[at] ^= flip
            yield f"zip-flip-{at}-{flip:#x}", bytes(bad)
    for at in sorted(rng.sample(range(len(legacy)), 60)):
        bad = bytearray(legacy)
        bad[at] ^= 0xFF
        yield f"legacy-flip-{at}", bytes(bad)
    for numel, wrong in ((40, 41), (40, 39), (3, 2 ** 62), (3, -1)):   # a block's element count
        at = legacy.rfind(numel.to_bytes(8, "little"))
        yield f"legacy-count-{numel}-{wrong}", \
            legacy[:at] + wrong.to_bytes(8, "little", signed=True) + legacy[at + 8:]
    yield "text", b"hello world\nthis is not a checkpoint\n"
    yield "json", json.dumps({"architectures": ["Bert"], "hidden_size": 768}).encode()
    yield "markdown", b"# Model card\n\nWeights are in model.safetensors.\n"
    yield "html", b"<!DOCTYPE html><html><body>404</body></html>"
    for i in range(40):
        yield f"random-{i}", rng.randbytes(rng.choice([1, 2, 7, 64, 300, 4096]))


def _answers(folder: Path, cases: Iterator[tuple[str, bytes]]) -> Iterator[tuple[str, Answer, Answer]]:
    """(name, the scan's weights_only answer, torch's) per case; a file torch refuses is never
    `safe`."""
    for name, data in cases:
        path = folder / f"{name}.pt"
        path.write_bytes(data)
        want = _torch(path)
        report, ours = _agree(path)
        if not want[0]:
            assert report.verdict != "safe", name   # type: ignore[attr-defined]
        os.unlink(path)
        yield name, ours, want


def test_refusals_are_torchs_first_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    mismatches = []
    n = 0
    for name, ours, want in _answers(tmp_path, _refusals(tmp_path)):
        n += 1
        if ours != want:
            mismatches.append((name, ours, want))
    assert n > 500
    assert mismatches == [], f"{len(mismatches)} of {n}: {mismatches[:5]}"


def test_no_message_of_ours_carries_printf_placeholders(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Findings are ours: a torch message it prints unformatted is quoted and explained."""
    monkeypatch.chdir(tmp_path)
    for name, data in _refusals(tmp_path):
        path = tmp_path / f"{name}.pt"
        path.write_bytes(data)
        report = scan_path(path)
        for f in report.findings:
            if "unformatted" in f.message:   # torch's own words, quoted and said so
                assert f.code == "TORCH_WEIGHTS_ONLY_FAILED", (name, f)
                continue
            assert not re.search(r"%l?[dsu]|\{\}|\{[a-z_]+\}", f.message), (name, f)
        os.unlink(path)


# -- every byte of the pickles flipped ----------------------------------------------------------------

def _pickle_flips() -> Iterator[tuple[str, bytes]]:
    """Every byte of a legacy stream and of a zip's data.pkl, with two flips each (the low
    bit: a neighbouring opcode, length or value; all bits: far from it)."""
    state = {"w": torch.arange(40.0).reshape(5, 8), "b": torch.ones(3, dtype=torch.int8)}
    buf = io.BytesIO()
    torch.save(state, buf, _use_new_zipfile_serialization=False)
    legacy = buf.getvalue()
    buf = io.BytesIO()
    torch.save(state, buf)
    zipped = buf.getvalue()
    with zipfile.ZipFile(io.BytesIO(zipped)) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith("/data.pkl"))
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for label, data, span in (("legacy", legacy, range(len(legacy))),
                              ("data.pkl", zipped, range(start, start + info.compress_size))):
        for at in span:
            for flip in (0x01, 0xFF):
                bad = bytearray(data)
                bad[at] ^= flip
                yield f"{label}-{at}-{flip:#x}", bytes(bad)


def test_every_flipped_pickle_byte_gets_torchs_answer_or_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The scan states torch's answer for every one of them: no "Unmodelled" left (the last
    two were BUILDs on a tensor, core.torch.tensor_build)."""
    monkeypatch.chdir(tmp_path)
    wrong, unmodelled, n = [], [], 0
    for name, ours, want in _answers(tmp_path, _pickle_flips()):
        n += 1
        if ours[1] == "Unmodelled":
            unmodelled.append((name, ours[2], want))
        elif ours != want:
            wrong.append((name, ours, want))
    assert n > 1500
    assert wrong == [], f"{len(wrong)} of {n}: {wrong[:5]}"
    assert unmodelled == [], unmodelled[:10]


# -- a view past the end of a legacy storage grows it ---------------------------------------------------

def _legacy_with(pid_numel: int, block_count: int) -> bytes:
    """A legacy save of one 5x8 float tensor whose persistent id and block say other sizes."""
    buf = io.BytesIO()
    torch.save({"w": torch.arange(40.0).reshape(5, 8)}, buf, _use_new_zipfile_serialization=False)
    data = buf.getvalue()
    pid = data.index(b"K\x28N")            # BININT1 40 (the pid's numel), NONE (no view)
    data = data[:pid + 1] + bytes([pid_numel]) + data[pid + 2:]
    count = data.rindex((40).to_bytes(8, "little"))
    return data[:count] + block_count.to_bytes(8, "little") + data[count + 8:]


@pytest.mark.parametrize(("pid_numel", "block_count"), [(30, 40), (0, 40), (30, 30), (39, 41)])
def test_a_view_past_a_legacy_storage_grows_it_as_torch_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pid_numel: int, block_count: int) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "grown.pt"
    path.write_bytes(_legacy_with(pid_numel, block_count))
    want = _torch(path)
    report, ours = _agree(path)
    assert ours == want
    if want[0]:   # the grown storage's bytes are where torch reads them
        from tests.differential.test_manifest_vs_torch import compare
        from tests.fixtures.generate import Case

        compare(Case("grown", path, "", legacy=True), report.tensors, report.storages)  # type: ignore[attr-defined]
