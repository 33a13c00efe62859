"""A red team's 22 KB torch.save zip whose unreferenced record holds an inner zip of 400
entries sharing one local header, their compressed sizes apart: 400 regions over one 1.1 KB
pickle, each run through the VM with its own budgets (51 s; 4,096 entries: ~8 minutes). A
pickle judged from one first byte is judged once: a region that starts there and holds all of
it adds nothing new (what follows it is still read as the next region)."""

from __future__ import annotations

import pickle
import struct
import zlib

import pytest

from ckptguard.core.errors import Code
from ckptguard.core.regions import judge
from ckptguard.core.scan import scan_bytes
from tests.builders.torchlayout import META, state_dict, torch_layout, v2

EVIL = b"\x80\x02cos\nsystem\n(X\x04\x00\x00\x00truetR."   # os.system('true')


def _inner_zip(pkl: bytes, entries: int) -> bytes:
    data = pkl + bytes(entries)
    name = b"p"
    local = struct.pack("<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 0, 0, 0, zlib.crc32(data),
                        len(data), len(data), len(name), 0) + name
    central = b"".join(struct.pack("<4sHHHHHHIIIHHHHHII", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0,
                                   len(pkl) + i, len(pkl) + i, len(name), 0, 0, 0, 0, 0, 0) + name
                       for i in range(entries))
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, entries, entries, len(central),
                      len(local) + len(data), 0)
    return local + data + central + end


@pytest.mark.parametrize("pkl", [EVIL, pickle.dumps({"a": list(range(100))}, protocol=2)],
                         ids=["dangerous", "plain"])
def test_regions_over_one_pickle_run_the_vm_once(pkl: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    runs = []
    real = judge.run_vm
    monkeypatch.setattr(judge, "run_vm", lambda *a, **k: runs.append(1) or real(*a, **k))
    data = torch_layout("archive", state_dict(("w", v2("0"))), [("0", bytes(4))],
                        meta=[*META, ("extra", _inner_zip(pkl, 400))])
    report = scan_bytes(data)
    assert len(runs) <= 3, len(runs)   # 400 before
    codes = {f.code for f in report.findings}
    assert (Code.REGION_PAYLOAD in codes) is (pkl is EVIL) and report.verdict != "safe"
