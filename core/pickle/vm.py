"""The symbolic pickle VM: every opcode of protocols 0-5, nothing imported or called.

Strategy: CPython's `pickle._Unpickler` is the reference; each opcode does what it does
there, except that GLOBAL/STACK_GLOBAL/INST push a `Global` (two strings), the calls
(REDUCE, NEWOBJ, NEWOBJ_EX, INST, OBJ) push a `Call`, and BINPERSID/PERSID push a `PersId`.
Every global, call and persistent id is also logged in the result, in order, so the
threat analysis sees them even when the pickle is truncated or malformed later on:
`run_vm` never raises for any bytes; the first fatal problem ends interpretation and is
returned in `VmResult.error`.

Speed (bench/vm_bench.py: data.pkl of a 100k-tensor state_dict, 3.0 M opcodes): the loop
is pickle.py's — a 256-entry dispatch list of closures over bound locals, precompiled
`struct.Struct`s — plus three tricks: limits are checked in chunks (the stack grows by
at most one item per opcode, so the next check is due only when it could overflow); an
opcode's first execution swaps its "record as used" wrapper out of the dispatch list;
the cyclic GC is paused while the graph grows (it halved the time). The stack is one
flat list with MARK positions in `marks` (like _pickle.c).

Memory and time are bounded by `Limits`: declared lengths are checked against the cap and
the remaining bytes before slicing; the memo is a dict (a LONG_BINPUT index of 2**32-16
costs one entry); deep nesting never recurses (hashing a 100k-deep tuple would crash
CPython, so such dict keys are wrapped in `Unhashable`).

    r = run_vm(b"\\x80\\x02cos\\nsystem\\nX\\x02\\x00\\x00\\x00id\\x85R.")
    r.globals[0].module, r.globals[0].name        -> ("os", "system")
    r.calls[0].func, r.calls[0].args              -> Global(os.system), ("id",)
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from functools import partial

from ckptguard.core.errors import CkptError, Code, FormatError, LimitExceeded
from ckptguard.core.gcpause import collector_paused
from ckptguard.core.limits import DEFAULT_LIMITS, Limits
from ckptguard.core.pickle.frames import file_reader_view, frame_divergence
from ckptguard.core.pickle.opcodes import (
    OPCODES,
    decode_float_line,
    decode_index_line,
    decode_int_line,
    decode_long_line,
    decode_py2_str,
    decode_string_line,
    decode_unicode_line,
)
from ckptguard.core.pickle.renames import python_map
from ckptguard.core.pickle.result import GlobalUse, VmResult
from ckptguard.core.records import replace
from ckptguard.core.values import Buffer, Call, ExtRef, Global, PersId, Unhashable

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

    from ckptguard.core.pickle.fold import FoldBudget

__all__ = ["run_vm"]

_U16 = struct.Struct("<H").unpack_from
_I32 = struct.Struct("<i").unpack_from
_U32 = struct.Struct("<I").unpack_from
_U64 = struct.Struct("<Q").unpack_from
_F64 = struct.Struct(">d").unpack_from   # BINFLOAT is big-endian (FORMATS.md §2.1)

# A dotted Python identifier (ASCII); anything else is worth a note.
DOTTED_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# Dict keys / set members beyond these are not hashed (see hashable_key).
_MAX_KEY_DEPTH = 200
_MAX_KEY_NODES = 10_000
# (all keys of one pickle together: Limits.max_key_nodes)
_MAX_KEY_INT_BITS = 65_536


NodeName = Callable[[str, str], tuple[str, str]]


class _Stop(Exception):
    """STOP reached (raised once, so the loop needs no per-opcode test)."""


def run_vm(data: bytes | memoryview, *, start: int = 0, base_offset: int = 0,
           limits: Limits = DEFAULT_LIMITS, node_name: NodeName | None = None) -> VmResult:
    """Interpret the pickle at `data[start:]` symbolically; never raises for any bytes.

    `node_name` names each global's node (module, name) from pickle's mapped names: the
    judge passes the torch layer's `torch_split`, so the manifest reads a dotted path torch
    allowlists as torch finds it; the recorded globals keep pickle's names either way.

    >>> r = run_vm(b"cos\\nsystem\\n(S'id'\\ntR.")
    >>> r.complete, r.globals[0].module, r.calls[0].args
    (True, 'os', ('id',))
    """
    if start < 0:
        raise ValueError("start must be >= 0")
    buf = data if isinstance(data, bytes) else bytes(data)
    # The cyclic GC would rescan the growing graph again and again (half the run time on
    # the bench); the graph is only garbage once the result is dropped, so pause it.
    with collector_paused():
        return _Machine(buf, start, base_offset, limits, node_name).run()


def describe(value: Any) -> str:
    """A short, safe text for a value of any shape (repr() could recurse or be huge)."""
    t = type(value)
    if t is int and value.bit_length() > 256:
        return f"<int of {value.bit_length()} bits>"
    if t in (int, float, bool) or value is None:
        return repr(value)
    if t in (str, bytes, bytearray):
        return repr(value[:100]) + ("..." if len(value) > 100 else "")
    if t is Global:
        return f"<global {value.full}>"
    return f"<{t.__name__}>"


def hashable_key(value: Any, budget: list[int] | None = None) -> Any:
    """`value` if it can be a dict key / set member cheaply, else `Unhashable(value)`.

    CPython hashes tuples recursively and uncached (a 1M-deep tuple crashes it; a tuple
    DAG built with DUP TUPLE2 takes 2**depth steps) and big ints in linear time, again on
    every insertion: such keys are wrapped instead of hashed. `budget` ([tuple nodes
    left]) is shared by every key of one pickle; a tuple key past it is wrapped too.
    """
    t = type(value)
    if t is str or t is bytes or t is float or value is None or t is bool:
        return value        # str/bytes cache their hash
    if t is int:
        return value if value.bit_length() <= _MAX_KEY_INT_BITS else Unhashable(value)
    if t is list or t is dict or t is set or t is bytearray:
        return Unhashable(value)
    if t is not tuple:
        return value        # Global hashes two strs; other nodes by id; frozenset caches its hash
    todo: list[tuple[tuple[Any, ...], int]] = [(value, 1)]
    left = _MAX_KEY_NODES if budget is None else min(_MAX_KEY_NODES, budget[0])
    nodes = 0
    while todo:
        tup, depth = todo.pop()
        nodes += len(tup) + 1
        if depth > _MAX_KEY_DEPTH or nodes > left:
            return Unhashable(value)
        for item in tup:
            it = type(item)
            if it is tuple:
                todo.append((item, depth + 1))
            elif it is list or it is dict or it is set or it is bytearray or (
                    it is int and item.bit_length() > _MAX_KEY_INT_BITS):
                return Unhashable(value)
    if budget is not None:
        budget[0] -= nodes
    return value


def _unlink(functions: list[Callable[[int], int]]) -> None:
    """Empty the closure cells of the handlers and of every function they reach.

    The handlers refer to each other and to the machine through their cells: reference
    cycles, so a finished machine (its buffer, memo and stack) would wait for the cyclic
    GC, which a scan pauses. A legacy tar of 90k items ran 90k machines: 9.8 GB.
    """
    todo: list[Any] = list(functions)
    done: set[int] = set()
    while todo:
        fn = todo.pop()
        if id(fn) in done:
            continue
        done.add(id(fn))
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                inner = cell.cell_contents
            except ValueError:   # an empty cell
                continue
            if callable(inner) and hasattr(inner, "__closure__"):
                todo.append(inner)
            cell.cell_contents = None


class _Machine:
    """State of one interpretation; `run` is the loop, `_dispatch` builds the handlers."""

    def __init__(self, data: bytes, start: int, base_offset: int, limits: Limits,
                 node_name: NodeName | None = None) -> None:
        self.node_name = node_name
        self.data = data
        self.start = start
        self.base = base_offset
        self.limits = limits
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.memo: dict[int, Any] = {}
        self.proto = 0                 # pickle.py's default before any PROTO
        self.dotted: dict[str, bool] = {}
        self.fold_budget: FoldBudget | None = None   # made by the first computed global
        self.frames: list[tuple[int, int, int]] = []    # (FRAME opcode, frame start, end)
        self.result = VmResult(start=start, end=start)

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> VmResult:
        res = self.result
        data = self.data
        n = len(data)
        stack = self.stack
        dispatch = self._dispatch()
        max_ops = self.limits.max_opcodes
        max_stack = self.limits.max_stack
        pos = self.start
        count = 0
        i = -1
        try:
            while True:
                i = -1              # a limit raised here is not an executed opcode
                if len(stack) > max_stack:
                    raise LimitExceeded(Code.LIMIT_CONTAINER, f"pickle stack over {max_stack} items",
                                        offset=self.base + pos)
                if count >= max_ops:
                    raise LimitExceeded(Code.LIMIT_OPCODES, f"more than {max_ops} opcodes",
                                        offset=self.base + pos)
                # Each opcode grows the stack by at most one item: no check is due before this.
                chunk = min(max_ops - count, max_stack - len(stack) + 1)
                for i in range(chunk):  # noqa: B007 - i is read after an exception
                    pos = dispatch[data[pos]](pos + 1)
                count += chunk
        except _Stop:
            res.complete = True
            count += i + 1
        except CkptError as exc:
            count += i + 1
            res.error = exc.with_traceback(None)   # its frames would hold the machine
        except MemoryError:
            # the worker's address-space limit: a resource verdict, not a malformed pickle
            count += i + 1
            res.error = LimitExceeded(Code.RESOURCE_LIMIT, "out of memory interpreting the pickle",
                                      offset=self.base + pos)
        except Exception as exc:  # any bytes -> a result (hard rule 2)
            count += i + 1
            res.error = self._classify(exc, pos, n)
        if not res.complete:
            res.end = pos
        res.opcode_count = count
        if self.frames:
            diverges = frame_divergence(data, self.frames)
            if diverges is not None:
                self.note(Code.PICKLE_FRAME_DIVERGENCE, diverges[1], diverges[0])
                self._add_hidden(data)
        _unlink(dispatch)
        return res

    def _add_hidden(self, data: bytes) -> None:
        """What pickle.load(file) runs past a frame divergence (core.pickle.frames): its
        globals, calls and notes join this result at their file offsets, so the threat
        analysis judges the hidden opcodes too."""
        view = file_reader_view(data, self.start)
        if view is None:
            return
        hidden = run_vm(view.data, limits=self.limits, node_name=self.node_name)
        res, at = self.result, view.diverges_at

        def where(pos: int) -> int:
            return self.base + view.file_offset(pos)

        res.globals += [replace(g, offset=where(g.offset)) for g in hidden.globals
                        if g.offset >= at]
        for call in hidden.calls:
            if call.offset >= at:
                call.offset = where(call.offset)
                res.calls.append(call)
        res.notes += [(code, f"{msg} (in what pickle.load(file) reads)", where(off))
                      for code, msg, off in hidden.notes if off >= at]

    def _classify(self, exc: Exception, pos: int, n: int) -> CkptError:
        """Turn a Python exception raised by a handler at opcode `pos` into a CkptError."""
        off = self.base + pos
        if pos >= n:
            return FormatError(Code.PICKLE_TRUNCATED, "the pickle ends before STOP", offset=off)
        info = OPCODES[self.data[pos]]
        if isinstance(exc, struct.error) or (
                isinstance(exc, IndexError) and info is not None and info.fixed_size is not None
                and pos + 1 + info.fixed_size > n):
            return FormatError(Code.PICKLE_TRUNCATED, f"{info.name if info else '?'} argument past end",
                               offset=off)
        name = info.name if info else f"0x{self.data[pos]:02x}"
        if isinstance(exc, KeyError):
            return FormatError(Code.PICKLE_MALFORMED, f"{name}: memo key {exc} not found", offset=off)
        if isinstance(exc, IndexError):
            return FormatError(Code.PICKLE_MALFORMED, f"{name}: stack underflow", offset=off)
        msg = str(exc)[:200]
        return FormatError(Code.PICKLE_MALFORMED, f"{name}: {type(exc).__name__}: {msg}", offset=off)

    # -- rare paths, shared by handlers ---------------------------------------------------
    def note(self, code: Code, message: str, pos: int) -> None:
        notes = self.result.notes
        if len(notes) < self.limits.max_vm_notes:
            notes.append((code, message, self.base + pos))
        elif len(notes) == self.limits.max_vm_notes:
            notes.append((code, f"more notes after this one were not recorded: {message}", self.base + pos))

    def add_global(self, raw_module: str, raw_name: str, opcode: str, pos: int) -> Global:
        """Record a global reference made at opcode position `pos` and return its node."""
        if not (self.is_dotted(raw_module) and self.is_dotted(raw_name)):
            self.note(Code.PICKLE_NON_ASCII_GLOBAL,
                      f"{opcode} {raw_module[:100]!r} {raw_name[:100]!r} is not a dotted identifier", pos)
        module, name = python_map(raw_module, raw_name, self.proto)
        self.result.globals.append(GlobalUse(module, name, raw_module, raw_name, opcode, self.base + pos))
        return Global(*self.node_name(module, name)) if self.node_name else Global(module, name)

    def computed_global(self, module: Any, name: Any, pos: int) -> tuple[str, str]:
        """STACK_GLOBAL operands that are not literal strings: fold what pure calls compute
        (core.pickle.fold) so the global is judged as if written; a call result that cannot
        be folded is an unresolvable import (evasion), plain non-str data an error pickle
        raises ("STACK_GLOBAL requires str") before importing anything."""
        # rare (no benign pickle computes a global): the folder is imported here, not at start
        from ckptguard.core.pickle.fold import FoldBudget, Unfoldable, fold, is_computed, render

        if self.fold_budget is None:
            self.fold_budget = FoldBudget(self.limits.max_fold_steps)
        out: list[str] = []
        folded: list[str] = []
        resolved = True
        for label, value in (("module", module), ("name", name)):
            if type(value) is str:
                out.append(value)
                continue
            shown = render(value)
            if not is_computed(value):
                self.note(Code.PICKLE_NON_ASCII_GLOBAL,
                          f"STACK_GLOBAL {label} is {describe(value)}, not str (pickle refuses it)", pos)
                out.append(describe(value))
                continue
            try:
                const = fold(value, limits=self.limits, budget=self.fold_budget,
                             calls=self.result.calls, live=(self.stack, self.memo.values()))
            except Unfoldable as exc:
                self.note(Code.PICKLE_COMPUTED_IMPORT,
                          f"STACK_GLOBAL {label} is computed by {shown}, which cannot be resolved "
                          f"statically ({exc}): an import hidden from scanners", pos)
                out.append(f"<computed {label}>")
                resolved = False
                continue
            if type(const) is not str:
                self.note(Code.PICKLE_NON_ASCII_GLOBAL, f"STACK_GLOBAL {label} {shown} computes "
                          f"{describe(const)}, not str (pickle refuses it)", pos)
                out.append(describe(const))
                resolved = False
                continue
            out.append(const)
            folded.append(f"{label} {shown} = {const[:100]!r}")
        if folded and resolved:
            self.note(Code.PICKLE_COMPUTED_GLOBAL, f"STACK_GLOBAL {'; '.join(folded)}: resolved "
                      f"to {out[0][:100]}.{out[1][:100]}", pos)
        return out[0], out[1]

    def is_dotted(self, text: str) -> bool:
        # Cached, and length first: a memo'd long "identifier" must not be rescanned at every use.
        ok = self.dotted.get(text)
        if ok is None:
            ok = self.dotted[text] = len(text) <= 1000 and DOTTED_NAME.fullmatch(text) is not None
        return ok

    def decode_name(self, raw: bytes, encoding: str, opcode: str, pos: int) -> str:
        """GLOBAL decodes its lines as UTF-8, INST as ASCII; undecodable ones get a note."""
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError:
            self.note(Code.PICKLE_NON_ASCII_GLOBAL, f"{opcode} name is not {encoding}", pos)
            return raw.decode("utf-8", "backslashreplace")

    # -- the handlers -----------------------------------------------------------------------
    def _dispatch(self) -> list[Callable[[int], int]]:
        """A 256-entry list: opcode byte -> handler(pos after opcode) -> pos after argument."""
        vm = self
        res = self.result
        data = self.data
        n = len(data)
        find = data.find
        stack = self.stack
        push = stack.append
        pop = stack.pop
        marks = self.marks
        memo = self.memo
        calls = res.calls
        persids = res.persids
        base = self.base
        lim = self.limits
        max_str = lim.max_str_bytes
        max_items = lim.max_container_items
        max_depth = lim.max_depth
        max_memo = lim.max_memo_entries
        key = partial(hashable_key, budget=[lim.max_key_nodes])

        def check_len(pos: int, hdr: int, size: int, what: str) -> None:
            # Hard rule 2: bound a declared length against the cap and the data before slicing.
            # `pos` follows the opcode byte, the payload follows an `hdr`-byte length field.
            if size > max_str:
                raise LimitExceeded(Code.LIMIT_STRING, f"{what} of {size} bytes", offset=base + pos - 1)
            if pos + hdr + size > n:
                raise FormatError(Code.PICKLE_TRUNCATED, f"{what} of {size} bytes runs past the end",
                                  offset=base + pos - 1)

        def readline(pos: int, op_pos: int) -> int:
            """Index of the newline ending the text argument at `pos` of the opcode at `op_pos`."""
            end = find(b"\n", pos)
            if end < 0:
                raise FormatError(Code.PICKLE_TRUNCATED, "text argument without newline",
                                  offset=base + op_pos)
            if end - pos > max_str:
                raise LimitExceeded(Code.LIMIT_STRING, f"text argument of {end - pos} bytes",
                                    offset=base + op_pos)
            return end

        def pop_mark(pos: int) -> list[Any]:
            if not marks:
                raise FormatError(Code.PICKLE_MALFORMED, "MARK expected on the stack", offset=base + pos - 1)
            k = marks.pop()
            if k > len(stack):
                raise FormatError(Code.PICKLE_MALFORMED, "stack underflow below MARK", offset=base + pos - 1)
            items = stack[k:]
            del stack[k:]
            return items

        def too_big(pos: int, size: int) -> LimitExceeded:
            return LimitExceeded(Code.LIMIT_CONTAINER, f"container of {size} items", offset=base + pos - 1)

        def put(pos: int, idx: int) -> None:
            if len(memo) >= max_memo and idx not in memo:
                raise LimitExceeded(Code.LIMIT_MEMO, f"more than {max_memo} memo entries",
                                    offset=base + pos - 1)
            memo[idx] = stack[-1]

        def mutated(obj: Global | ExtRef, opcode: str, pos: int) -> None:
            # Real pickle would change the imported object itself: no Call shows it.
            what = obj.full if type(obj) is Global else f"extension code {obj.code}"  # type: ignore[union-attr]
            vm.note(Code.PICKLE_GLOBAL_MUTATION, f"{opcode} on {what}", pos - 1)

        # ---- stack and mark ----
        def op_mark(pos: int) -> int:
            marks.append(len(stack))
            if len(marks) > max_depth:
                raise LimitExceeded(Code.LIMIT_DEPTH, f"MARK nesting over {max_depth}", offset=base + pos - 1)
            return pos

        def op_stop(pos: int) -> int:
            res.root = pop()
            res.end = pos
            raise _Stop

        def op_pop(pos: int) -> int:
            if marks and marks[-1] >= len(stack):
                marks.pop()     # pickle.load_pop: an empty frame pops its MARK
            else:
                pop()
            return pos

        def op_pop_mark(pos: int) -> int:
            pop_mark(pos)
            return pos

        def op_dup(pos: int) -> int:
            push(stack[-1])
            return pos

        # ---- constants and numbers ----
        def op_none(pos: int) -> int:
            push(None)
            return pos

        def op_newtrue(pos: int) -> int:
            push(True)
            return pos

        def op_newfalse(pos: int) -> int:
            push(False)
            return pos

        def op_binint(pos: int) -> int:
            push(_I32(data, pos)[0])
            return pos + 4

        def op_binint1(pos: int) -> int:
            push(data[pos])
            return pos + 1

        def op_binint2(pos: int) -> int:
            push(_U16(data, pos)[0])
            return pos + 2

        def op_long1(pos: int) -> int:
            size = data[pos]
            check_len(pos, 1, size, "LONG1")
            push(int.from_bytes(data[pos + 1:pos + 1 + size], "little", signed=True))
            return pos + 1 + size

        def op_long4(pos: int) -> int:
            size: int = _I32(data, pos)[0]
            if size < 0:
                raise FormatError(Code.PICKLE_MALFORMED, "LONG4 with negative byte count",
                                  offset=base + pos - 1)
            check_len(pos, 4, size, "LONG4")
            push(int.from_bytes(data[pos + 4:pos + 4 + size], "little", signed=True))
            return pos + 4 + size

        def op_binfloat(pos: int) -> int:
            push(_F64(data, pos)[0])
            return pos + 8

        def op_int(pos: int) -> int:
            end = readline(pos, pos - 1)
            push(decode_int_line(data[pos:end], offset=base + pos - 1))
            return end + 1

        def op_long(pos: int) -> int:
            end = readline(pos, pos - 1)
            push(decode_long_line(data[pos:end], offset=base + pos - 1))
            return end + 1

        def op_float(pos: int) -> int:
            end = readline(pos, pos - 1)
            push(decode_float_line(data[pos:end], offset=base + pos - 1))
            return end + 1

        # ---- strings and bytes ----
        def op_string(pos: int) -> int:
            end = readline(pos, pos - 1)
            push(decode_string_line(data[pos:end], offset=base + pos - 1))
            return end + 1

        def op_binstring(pos: int) -> int:
            size: int = _I32(data, pos)[0]
            if size < 0:
                raise FormatError(Code.PICKLE_MALFORMED, "BINSTRING with negative length",
                                  offset=base + pos - 1)
            check_len(pos, 4, size, "BINSTRING")
            push(decode_py2_str(data[pos + 4:pos + 4 + size]))
            return pos + 4 + size

        def op_short_binstring(pos: int) -> int:
            size = data[pos]
            check_len(pos, 1, size, "SHORT_BINSTRING")
            push(decode_py2_str(data[pos + 1:pos + 1 + size]))
            return pos + 1 + size

        def op_short_binbytes(pos: int) -> int:
            size = data[pos]
            check_len(pos, 1, size, "SHORT_BINBYTES")
            push(data[pos + 1:pos + 1 + size])
            return pos + 1 + size

        def op_binbytes(pos: int) -> int:
            size: int = _U32(data, pos)[0]
            check_len(pos, 4, size, "BINBYTES")
            push(data[pos + 4:pos + 4 + size])
            return pos + 4 + size

        def op_binbytes8(pos: int) -> int:
            size: int = _U64(data, pos)[0]
            check_len(pos, 8, size, "BINBYTES8")
            push(data[pos + 8:pos + 8 + size])
            return pos + 8 + size

        def op_bytearray8(pos: int) -> int:
            size: int = _U64(data, pos)[0]
            check_len(pos, 8, size, "BYTEARRAY8")
            push(bytearray(data[pos + 8:pos + 8 + size]))
            return pos + 8 + size

        def op_unicode(pos: int) -> int:
            end = readline(pos, pos - 1)
            push(decode_unicode_line(data[pos:end], offset=base + pos - 1))
            return end + 1

        def op_short_binunicode(pos: int) -> int:
            size = data[pos]
            check_len(pos, 1, size, "SHORT_BINUNICODE")
            push(str(data[pos + 1:pos + 1 + size], "utf-8", "surrogatepass"))
            return pos + 1 + size

        def op_binunicode(pos: int) -> int:
            size: int = _U32(data, pos)[0]
            end = pos + 4 + size
            if end > n or size > max_str:
                check_len(pos, 4, size, "BINUNICODE")
            push(str(data[pos + 4:end], "utf-8", "surrogatepass"))
            return end

        def op_binunicode8(pos: int) -> int:
            size: int = _U64(data, pos)[0]
            check_len(pos, 8, size, "BINUNICODE8")
            push(str(data[pos + 8:pos + 8 + size], "utf-8", "surrogatepass"))
            return pos + 8 + size

        # ---- containers ----
        def op_empty_list(pos: int) -> int:
            push([])
            return pos

        def op_empty_tuple(pos: int) -> int:
            push(())
            return pos

        def op_empty_dict(pos: int) -> int:
            push({})
            return pos

        def op_empty_set(pos: int) -> int:
            push(set())
            return pos

        def op_list(pos: int) -> int:
            push(pop_mark(pos))
            return pos

        def op_tuple(pos: int) -> int:
            if marks and marks[-1] <= len(stack):      # pop_mark() inlined for the common case
                k = marks.pop()
                items = tuple(stack[k:])
                del stack[k:]
                push(items)
            else:
                push(tuple(pop_mark(pos)))
            return pos

        def op_tuple1(pos: int) -> int:
            stack[-1] = (stack[-1],)
            return pos

        def op_tuple2(pos: int) -> int:
            b = pop()
            stack[-1] = (stack[-1], b)
            return pos

        def op_tuple3(pos: int) -> int:
            c = pop()
            b = pop()
            stack[-1] = (stack[-1], b, c)
            return pos

        def set_pairs(obj: dict[Any, Any], items: list[Any], pos: int, what: str) -> None:
            if len(items) % 2:
                raise FormatError(Code.PICKLE_MALFORMED, f"odd number of items for {what}",
                                  offset=base + pos - 1)
            for j in range(0, len(items), 2):
                k = items[j]
                obj[k if type(k) is str else key(k)] = items[j + 1]
            if len(obj) > max_items:
                raise too_big(pos, len(obj))

        def op_dict(pos: int) -> int:
            d: dict[Any, Any] = {}
            set_pairs(d, pop_mark(pos), pos, "DICT")
            push(d)
            return pos

        def op_frozenset(pos: int) -> int:
            push(frozenset([key(x) for x in pop_mark(pos)]))
            return pos

        def op_append(pos: int) -> int:
            value = pop()
            obj = stack[-1]
            t = type(obj)
            if t is list:
                if len(obj) >= max_items:
                    raise too_big(pos, len(obj) + 1)
                obj.append(value)
            elif t is Call:
                obj.appends.append(value)
            elif t is Global or t is ExtRef:
                mutated(obj, "APPEND", pos)
            return pos

        def op_appends(pos: int) -> int:
            items = pop_mark(pos)
            obj = stack[-1]
            t = type(obj)
            if t is list:
                obj.extend(items)
                if len(obj) > max_items:
                    raise too_big(pos, len(obj))
            elif t is Call:
                obj.appends.extend(items)
            elif t is Global or t is ExtRef:
                mutated(obj, "APPENDS", pos)
            return pos

        def op_setitem(pos: int) -> int:
            value = pop()
            k = pop()
            obj = stack[-1]
            t = type(obj)
            if t is dict:
                if len(obj) >= max_items:
                    raise too_big(pos, len(obj) + 1)
                obj[k if type(k) is str else key(k)] = value
            elif t is Call:
                obj.setitems.append((k, value))
            elif t is Global or t is ExtRef:
                mutated(obj, "SETITEM", pos)
            return pos

        def op_setitems(pos: int) -> int:
            items = pop_mark(pos)
            obj = stack[-1]
            t = type(obj)
            if t is dict:
                set_pairs(obj, items, pos, "SETITEMS")
            elif t is Call:
                if len(items) % 2:
                    raise FormatError(Code.PICKLE_MALFORMED, "odd number of items for SETITEMS",
                                      offset=base + pos - 1)
                obj.setitems.extend(zip(items[::2], items[1::2], strict=True))
            elif t is Global or t is ExtRef:
                mutated(obj, "SETITEMS", pos)
            return pos

        def op_additems(pos: int) -> int:
            items = pop_mark(pos)
            obj = stack[-1]
            t = type(obj)
            if t is set:
                obj.update([key(x) for x in items])
                if len(obj) > max_items:
                    raise too_big(pos, len(obj))
            elif t is Call:
                obj.appends.extend(items)
            elif t is Global or t is ExtRef:
                mutated(obj, "ADDITEMS", pos)
            return pos

        # ---- memo ----
        def op_binput(pos: int) -> int:
            if len(memo) >= max_memo:
                put(pos, data[pos])
            else:
                memo[data[pos]] = stack[-1]
            return pos + 1

        def op_long_binput(pos: int) -> int:
            # the most frequent opcode of torch's data.pkl: put() inlined (bench note atop)
            if len(memo) >= max_memo:
                put(pos, _U32(data, pos)[0])
            else:
                memo[_U32(data, pos)[0]] = stack[-1]
            return pos + 4

        def op_put(pos: int) -> int:
            end = readline(pos, pos - 1)
            put(pos, decode_index_line(data[pos:end], offset=base + pos - 1))
            return end + 1

        def op_memoize(pos: int) -> int:
            put(pos, len(memo))
            return pos

        def op_binget(pos: int) -> int:
            push(memo[data[pos]])
            return pos + 1

        def op_long_binget(pos: int) -> int:
            push(memo[_U32(data, pos)[0]])
            return pos + 4

        def op_get(pos: int) -> int:
            end = readline(pos, pos - 1)
            push(memo[decode_index_line(data[pos:end], offset=base + pos - 1)])
            return end + 1

        # ---- globals, calls, persistent ids ----
        def op_global(pos: int) -> int:
            mid = readline(pos, pos - 1)
            end = readline(mid + 1, pos - 1)
            module = vm.decode_name(data[pos:mid], "utf-8", "GLOBAL", pos - 1)
            name = vm.decode_name(data[mid + 1:end], "utf-8", "GLOBAL", pos - 1)
            push(vm.add_global(module, name, "GLOBAL", pos - 1))
            return end + 1

        def op_stack_global(pos: int) -> int:
            name = pop()
            module = pop()
            if type(module) is not str or type(name) is not str:
                module, name = vm.computed_global(module, name, pos - 1)
            push(vm.add_global(module, name, "STACK_GLOBAL", pos - 1))
            return pos

        def op_inst(pos: int) -> int:
            mid = readline(pos, pos - 1)
            end = readline(mid + 1, pos - 1)
            module = vm.decode_name(data[pos:mid], "ascii", "INST", pos - 1)
            name = vm.decode_name(data[mid + 1:end], "ascii", "INST", pos - 1)
            args = tuple(pop_mark(pos))
            func = vm.add_global(module, name, "INST", pos - 1)
            call = Call(func, args, "INST", base + pos - 1)
            calls.append(call)
            push(call)
            return end + 1

        def op_obj(pos: int) -> int:
            items = pop_mark(pos)
            if not items:
                raise FormatError(Code.PICKLE_MALFORMED, "OBJ without a class", offset=base + pos - 1)
            call = Call(items[0], tuple(items[1:]), "OBJ", base + pos - 1)
            calls.append(call)
            push(call)
            return pos

        def op_newobj(pos: int) -> int:
            args = pop()
            call = Call(stack[-1], args, "NEWOBJ", base + pos - 1)
            calls.append(call)
            stack[-1] = call
            return pos

        def op_newobj_ex(pos: int) -> int:
            kwargs = pop()
            args = pop()
            call = Call(stack[-1], args, "NEWOBJ_EX", base + pos - 1, kwargs)
            calls.append(call)
            stack[-1] = call
            return pos

        def op_reduce(pos: int) -> int:
            args = pop()
            call = Call(stack[-1], args, "REDUCE", base + pos - 1)
            calls.append(call)
            stack[-1] = call
            return pos

        def op_build(pos: int) -> int:
            state = pop()
            obj = stack[-1]
            t = type(obj)
            if t is Call:
                obj.state.append(state)
            elif t is Global or t is ExtRef:
                mutated(obj, "BUILD", pos)     # __setstate__ or __dict__.update on the real object
            return pos

        def op_persid(pos: int) -> int:
            end = readline(pos, pos - 1)
            try:
                pid = data[pos:end].decode("ascii")
            except UnicodeDecodeError as exc:
                raise FormatError(Code.PICKLE_MALFORMED, "persistent IDs in protocol 0 must be ASCII",
                                  offset=base + pos - 1) from exc
            p = PersId(pid, base + pos - 1)
            persids.append(p)
            push(p)
            return end + 1

        def op_binpersid(pos: int) -> int:
            p = PersId(stack[-1], base + pos - 1)
            persids.append(p)
            stack[-1] = p
            return pos

        def ext(pos: int, code: int, end: int) -> int:
            vm.note(Code.PICKLE_EXTENSION_CODE, f"extension code {code}", pos - 1)
            push(ExtRef(code, base + pos - 1))
            return end

        def op_ext1(pos: int) -> int:
            return ext(pos, data[pos], pos + 1)

        def op_ext2(pos: int) -> int:
            code: int = _U16(data, pos)[0]
            return ext(pos, code, pos + 2)

        def op_ext4(pos: int) -> int:
            code: int = _I32(data, pos)[0]
            return ext(pos, code, pos + 4)

        def op_next_buffer(pos: int) -> int:
            vm.note(Code.PICKLE_OUT_OF_BAND_BUFFER, "NEXT_BUFFER", pos - 1)
            push(Buffer(False, base + pos - 1))
            return pos

        def op_readonly_buffer(pos: int) -> int:
            vm.note(Code.PICKLE_OUT_OF_BAND_BUFFER, "READONLY_BUFFER", pos - 1)
            top = stack[-1]
            if type(top) is Buffer:     # pickle.load_readonly_buffer: a read-only view of the top
                stack[-1] = Buffer(True, top.offset)
            return pos                  # (a bytearray stays as it is: copying it could repeat)

        # ---- framing and protocol ----
        def op_proto(pos: int) -> int:
            proto = data[pos]
            vm.proto = proto
            res.protocol = proto
            if proto > 5:
                vm.note(Code.PICKLE_PROTOCOL, f"unsupported pickle protocol {proto}", pos - 1)
            return pos + 1

        def op_frame(pos: int) -> int:
            size: int = _U64(data, pos)[0]
            if pos + 8 + size > n:
                # pickle.py fails "pickle exhausted before end of frame"; read on for globals.
                vm.note(Code.PICKLE_TRUNCATED, f"FRAME of {size} bytes runs past the end", pos - 1)
            vm.frames.append((pos - 1, pos + 8, pos + 8 + size))
            return pos + 8

        handlers: dict[str, Callable[[int], int]] = {
            name[3:].upper(): fn for name, fn in locals().items() if name.startswith("op_")
        }
        return self._wrap(handlers)

    def _wrap(self, handlers: dict[str, Callable[[int], int]]) -> list[Callable[[int], int]]:
        """Dispatch list whose entries record their opcode as used, then step aside."""
        base = self.base
        used = self.result.opcodes_used

        def unknown(pos: int) -> int:
            raise FormatError(Code.PICKLE_UNKNOWN_OPCODE, f"unknown opcode 0x{self.data[pos - 1]:02x}",
                              offset=base + pos - 1)

        table: list[Callable[[int], int]] = [unknown] * 256

        def first_use(code: int, name: str, real: Callable[[int], int]) -> Callable[[int], int]:
            def handler(pos: int) -> int:
                used.add(name)
                table[code] = real
                return real(pos)
            return handler

        for info in OPCODES:
            if info is not None:
                table[info.code] = first_use(info.code, info.name, handlers[info.name])
        return table
