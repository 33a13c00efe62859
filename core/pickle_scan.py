"""One pickle, judged twice: as torch's weights-only unpickler would load it, and as
Python's real pickle would execute it.

Strategy: `weights_only.emulate` replays torch 2.13's restricted unpickler and says
whether (and how) torch would refuse; it stops where torch stops. The symbolic VM
(`vm.run_vm`) then reads the WHOLE pickle with every opcode of every protocol, so the
globals and calls after torch's first refusal still reach the threat analysis
(`threats.assess`). Bytes after STOP are inspected for a second pickle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.analysis import Analysis
from core.errors import Code
from core.threats import assess
from core.vm import VmResult, run_vm
from core.weights_only import StorageResolver, StorageUse, WeightsOnlyResult, emulate


@dataclass(slots=True)
class PickleScan:
    weights_only: WeightsOnlyResult
    vm: VmResult
    root: Any                      # the graph the manifest is built from
    storages: list[StorageUse]     # persistent_load keys in first-encounter order
    end: int                       # relative position just after STOP


def scan_pickle(data: bytes | memoryview, an: Analysis, *, record: str | None,
                base_offset: int, resolver: StorageResolver | None = None,
                legacy: bool = False, start: int = 0,
                check_trailing: bool = True) -> PickleScan:
    """Emulate torch, run the VM, assess globals/calls; findings go into `an`."""
    opts = an.options
    view = memoryview(data)[start:] if start else data
    wo = emulate(view, allow=opts.allow, resolver=resolver, base_offset=base_offset + start,
                 limits=opts.limits, legacy=legacy)
    vm = run_vm(view, base_offset=base_offset + start, limits=opts.limits)
    assess(vm, an, allow=opts.allow, record=record)
    if vm.error is not None:
        exc = vm.error
        an.add(exc.code, exc.message, record=record, offset=exc.offset)
    if vm.protocol is not None and vm.protocol != 2:
        an.add(Code.PICKLE_PROTOCOL, f"pickle protocol {vm.protocol}", record=record,
               offset=base_offset + start)
    if check_trailing and vm.complete and vm.end < len(view):
        _inspect_trailing(view, vm.end, an, record=record, base_offset=base_offset + start)
    root = wo.root if wo.error is None else vm.root
    return PickleScan(wo, vm, root, wo.storages, start + (vm.end if vm.complete else wo.end))


def _inspect_trailing(data: bytes | memoryview, pos: int, an: Analysis, *, record: str | None,
                      base_offset: int) -> None:
    """Bytes after STOP: torch ignores them; another unpickler (or a later pickle.load on the
    same stream) might not. A second pickle there is a classic hiding place."""
    limits = an.options.limits
    for _ in range(limits.max_trailing_pickles):
        rest = len(data) - pos
        if rest <= 0:
            return
        nxt = run_vm(data, start=pos, base_offset=base_offset, limits=limits)
        if nxt.complete and nxt.globals or nxt.complete and nxt.opcode_count > 1:
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
