"""A pickle's string may hold a lone surrogate (BINUNICODE decodes with surrogatepass, as
pickle and torch.load do): a red team's torch.save zip with a tensor named 'w\\udcff' (torch
loads it) made `POST /scan` answer 500, since UTF-8 cannot encode it. The service writes it
as its JSON escape, which a JSON reader turns back into the same name; the stored report,
its tensor pages and the command line's SARIF output do too."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from fastapi.testclient import TestClient

from ckptguard.app.cli import main
from tests.builders.torchlayout import torch_layout
from tests.service.conftest import upload

NAME = "w\udcff"


def _checkpoint() -> bytes:
    raw = NAME.encode("utf-8", "surrogatepass")
    tensor = (b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\n"
              b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuJ\x01\x00\x00\x00tQJ\x00\x00\x00\x00"
              b"(J\x01\x00\x00\x00t(J\x01\x00\x00\x00t\x89ccollections\nOrderedDict\n)RtR")
    pkl = b"\x80\x02}X" + struct.pack("<I", len(raw)) + raw + tensor + b"s."
    return torch_layout("archive", pkl, [("0", bytes(4))])


def test_a_lone_surrogate_in_a_name_is_served_as_its_json_escape(client: TestClient) -> None:
    answer = upload(client, _checkpoint())
    assert answer.status_code == 200, answer.text
    assert b"w\\udcff" in answer.content   # the escape, in UTF-8 bytes a client can decode
    report = json.loads(answer.content)
    assert [t["name"] for t in report["tensors"]] == [NAME] and report["verdict"] == "safe"
    stored = client.get(f"/scans/{report['id']}")
    assert stored.status_code == 200 and json.loads(stored.content)["tensors"][0]["name"] == NAME
    page = client.get(f"/scans/{report['id']}/tensors")
    assert page.status_code == 200 and NAME in {t["name"] for t in json.loads(page.content)["items"]}


def test_the_command_line_writes_it_in_every_format(tmp_path: Path, capsys: object) -> None:
    path = tmp_path / "model.pt"
    path.write_bytes(_checkpoint())
    for fmt in ("text", "json", "jsonl", "sarif"):
        assert main(["scan", str(path), "--format", fmt, "-o", str(tmp_path / f"out.{fmt}")]) == 0, fmt
