"""One pickle, judged twice: as torch's weights-only unpickler would load it, and as
Python's real pickle would execute it.

Strategy: a clean torch pickle (the common case) is proven clean by the C-speed
`fastpath`, which declines on anything unusual. Otherwise `weights_only.emulate`
replays torch 2.13's restricted unpickler and says whether (and how) torch would
refuse; it stops where torch stops. The symbolic VM (`vm.run_vm`) then reads the WHOLE
pickle with every opcode of every protocol, so the globals and calls after torch's
first refusal still reach the threat analysis (`threats.assess`). Bytes after STOP are
inspected for a second pickle.
"""

from __future__ import annotations

from ckptguard.core import records
from ckptguard.core.errors import Code, Decline, LimitExceeded
from ckptguard.core.pickle.result import VmResult
from ckptguard.core.pickle.vm import run_vm
from ckptguard.core.records import record
from ckptguard.core.state import Analysis
from ckptguard.core.threats.assess import assess
from ckptguard.core.torch.allowlist import allowed_checker, torch_split
from ckptguard.core.torch.dtypes import ITEMSIZE
from ckptguard.core.torch.rules import check_rebuild, check_storage_pid
from ckptguard.core.torch.weights_only import (
    StorageResolver,
    StorageUse,
    WeightsOnlyResult,
    emulate,
)
from ckptguard.core.values import PersId

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

    from ckptguard.core.pickle.fast.stubs import FastResult


@record(slots=True)
class PickleScan:
    weights_only: WeightsOnlyResult
    vm: VmResult
    root: Any                      # the graph the manifest is built from
    storages: list[StorageUse]     # persistent_load keys in first-encounter order
    end: int                       # relative position just after STOP
    fast: bool = False             # judged by the fast path


def scan_pickle(data: bytes | memoryview, an: Analysis, *, record: str | None,
                base_offset: int, resolver: StorageResolver | None = None,
                legacy: bool = False, start: int = 0,
                check_trailing: bool = True, persistent_load: bool = True) -> PickleScan:
    """Judge one pickle at data[start:]; findings and globals go into `an`.

    `persistent_load=False`: torch loads this pickle without its storage hook (see
    `weights_only.emulate`)."""
    opts = an.options
    view = bytes(memoryview(data)[start:]) if start else bytes(data)
    base = base_offset + start
    scan = None if not _fast_first(len(view), legacy, an.options.engine) else \
        _try_fast(view, an, resolver, base)
    if scan is None:
        wo = emulate(view, allow=opts.allow, resolver=resolver, base_offset=base,
                     limits=opts.limits, legacy=legacy, persistent_load=persistent_load)
        vm = run_vm(view, base_offset=base, limits=opts.limits, node_name=torch_split)
        root = wo.root if wo.error is None else vm.root
        end = vm.end if vm.complete else wo.end
        scan = PickleScan(wo, vm, root, wo.storages, end)
    vm = scan.vm
    assess(vm, an, allow=opts.allow, record=record)
    if vm.error is not None:
        exc = vm.error
        an.add(exc.code, exc.message, record=record, offset=exc.offset)
    if vm.protocol is not None and vm.protocol != 2:
        an.add(Code.PICKLE_PROTOCOL, f"pickle protocol {vm.protocol}", record=record, offset=base)
    if check_trailing and vm.complete and vm.end < len(view):
        _inspect_trailing(view, vm.end, an, record=record, base_offset=base)
    # the report's size budget counts the pickles judged (core.reportsize.report_budget)
    an.io["pickle_bytes"] = an.io.get("pickle_bytes", 0) + (scan.end if vm.complete else len(view))
    scan.end += start
    return scan


# Under "auto", a pickle this small goes straight to the exact interpreters: they judge it in
# about a millisecond, while the fast path first compiles its opcode walk (~11 ms, once per
# process), which a command-line scan of one small file would pay for nothing. The engines
# agree (tests/agreement, where "general" still sends every pickle to the fast path first).
SMALL_PICKLE_BYTES = 4096


def _fast_first(size: int, legacy: bool, engine: str) -> bool:
    if legacy or engine == "exact":
        return False
    return engine == "general" or size >= SMALL_PICKLE_BYTES


def _try_fast(data: bytes, an: Analysis, resolver: StorageResolver | None,
              base_offset: int) -> PickleScan | None:
    """The fast path's answer, or None when it declines (then the exact path runs)."""
    from ckptguard.core.pickle.fast.stubs import fast_load  # not on a small pickle's path

    storages: dict[str, StorageUse] = {}

    def check_pid(pid: tuple[Any, ...]) -> None:
        st, key, location, numel, dtype = check_storage_pid(pid)
        nbytes = numel * ITEMSIZE[dtype]
        prev = storages.get(key)
        if prev is not None:
            if (prev.storage_type, prev.numel) != (st.full, numel):
                raise Decline(f"storage {key!r} re-declared differently")
            return
        if resolver is not None and resolver.check(key, nbytes) is not None:
            raise Decline(f"storage {key!r} does not match its record")
        storages[key] = StorageUse(key=key, storage_type=st.full, dtype=dtype, numel=numel,
                                   nbytes=nbytes, location=location, offset=-1)

    def storage_info(p: PersId) -> tuple[str, int] | None:
        use = storages.get(p.pid[2])
        return (use.dtype, use.nbytes) if use is not None else None

    def check_call(full: str, args: tuple[Any, ...]) -> str | None:
        return check_rebuild(full, args, storage_info)

    try:
        fast = fast_load(data, allowed=allowed_checker(an.options.allow), check_pid=check_pid,
                         check_call=check_call, limits=an.options.limits)
    except Decline:
        return None
    return _as_scan(fast, list(storages.values()), base_offset)


def _as_scan(fast: FastResult, storages: list[StorageUse], base_offset: int) -> PickleScan:
    from ckptguard.core.pickle.fast.tokenize import global_uses  # loaded by fast_load already

    toks = fast.tokens
    uses = global_uses(toks, base_offset)
    # No calls for the threat analysis: every global is allowlisted and every call is a
    # rebuild whose arguments fastpath.check_rebuild accepted, so there is nothing to find.
    vm = VmResult(root=fast.root, complete=True, start=0, end=toks.end, protocol=toks.protocol,
                  globals=uses, calls=[], persids=fast.persids)
    wo = WeightsOnlyResult(loadable=True, error=None, root=fast.root, storages=storages,
                           end=toks.end, protocol=toks.protocol)
    return PickleScan(wo, vm, fast.root, storages, toks.end, fast=True)


def _inspect_trailing(data: bytes, pos: int, an: Analysis, *, record: str | None,
                      base_offset: int) -> None:
    """Bytes after STOP: torch ignores them; another unpickler (or a later pickle.load on the
    same stream) might not. A second pickle there is a classic hiding place."""
    limits = an.options.limits
    # one opcode budget for all of them: 16 pickles of 50 M opcodes each fit in 500 KB
    left = limits.max_opcodes
    for _ in range(limits.max_trailing_pickles):
        rest = len(data) - pos
        if rest <= 0:
            return
        if left <= 0:
            an.add(Code.LIMIT_OPCODES, f"the pickles after STOP run past {limits.max_opcodes} "
                   "opcodes together", record=record, offset=base_offset + pos)
            return
        nxt = run_vm(data, start=pos, base_offset=base_offset,
                     limits=records.replace(limits, max_opcodes=left))
        left -= nxt.opcode_count
        if isinstance(nxt.error, LimitExceeded):   # fail closed: not judged is not clean
            message = (f"the pickles after STOP run past {limits.max_opcodes} opcodes together"
                       if nxt.error.code == Code.LIMIT_OPCODES else nxt.error.message)
            an.add(nxt.error.code, message, record=record, offset=nxt.error.offset)
            if nxt.globals:
                assess(nxt, an, allow=an.options.allow, record=record)
            return
        if nxt.complete and (nxt.globals or nxt.opcode_count > 1):
            an.add(Code.PICKLE_SECOND_PICKLE,
                   f"a second pickle ({nxt.opcode_count} opcodes) follows STOP",
                   record=record, offset=base_offset + pos)
            assess(nxt, an, allow=an.options.allow, record=record)
            pos = nxt.end
            continue
        if nxt.globals:  # an incomplete stream that still names globals: judge them
            assess(nxt, an, allow=an.options.allow, record=record)
        an.add(Code.PICKLE_TRAILING_DATA, f"{rest} bytes after STOP", record=record,
               offset=base_offset + pos)
        return
