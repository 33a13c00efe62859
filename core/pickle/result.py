"""What one pickle did: the globals it named and what its interpretation found (`VmResult`).

The symbolic VM (core.pickle.vm) fills it opcode by opcode; the fast paths build it from
their opcode walk (core.pickle.fast.tokenize.global_uses); the threat analysis reads it. It
lives apart from the VM so that a fast path's result does not load the interpreter.
"""

from __future__ import annotations

from ckptguard.core.errors import CkptError, Code
from ckptguard.core.records import field, record
from ckptguard.core.values import Call, PersId

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any


@record(frozen=True, slots=True)
class GlobalUse:
    """One global reference made by the pickle (GLOBAL, STACK_GLOBAL or INST)."""

    module: str        # after CPython's fix_imports mapping (core.pickle.renames.python_map, proto<3)
    name: str
    raw_module: str    # as written in the pickle
    raw_name: str
    opcode: str        # "GLOBAL" | "STACK_GLOBAL" | "INST"
    offset: int        # absolute offset (base_offset + pos) of the opcode


@record(slots=True)
class VmResult:
    """What one pickle did, as far as it got."""

    root: Any = None                  # the value STOP returned (None if not reached)
    complete: bool = False            # reached STOP
    start: int = 0                    # relative position where this pickle began
    end: int = 0                      # relative position just after STOP (or where it failed)
    protocol: int | None = None       # from PROTO, None if absent
    opcode_count: int = 0
    opcodes_used: set[str] = field(default_factory=set)
    globals: list[GlobalUse] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)
    persids: list[PersId] = field(default_factory=list)
    notes: list[tuple[Code, str, int]] = field(default_factory=list)
    error: CkptError | None = None
