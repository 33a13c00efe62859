"""`set([T, T, ...])` with one memoized wide tuple T (found by a red-team round): the exact
interpreter hashed every member afresh, walking all of T each time, with no budget (dict
keys had both): a 21 KB zip took 18 s, 124 KB ~2 minutes, and came out `safe`. Set members
now share the pickle's hashing budget with dict keys (core.torch.callables.HashBudget): T is
walked once, and torch's own cost, |T| element visits per hash, is charged, past
HASH_VISITS_MAX the pickle is Unmodelled (torch would take minutes)."""

from __future__ import annotations

from typing import Any

import pytest

from ckptguard.core import records
from ckptguard.core.limits import DEFAULT_LIMITS
from ckptguard.core.report import WeightsOnly
from ckptguard.core.scan import scan_bytes
from ckptguard.core.state import ScanOptions
from ckptguard.core.torch import callables
from tests.builders.torchlayout import torch_layout


def _set_of_one_tuple(width: int, members: int, calls: int = 1) -> bytes:
    """{'t': T, 'g': set, 's0': set([T] * members), ...}: T = (None,) * width in memo 1; the args
    tuple of set() memoized, so each further call is a few bytes."""
    tup = b"(" + b"N" * width + b"tq\x01"
    args = b"]q\x02(" + b"h\x01" * members + b"e\x85q\x03"
    # 't': T and 'g': set (memo 4: torch's unpickler has no POP to drop it)
    body = b"X\x01\x00\x00\x00t" + tup + b"X\x01\x00\x00\x00gc__builtin__\nset\nq\x04"
    for i in range(calls):
        key = f"s{i}".encode()
        body += b"X" + len(key).to_bytes(4, "little") + key + b"h\x04" + (args if i == 0 else b"h\x03") + b"R"
    return b"\x80\x02}q\x00(" + body + b"u."


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = callables.hash_error

    def counted(*args: Any, **kwargs: Any) -> str | None:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(callables, "hash_error", counted)
    return calls


@pytest.mark.parametrize("members, calls", [(400, 1), (1_000, 1), (2_000, 1), (8_000, 1), (40, 200)])
def test_a_memoized_tuple_is_walked_once_however_often_it_is_hashed(
        monkeypatch: pytest.MonkeyPatch, members: int, calls: int) -> None:
    width = 4_000
    data = torch_layout("archive", _set_of_one_tuple(width, members, calls))
    walked = _counting(monkeypatch)
    report = scan_bytes(data, name="x.pt")
    # T once (width + 1 calls), each member's hash a memo hit, T as a dict value not hashed
    assert walked[0] <= width + 1 + members * calls + 16, walked[0]
    visits = (width + 1) * members * calls
    if visits <= callables.HASH_VISITS_MAX:
        assert report.verdict == "safe" and report.weights_only.loadable, report.findings
    else:   # torch hashes T that many times: past the budget, Unmodelled, never `safe`
        assert report.verdict == "suspicious"
        assert report.weights_only.error_type == "Unmodelled"
        assert "tuple elements" in (report.weights_only.error or ""), report.weights_only


@pytest.mark.parametrize("calls", [50, 200])
def test_containers_copied_by_calls_are_charged(calls: int) -> None:
    """Counter(d) copies d when it is called (and the report holds that copy): one memoized
    10,000-key dict passed to 200 calls is 2 M items copied, torch's work and ours. They
    count against Limits.max_build_state_keys (1 M) with the OrderedDict BUILD states: past
    it, Unmodelled, as torch would take minutes at 100k calls. torch loads both files."""
    keys = b"".join(b"X" + len(f"k{i}").to_bytes(4, "little") + f"k{i}".encode() + b"K\x01"
                    for i in range(10_000))
    mapping = b"}q\x01(" + keys + b"u\x85q\x02"          # (d,) in memo 2
    more = b"".join(b"X" + len(f"c{i}").to_bytes(4, "little") + f"c{i}".encode()
                    + b"h\x03h\x02R" for i in range(1, calls))
    pkl = (b"\x80\x02}q\x00(X\x01\x00\x00\x00c" + b"ccollections\nCounter\nq\x03" + mapping + b"R"
           + more + b"u.")
    report = scan_bytes(torch_layout("archive", pkl), name="x.pt")
    if calls * 10_000 <= DEFAULT_LIMITS.max_build_state_keys:
        assert report.verdict == "safe" and report.weights_only.loadable, report.weights_only
        return
    assert report.weights_only.error_type == "Unmodelled", report.weights_only
    assert "call arguments" in (report.weights_only.error or "")
    assert report.verdict == "suspicious"


def test_one_container_copied_once_is_not_charged() -> None:
    """A set or Counter of many items is one copy, linear in the pickle (a review: a torch.save
    of a 1.1 M-item set was Unmodelled): only a container copied again is charged."""
    keys = b"".join(b"X" + len(f"k{i}").to_bytes(4, "little") + f"k{i}".encode() + b"K\x01"
                    for i in range(5_000))
    first = (b"\x80\x02}q\x00(X\x01\x00\x00\x00cccollections\nCounter\nq\x03}q\x01(" + keys
             + b"u\x85q\x02R")                                   # 'c': Counter(d)
    again = b"X\x01\x00\x00\x00dh\x03h\x02R"                      # 'd': Counter(d) again

    def verdict(pkl: bytes, cap: int) -> WeightsOnly:
        limits = records.replace(DEFAULT_LIMITS, max_build_state_keys=cap)
        return scan_bytes(torch_layout("archive", pkl), name="x.pt",
                          options=ScanOptions(limits=limits)).weights_only

    assert verdict(first + b"u.", 4_000).loadable                  # one copy of 5,000: free
    assert verdict(first + again + b"u.", 6_000).loadable          # the second: 5,000 charged
    assert verdict(first + again + b"u.", 4_000).error_type == "Unmodelled"
