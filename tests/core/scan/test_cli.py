"""`ckptguard scan` as a user meets it: exit status, summary, --json, --allow, --verify-crc."""

from __future__ import annotations

import argparse
import json
import zipfile
from pathlib import Path

import pytest

from ckptguard.app.cli import main
from tests.builders.pickle_asm import asm

torch = pytest.importorskip("torch")


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    path = tmp_path / "model.pt"
    torch.save({"w": torch.arange(4.0), "b": torch.zeros(2, dtype=torch.int64)}, path)
    return path


def test_safe_checkpoint_exits_zero_with_a_summary(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(ckpt)]) == 0
    out = capsys.readouterr().out
    assert "SAFE (torch-zip, 2 tensors, 2 storages)" in out
    assert "weights_only load: yes" in out


def test_a_text_summary_is_made_without_the_report_rows(
        ckpt: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """One file in text: its counts come from the Report, no row is serialised (issue 14:
    the rows of a 10,000-tensor report cost a fifth of its scan); --json still has them."""
    from ckptguard.core import report as report_module

    made: list[str] = []
    for row in (report_module.TensorEntry, report_module.StorageEntry):
        monkeypatch.setattr(row, "to_json", lambda self, _n=row.__name__: made.append(_n) or {})
    assert main(["scan", str(ckpt)]) == 0
    assert "SAFE (torch-zip, 2 tensors, 2 storages)" in capsys.readouterr().out
    assert made == []
    assert main(["scan", str(ckpt), "--json"]) == 0
    assert sorted(made) == ["StorageEntry"] * 2 + ["TensorEntry"] * 2


def test_a_summary_table_counts_what_the_reports_list(ckpt: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.pt"
    torch.save({f"t{i}": torch.zeros(1) for i in range(3)}, other)
    assert main(["scan", str(ckpt), str(other), "-j", "1", "--no-progress"]) == 0
    rows = {line.split()[0]: line.split()[3] for line in capsys.readouterr().out.splitlines()
            if line.startswith(str(tmp_path)) and not line.split()[0].endswith(":")}
    assert rows == {str(ckpt): "2", str(other): "3"}


def test_json_report(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(ckpt), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "safe" and [t["name"] for t in report["tensors"]] == ["w", "b"]


def test_json_report_is_the_report_one_item_per_line(ckpt: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from ckptguard.core.scan import scan_path

    assert main(["scan", str(ckpt), "--json"]) == 0
    text = capsys.readouterr().out
    expected = scan_path(ckpt).to_json()
    expected["source"]["name"] = str(ckpt)   # the command line names a file as its user did
    got = json.loads(text)
    got["timings_ms"] = expected["timings_ms"]
    assert got == expected
    lines = text.splitlines()
    assert len(lines) == 2 + len(expected) + sum(  # "{", "}", a field each, list items
        len(v) + 1 for v in expected.values() if isinstance(v, list) and v)
    assert any(line.startswith('    {"name": "w"') for line in lines)


def test_json_to_a_reader_that_leaves_is_not_an_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    ckpt = tmp_path / "many.pt"   # ~700 KB of JSON: more than a pipe holds
    torch.save({f"layer{i}.weight": torch.zeros(2) for i in range(3000)}, ckpt)
    out = subprocess.run(f"{sys.executable} -m app.cli scan {ckpt} --json | head -1",
                         shell=True, capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[3])
    assert out.stdout == "{\n" and "Traceback" not in out.stderr and "Broken" not in out.stderr


def test_malicious_pickle_exits_two(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    evil = tmp_path / "evil.bin"
    evil.write_bytes(asm(("PROTO", 2), ("GLOBAL", "os", "system"), ("BINUNICODE", "true"),
                         "TUPLE1", "REDUCE", "STOP"))
    assert main(["scan", str(evil)]) == 2
    assert "dangerous os.system" in capsys.readouterr().out


def test_allow_changes_the_verdict_as_add_safe_globals_would(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "args.pt"
    torch.save({"w": torch.ones(1), "args": argparse.Namespace(lr=0.1)}, path)
    assert main(["scan", str(path)]) == 1
    out = capsys.readouterr().out
    assert "benign    argparse.Namespace" in out
    assert "safe_globals" in out                      # the ready-to-paste hint
    assert main(["scan", str(path), "--allow", "argparse.Namespace"]) == 0
    with torch.serialization.safe_globals([argparse.Namespace]):   # the oracle agrees
        torch.load(path, weights_only=True)


def test_verify_crc_reads_records_torch_never_checks(ckpt: Path, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    data = bytearray(ckpt.read_bytes())
    info = next(i for i in zipfile.ZipFile(ckpt).infolist() if i.filename.endswith("data/0"))
    n, m = int.from_bytes(data[info.header_offset + 26:info.header_offset + 28], "little"), \
        int.from_bytes(data[info.header_offset + 28:info.header_offset + 30], "little")
    start = info.header_offset + 30 + n + m          # the local extra (FB padding) counts
    data[start] ^= 0xFF                               # flip a weight byte; headers untouched
    bad = tmp_path / "flipped.pt"
    bad.write_bytes(bytes(data))
    torch.load(bad, weights_only=True)                # torch does not notice
    assert main(["scan", str(bad)]) == 0
    capsys.readouterr()
    assert main(["scan", str(bad), "--verify-crc", "--json"]) == 1
    codes = {f["code"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert "ZIP_CRC_MISMATCH" in codes


def test_unreadable_path_exits_four(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scan", str(tmp_path / "missing.pt")]) == 4
    assert "cannot read" in capsys.readouterr().err


def test_codes_command_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["codes"]) == 0
    assert "| `PICKLE_DANGEROUS_GLOBAL` | critical | unsafe |" in capsys.readouterr().out


def test_a_clean_pickle_says_what_torch_load_and_the_policy_answer(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import pickle

    path = tmp_path / "config.pkl"
    path.write_bytes(pickle.dumps({"lr": 0.1}, protocol=2))
    assert main(["scan", str(path)]) == 0
    out = capsys.readouterr().out
    assert "weights_only load: no — RuntimeError: Invalid magic number; corrupt file?; the " \
        "weights-only policy accepts its pickles" in out
