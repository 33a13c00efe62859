"""Real torch files through the VM: data.pkl, legacy streams, numpy object arrays (torch = oracle)."""

from __future__ import annotations

import io
import pickletools
from collections.abc import Callable

import numpy as np
import pytest

from ckptguard.core.pickle.renames import torch_map
from ckptguard.core.pickle.vm import run_vm
from ckptguard.core.torch.rules import TORCH_ACCEPTED
from ckptguard.core.values import Global, PersId
from tests.core.pickles.conftest import torch_legacy_stream

pytestmark = pytest.mark.torch


def test_state_dict_globals_match_torch(state_dict_pkl: bytes) -> None:
    from torch._weights_only_unpickler import get_globals_in_pkl

    r = run_vm(state_dict_pkl)
    assert r.complete and r.error is None and r.end == len(state_dict_pkl) and r.notes == []
    assert r.protocol == 2 and r.opcodes_used <= TORCH_ACCEPTED
    ours = {"{}.{}".format(*torch_map(u.raw_module, u.raw_name)) for u in r.globals}
    assert ours == get_globals_in_pkl(io.BytesIO(state_dict_pkl))
    assert r.opcode_count == sum(1 for _ in pickletools.genops(state_dict_pkl))


def test_state_dict_structure(state_dict_pkl: bytes) -> None:
    r = run_vm(state_dict_pkl)
    sd = r.root
    assert type(sd) is dict
    assert set(sd) == {"w", "view", "half", "p", "step", "nested"}
    assert sd["step"] == 7 and sd["nested"] == {"lr": 0.5, "names": ["a", "b"]}
    w, view = sd["w"], sd["view"]
    assert w.func == Global("torch._utils", "_rebuild_tensor_v2")
    storage, offset, size, stride = w.args[:4]
    assert isinstance(storage, PersId) and storage.pid == ("storage", Global("torch", "FloatStorage"), "0",
                                                           "cpu", 6)
    assert (offset, size, stride) == (0, (2, 3), (3, 1))
    assert view.args[0].pid == storage.pid and view.args[1:4] == (3, (3,), (1,))
    assert sd["p"].func == Global("torch._utils", "_rebuild_parameter")
    assert sd["half"].args[0].pid[1] == Global("torch", "HalfStorage")
    assert len(r.persids) == 4 and all(p.offset >= 0 for p in r.persids)


def test_big_state_dict(make_torch_pkl: Callable[[object], bytes]) -> None:
    import torch

    data = make_torch_pkl({f"w{i}": torch.zeros(2) for i in range(5000)})
    r = run_vm(data)
    assert r.complete and len(r.persids) == 5000 and len(r.root) == 5000
    # per tensor: _rebuild_tensor_v2(...) and its backward_hooks OrderedDict()
    assert len(r.calls) == 10000 and len({id(p) for p in r.persids}) == 5000
    assert [u.name for u in r.globals] == ["_rebuild_tensor_v2", "FloatStorage", "OrderedDict"]


def test_legacy_stream_is_a_sequence_of_pickles() -> None:
    import torch

    data = torch_legacy_stream({"a": torch.ones(3), "b": 5})
    roots = []
    pos = 0
    for _ in range(5):                      # magic, protocol, sys_info, object, storage keys
        r = run_vm(data, start=pos, base_offset=100)
        assert r.complete and r.start == pos, r.error
        roots.append(r.root)
        pos = r.end
    assert roots[0] == 0x1950A86A20F9469CFC6C and roots[1] == 1001
    assert isinstance(roots[3], dict) and roots[3]["b"] == 5
    obj_start = run_vm(data, start=run_vm(data, start=run_vm(data).end).end).end
    obj = run_vm(data, start=obj_start, base_offset=100)
    assert obj.complete
    (pid,) = obj.persids
    assert pid.pid[0] == "storage" and roots[4] == [pid.pid[2]]
    assert all(100 + obj_start < u.offset < 100 + obj.end for u in obj.globals)


def test_numpy_object_array_pickle() -> None:
    arr = np.array([1, "x", None, {"k": (1, 2)}], dtype=object)
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=True)
    data = buf.getvalue()
    header_len = int.from_bytes(data[8:10], "little")
    start = 10 + header_len
    r = run_vm(data, start=start, base_offset=0)
    assert r.complete and r.end == len(data)
    names = {(u.module, u.name) for u in r.globals}
    assert ("numpy.core.multiarray", "_reconstruct") in names or ("numpy._core.multiarray",
                                                                   "_reconstruct") in names
    assert ("numpy", "ndarray") in names and ("numpy", "dtype") in names
    assert all(u.offset >= start for u in r.globals)
