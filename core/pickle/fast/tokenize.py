"""The opcode walk in front of both C-speed paths (core.pickle.fast.stubs, core.pickle.fast.column_stubs).

Strategy: the exact interpreters run ~1 M opcodes/s; the C unpickler is much faster but
accepts opcodes torch's restricted unpickler refuses. So before the C unpickler sees a
pickle, `tokenize` walks every opcode with one compiled regex (only GLOBAL, PROTO,
EMPTY_LIST, MARK and its closers, long strings and STOP reach Python) and declines unless
every opcode is in torch's accepted set (FORMATS.md §3.4), every GLOBAL is allowlisted,
every memo index is small and no cap of `Limits` might be reached (the exact interpreters
stop at those caps; the C unpickler checks none of them). `Decline` means: use the exact
interpreters instead.

Two things the C unpickler does on its own are not torch's: SETITEM on a list, and
hashing a dict key however it was built (a tuple that holds one memoized tuple twice,
nested 30 deep, takes 2**30 steps to hash: a 300-byte pickle that never finishes). So
EMPTY_LIST and EMPTY_DICT are rewritten to build our `CheckedList` / `CheckedDict`,
which refuse SETITEM and tuple keys; such pickles go to the exact interpreters, which
hash each tuple of a DAG once.
"""

from __future__ import annotations

import array
import functools
import io
import pickle
import re
import struct
from collections.abc import Callable, Sequence

from ckptguard.core.errors import Decline
from ckptguard.core.gcpause import collector_paused
from ckptguard.core.limits import DEFAULT_LIMITS, Limits
from ckptguard.core.pickle.fast.containers import BuildLedger, CheckedDict, CheckedList
from ckptguard.core.pickle.renames import last_dot_split, python_map, torch_map
from ckptguard.core.pickle.result import GlobalUse
from ckptguard.core.records import field, record

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any

# The C unpickler keeps its memo in an array that grows to twice the largest index put (16
# bytes per index): a LONG_BINPUT at a large index in a short pickle costs memory the pickle
# does not pay for. Every pickler numbers its memo in order (index = entries so far), and an
# index from 256 on takes a LONG_BINPUT (5 bytes, starting with b"r"). So in a pickle any
# pickler wrote, no index reaches 256 + min(its b"r" bytes, its size // 5): a larger one is
# declined to the exact interpreters (a dict memo, Limits.max_memo_entries), and the array
# stays within ~3 bytes per pickle byte. Below the floor (16 MB of memo at most) any index
# passes: the walk's regex takes those without Python.
_MAX_MEMO_INDEX_FLOOR = 1 << 20
_LONG_BINPUT_SIZE = 5


def memo_index_cap(data: bytes) -> int:
    """The largest memo index + 1 a pickler could have written in `data` (see above)."""
    by_size = 256 + len(data) // _LONG_BINPUT_SIZE
    if by_size <= _MAX_MEMO_INDEX_FLOOR:   # the floor is higher: no need to count
        return _MAX_MEMO_INDEX_FLOOR
    return max(_MAX_MEMO_INDEX_FLOOR, min(by_size, 256 + data.count(b"r")))

# Fixed-size opcodes torch accepts (FORMATS.md §3.4), as one run: REDUCE APPEND SETITEM
# TUPLE1-3 EMPTY_TUPLE EMPTY_SET NONE NEWTRUE NEWFALSE BINPERSID; BININT1 BINGET BINPUT;
# BININT2; BININT LONG_BINGET; BINFLOAT; LONG_BINPUT below 2**bits (`_long_binput`);
# BINUNICODE under 128 bytes (one branch per length, so the regex engine skips the string
# at C speed). MARK and what closes a MARK (TUPLE, APPENDS, SETITEMS) reach Python, outside
# the tensor entry and the flat tuple below (whose MARKs close within them): the loop keeps
# the open MARKs, so it knows their nesting and bounds the stack (the caps above
# `tokenize`). Real pickles open a MARK per batch of 1000 items, per dict and per long
# tuple: a few Python steps per thousand opcodes.
# BUILD, NEWOBJ, GLOBAL, PROTO, EMPTY_LIST, EMPTY_DICT, SHORT_BINSTRING, LONG1, longer
# strings and STOP are handled in Python too.


def _short_unicode(limit: int) -> bytes:
    """BINUNICODE's length and text for every length under `limit`, one branch per length.
    Compiling the walk costs in proportion to its branches, once per process: tensor names
    and other strings under 128 bytes, storage keys under 16 (torch writes str(int)), make it
    about half of what 256 everywhere took (best of 9 here)."""
    return b"|".join(re.escape(bytes((n,))) + rb"\x00\x00\x00(?s:.){%d}" % n for n in range(limit))


def _any(n: int) -> bytes:
    """`n` arbitrary bytes, spelled out one by one. A counted repeat (`(?s:.){4}`) compiles
    to a REPEAT_ONE op, and the regex engine keeps a frame on its stack for what follows
    each such op until the whole run returns: on a 40,000-tensor pickle that stack grows to
    about a megabyte per call and is copied at every realloc. Single-byte ops keep no frame;
    they are spelled out in the tensor entry below (run once per tensor), and `(?s:.)`
    (ANY_ALL) is cheaper to match and to compile than the class `[\x00-\xff]`."""
    return rb"(?s:.)" * n


_SHORT_UNICODE = _short_unicode(128)
# LONG_BINPUT indexes the run takes: below 2**20 (_MAX_MEMO_INDEX_FLOOR); once the loop met
# a larger one, below 2**bits where the pickle could number that far (`_memo_bits`)
_MEMO_BITS = 20
_MAX_MEMO_BITS = 24


def _long_binput(bits: int) -> bytes:
    """LONG_BINPUT with an index below 2**bits (20 <= bits <= 24), as single-byte ops."""
    top = re.escape(bytes(((1 << (bits - 16)) - 1,)))
    return rb"r" + _any(2) + rb"[\x00-" + top + rb"]\x00"


# Opcodes of a fixed size the run takes, but LONG_BINPUT (whose index is bounded) and MARK
_FIXED_OPCODES = (rb"[Ras\x85\x86\x87)\x8fN\x88\x89Q]|[Khq](?s:.)|M(?s:.){2}|[Jj](?s:.){4}"
                  rb"|G(?s:.){8}")


def _plain_opcode(bits: int) -> bytes:
    """One opcode of the run but a string."""
    return _FIXED_OPCODES + rb"|" + _long_binput(bits)


def _one_opcode(bits: int) -> bytes:
    return _plain_opcode(bits) + rb"|X(?:" + _SHORT_UNICODE + rb")"


_ONE_OPCODE = _one_opcode(_MEMO_BITS)

# An accelerator, not a rule: the opcodes torch.save writes for one state_dict entry after
# its key (`_rebuild_tensor_v2(pid, offset, size, stride, requires_grad, OrderedDict())`),
# as ONE regex branch. Every piece is one of the opcodes above, so a match consumes exactly
# what the opcode-by-opcode branch would; it only saves the engine ~30 iterations per
# tensor (halves the walk: bench/scan_stages.py). It starts with the key's PUT; the key
# itself is walked by the one-opcode branch: a second copy of the 128 string branches here
# would cost ~8 ms of every process's compile (22 -> 14 ms) for no measurable gain.
# An optional PUT is a branch whose last alternative is empty: the same greedy choice as
# `(?:...)?`, which compiles to REPEAT/MAX_UNTIL (two more stack frames and an allocation at
# every use). With `_any` and the key's PUT, the walk of a 40,000-tensor pickle takes 177 M
# instructions, not 369 M, and compiling the walk 43 M, not 46 M (callgrind).
_GET = rb"(?:h" + _any(1) + rb"|j" + _any(4) + rb")"
_INT = rb"(?:K" + _any(1) + rb"|M" + _any(2) + rb"|J" + _any(4) + rb")"
# torch writes str(int) as a storage's key; a view of a storage named before gets it from
# the memo
_STORAGE_KEY = rb"(?:X(?:" + _short_unicode(16) + rb")|" + _GET + rb")"


def _tensor_entry(bits: int) -> bytes:
    put = rb"(?:q" + _any(1) + rb"|" + _long_binput(bits) + rb"|)"   # an optional PUT
    tup = (rb"(?:" + _INT + rb"\x85" + put + rb"|" + _INT + _INT + rb"\x86" + put + rb"|"
           + _INT * 3 + rb"\x87" + put + rb"|\x29|\x28" + _INT + rb"{0,64}t" + put + rb")")
    return (put + _GET + rb"\x28\x28" + _GET + _GET + _STORAGE_KEY + put
            + _GET + _INT + rb"t" + put + rb"Q" + _INT + tup + tup
            + rb"[\x88\x89]" + _GET + rb"\x29R" + put + rb"t" + put + rb"R" + put)


_TENSOR_ENTRY = _tensor_entry(_MEMO_BITS)

# The run is a plain greedy repeat with nothing after it, not a possessive `*+` or an atomic
# group: CPython 3.11.0-3.11.4 mis-handle those (gh-100061, gh-106052: a last try that fails
# half-way does not restore the position, so the walk would skip bytes). Nothing follows the
# repeat, so it never backtracks into an earlier iteration and stops where a possessive one
# would; and every branch is a sequence of whole opcodes, so wherever a match ends is an
# opcode boundary (tests/core/pickles/test_tokenize_walk.py checks both against pickletools).
# A greedy repeat keeps one frame per iteration until the match returns: `{0,_CHUNK}` bounds
# that memory, and `tokenize` calls the run again where a chunk ends (the inner repeats are
# bounded too: a longer batch of empty batches or a longer tuple is walked, or declined,
# opcode by opcode).
_CHUNK = 1024


# The deepest the run's own branches nest MARKs: a tensor entry's arguments and its size
# tuple; a flat tuple one. The loop counts every other MARK, so it knows the nesting where a
# run starts, and takes a run without those branches where 2 more levels would pass
# Limits.max_depth (real pickles nest a few levels; the cap is 10,000).
_RUN_NESTING = 2


@functools.cache
def run_pattern(newobj: bool, bits: int = _MEMO_BITS, nested: bool = True) -> re.Pattern[bytes]:
    """The compiled walk (compiled on first use: ~7-14 ms each, which a process that scans
    one small pickle, or no pickle at all, need not pay). With `newobj` it lets NEWOBJ
    through too (core.pickle.fast.stubs's stubs judge it); without `nested`, every MARK is
    the loop's. (`tokenize` passes all three arguments: the cache keys on how it is called.)"""
    one = _one_opcode(bits)
    branches = (rb"|\x81|" if newobj else rb"|") + one
    if nested:   # a tuple of up to 64 opcodes but strings (a shape, a row of numbers): one
        # branch (with strings it would hold a second copy of their 128 branches to compile)
        branches = (_tensor_entry(bits) + rb"|\x28(?:" + _plain_opcode(bits) + rb"){0,64}t"
                    + branches)
    return re.compile(rb"(?:" + branches.lstrip(b"|") + rb"){0,%d}" % _CHUNK)


def _memo_bits(cap: int) -> int:
    """How many bits of LONG_BINPUT index the run may take where no index reaches `cap`
    (memo_index_cap, and the memo cap): the memo of a million-tensor pickle (~5 M entries)
    is then walked by the regex, not the loop."""
    bits = _MEMO_BITS
    while bits < _MAX_MEMO_BITS and cap >= 1 << (bits + 1):
        bits += 1
    return bits


# Counting opcodes (only for a pickle larger than the opcode or container cap: the caps
# above `tokenize`), after the walk accepted the pickle: a regex cannot say how often its
# repeat matched, so the opcodes are matched in blocks of exactly 1024, 32 and 1, largest
# first (r opcodes: about r / 1024 + 2 * 31 steps of Python). The unit is any one opcode the
# walk accepts except a BINUNICODE of 128 bytes or more (a 4-byte length no regex can
# follow): the walk notes where those are, and the count steps over them.
_COUNT_BLOCKS = (1024, 32, 1)


def _one_byte_length(opcode: bytes) -> bytes:
    """`opcode` with a 1-byte length and that many bytes: one branch per length."""
    return re.escape(opcode) + rb"(?:" + b"|".join(
        re.escape(bytes((n,))) + rb"(?s:.){%d}" % n for n in range(256)) + rb")"


# One opcode, with exactly one way to match it (no two branches take the same bytes): a
# block that fails part-way backtracks through its iterations once, never tries them anew.
_COUNTED_OPCODE = (
    rb"(?:" + _FIXED_OPCODES + rb"|[\x28teub\x5d\x7d\x81.]|\x80(?s:.)|r(?s:.){4}"
    rb"|X(?:" + _SHORT_UNICODE + rb")|c[^\n]*\n[^\n]*\n|" + _one_byte_length(b"U")
    + rb"|" + _one_byte_length(b"\x8a") + rb")")


@functools.cache
def _block_pattern(size: int) -> re.Pattern[bytes]:
    return re.compile(_COUNTED_OPCODE + rb"{%d}" % size)


def _count_span(data: bytes, start: int, end: int) -> int:
    count = 0
    pos = start
    for size in _COUNT_BLOCKS:
        match = _block_pattern(size).match
        while (found := match(data, pos, end)) is not None:
            pos = found.end()
            count += size
    if pos != end:   # cannot happen for opcodes the walk accepted: be loud, not wrong
        raise Decline("opcodes the count does not walk alike")
    return count


def count_opcodes(data: bytes, end: int, long_strings: Sequence[int]) -> int:
    """The opcodes of `data[:end]`, a pickle the walk accepted, whose BINUNICODE opcodes of
    128 bytes or more span `long_strings` (start, end, start, end, ... in order)."""
    count = len(long_strings) // 2
    pos = 0
    for i in range(0, len(long_strings), 2):
        count += _count_span(data, pos, long_strings[i])
        pos = long_strings[i + 1]
    return count + _count_span(data, pos, end)


_U32 = struct.Struct("<I")
# EMPTY_LIST / EMPTY_DICT -> `CheckedList()` / `CheckedDict()` (StubUnpickler.find_class)
_REWRITES = {0x5D: b"c__ckptguard__\nlist\n)R", 0x7D: b"c__ckptguard__\ndict\n)R"}


@record(slots=True)
class Tokens:
    """What the opcode walk learned about one pickle."""

    globals: list[tuple[str, str, str, str, int]] = field(default_factory=list)
    # (module, name, raw_module, raw_name, relative position of the GLOBAL opcode)
    protocol: int | None = None
    end: int = 0                       # relative position after STOP
    builds: int = 0                    # BUILD opcodes (each must reach a stub's __setstate__)
    rewritten: bytes | None = None     # data[:end] with EMPTY_LIST/EMPTY_DICT rewritten
    opcodes: int | None = None         # opcodes through STOP, where the caps needed the count


# The exact interpreters stop at the caps of `Limits` (LIMIT_* findings, verdict invalid);
# the C unpickler checks none of them. So the walk declines any pickle that might reach one,
# and the exact interpreters give it the report they give every pickle past a cap: the fast
# paths stay an accelerator that never changes an answer. Each bound below is at least what
# the exact interpreters count, and close to it for a real checkpoint:
# - MARK nesting: counted exactly (every MARK outside a tensor entry or a flat tuple reaches
#   the loop, and those branches run only where their own nesting fits: _RUN_NESTING).
# - the stack (core.pickle.vm counts every frame's items): an opcode pushes at most one item,
#   so the items of an open frame are at most the bytes walked in it, and a frame that
#   closes leaves at most one item (its tuple) in place of its own.
# - opcodes, and the items of one container (at most one per opcode): a pickle of no more
#   bytes than those caps cannot pass them; a larger one has its opcodes counted (count_opcodes),
#   so a real checkpoint of a million tensors (~35 M opcodes in ~100 MB) stays fast.
# - memo entries: no pickler numbers past what it put (see memo_index_cap): the indices under
#   the floor are at most the floor, the rest at most the largest index + 1; a cap under the
#   floor takes the count of PUT-like bytes instead.
# - one string: checked on every string the loop skips; the ones the regex takes are under
#   _UNCHECKED_STRING_BYTES, so a cap below that declines every pickle.
_UNCHECKED_STRING_BYTES = 255      # SHORT_BINSTRING and LONG1: a 1-byte length


def tokenize(data: bytes, allowed: Callable[[str], bool], *, newobj: bool = False,
             limits: Limits = DEFAULT_LIMITS) -> Tokens:
    """Walk the opcodes of one pickle; Decline on anything torch would not accept, and on
    anything that might reach a cap of `limits` (see above).

    NEWOBJ declines too unless `newobj` (torch accepts it for a few classes only)."""
    if limits.max_str_bytes < _UNCHECKED_STRING_BYTES:
        raise Decline("a string cap below what the walk lets through unchecked")
    toks = Tokens()
    pos = 0
    n = len(data)
    bits = _MEMO_BITS
    shallow = limits.max_depth - _RUN_NESTING   # open MARKs up to which the run may nest more
    match = run_pattern(newobj, bits, shallow >= 0).match
    pieces: list[bytes] = []
    piece_start = 0
    memo_cap: int | None = None   # memo_index_cap, counted when an index past the floor needs it
    max_depth, max_stack = limits.max_depth, limits.max_stack
    marks: list[int] = []         # for each open MARK: `items` when it opened
    items = 0                     # bound on the items on the stack, all frames together
    # opcodes are counted only where the bytes alone do not keep them under the caps
    counting = n > min(limits.max_opcodes, limits.max_container_items)
    long_strings = array.array("q")   # start, end of each string the count steps over
    top_index = -1                # largest memo index the loop saw (past the floor)
    # Each step of the loop takes at least one opcode: past max_opcodes steps the pickle is
    # past the cap, and a hostile run of MARKs (two steps per four bytes) stops there.
    steps_left = limits.max_opcodes
    while True:
        steps_left -= 1
        if steps_left < 0:
            raise Decline("the opcodes pass Limits.max_opcodes")
        run_end = match(data, pos).end()   # type: ignore[union-attr]  # {0,N} always matches
        ran = run_end != pos
        items += run_end - pos + 1         # the run's bytes, and the opcode below
        if items > max_stack:
            raise Decline("the stack might pass Limits.max_stack")
        pos = run_end
        if pos >= n:
            raise Decline("no STOP")
        op = data[pos]
        if op == 0x28:  # MARK
            if pos + 1 < n and data[pos + 1] in b"eu":
                # an empty batch: the C unpickler skips it on any object, torch checks the
                # object's type (one right after a batch on the same object is taken below)
                raise Decline("an empty batch")
            if len(marks) >= max_depth:
                raise Decline("MARK nesting might pass Limits.max_depth")
            marks.append(items - 1)
            if len(marks) == shallow + 1:   # too deep now for the run's nested branches
                match = run_pattern(newobj, bits, False).match
            pos += 1
        elif op == 0x74 or op == 0x75 or op == 0x65:   # TUPLE, SETITEMS, APPENDS close a
            if not marks:   # MARK: its frame's items become one tuple, or go into the dict
                raise Decline("a MARK closed that is not open")   # or list below the MARK
            items = marks.pop() + (op == 0x74)
            if len(marks) == shallow:
                match = run_pattern(newobj, bits, True).match
            pos += 1
            # after a batch, empty batches on the same object (what pickle writes after an
            # exact multiple of 1000 items): the C unpickler could only store their items
            # into a dict/list
            for _ in range(64 if op != 0x74 else 0):
                if data[pos:pos + 2] != bytes((0x28, op)):
                    break
                pos += 2
        elif op == 0x58:  # BINUNICODE of 128 bytes or more
            if pos + 5 > n:
                raise Decline("truncated")
            size = _U32.unpack_from(data, pos + 1)[0]
            if size > limits.max_str_bytes:
                raise Decline("a string past Limits.max_str_bytes")
            if counting:
                long_strings.extend((pos, pos + 5 + size))
            pos += 5 + size
        elif op == 0x63:  # GLOBAL
            nl1 = data.find(b"\n", pos + 1)
            nl2 = data.find(b"\n", nl1 + 1) if nl1 >= 0 else -1
            if nl2 < 0:
                raise Decline("truncated GLOBAL")
            if max(nl1 - pos - 1, nl2 - nl1 - 1) > limits.max_str_bytes:
                raise Decline("a GLOBAL line past Limits.max_str_bytes")
            try:
                raw_module = data[pos + 1:nl1].decode("utf-8")
                raw_name = data[nl1 + 1:nl2].decode("utf-8")
            except UnicodeDecodeError as exc:
                raise Decline("GLOBAL not utf-8") from exc
            module, name = torch_map(raw_module, raw_name)
            if not allowed(f"{module}.{name}"):
                raise Decline(f"global {module}.{name} is not allowlisted")
            module, name = last_dot_split(module, name)   # as torch's tables name it
            toks.globals.append((module, name, raw_module, raw_name, pos))
            pos = nl2 + 1
        elif op == 0x72:  # LONG_BINPUT with a large index: bound it (the C memo is an array)
            if pos + 5 > n:
                raise Decline("memo index out of range")
            index = _U32.unpack_from(data, pos + 1)[0]
            if index >= _MAX_MEMO_INDEX_FLOOR:   # (the cap is never below the floor)
                if memo_cap is None:   # one pass over the pickle: only if an index needs it
                    memo_cap = memo_index_cap(data)
                    bits = _memo_bits(min(memo_cap, limits.max_memo_entries))
                    # from here the run takes indexes below 2**bits
                    match = run_pattern(newobj, bits, len(marks) <= shallow).match
                if index >= memo_cap:
                    raise Decline("memo index out of range")
            top_index = max(top_index, index)
            pos += 5
        elif op == 0x62:  # BUILD: counted, see StubUnpickler.load_or_decline
            toks.builds += 1
            pos += 1
        elif op == 0x5D or op == 0x7D:  # EMPTY_LIST, EMPTY_DICT -> our checked stand-ins
            pieces.append(data[piece_start:pos])
            pieces.append(_REWRITES[op])
            pos += 1
            piece_start = pos
        elif op == 0x55 or op == 0x8A:  # SHORT_BINSTRING, LONG1
            if pos + 2 > n:
                raise Decline("truncated")
            pos += 2 + data[pos + 1]
        elif op == 0x80:  # PROTO
            if pos + 2 > n:
                raise Decline("truncated")
            if pos:   # pickle writes it first only; elsewhere it pushes nothing, so MARK PROTO
                # APPENDS is an empty batch the check at MARK cannot see (the C unpickler
                # skips it, torch checks the object's type)
                raise Decline("PROTO after the first opcode")
            toks.protocol = data[pos + 1]   # the last PROTO, as the interpreters report it
            if data[pos + 1] > pickle.HIGHEST_PROTOCOL:
                raise Decline("protocol beyond the C unpickler")
            pos += 2
        elif op == 0x2E:  # STOP
            toks.end = pos + 1
            break
        elif ran:  # the run stopped at _CHUNK opcodes, not at this one: walk on
            items -= 1
            continue
        else:  # incl. NEWOBJ: torch accepts it for a few classes only, left to the exact path
            raise Decline(f"opcode {op} is not accepted here")
        if pos > n:
            raise Decline("argument past end")
    if counting:
        toks.opcodes = count_opcodes(data, toks.end, long_strings)
    _check_counts(data, toks.opcodes, top_index, limits)
    if pieces:
        pieces.append(data[piece_start:toks.end])
        toks.rewritten = b"".join(pieces)
    return toks


def _check_counts(data: bytes, opcodes: int | None, top_index: int, limits: Limits) -> None:
    """Decline a walked pickle that might pass the opcode, container or memo caps
    (`opcodes`: None where the pickle's size keeps it under the first two)."""
    if opcodes is not None and opcodes > limits.max_opcodes:
        raise Decline("the opcodes might pass Limits.max_opcodes")
    if opcodes is not None and opcodes > limits.max_container_items:
        raise Decline("a container might pass Limits.max_container_items")
    max_memo = limits.max_memo_entries
    if max_memo >= _MAX_MEMO_INDEX_FLOOR:
        if top_index >= max_memo:
            raise Decline("the memo might pass Limits.max_memo_entries")
    elif data.count(b"q") + data.count(b"r") > max_memo:
        raise Decline("the memo might pass Limits.max_memo_entries")


def global_uses(toks: Tokens, base_offset: int) -> list[GlobalUse]:
    """The GLOBAL opcodes the opcode walk met, as the VM would have recorded them."""
    proto = toks.protocol or 0
    return [GlobalUse(*python_map(raw_module, raw_name, proto), raw_module, raw_name, "GLOBAL",
                      base_offset + pos)
            for _module, _name, raw_module, raw_name, pos in toks.globals]


# what StubUnpickler.find_class returns for the names of our own rewrites (_REWRITES)
_REWRITTEN = {("__ckptguard__", "list"): CheckedList, ("__ckptguard__", "dict"): CheckedDict}


class StubUnpickler(pickle.Unpickler):
    """CPython's C unpickler over a pickle `tokenize` accepted, with stubs for globals.

    `find_class` maps a name as torch does and asks `make_stub` once per name; strings
    decode as torch.load decodes them. Each GLOBAL the C unpickler executes must be the
    next one the walk saw (so its allowlist check covered it), else Decline: a second
    line of defence should the walk ever lose its place. The input sits in a
    BufferedReader: with `peek()` the C unpickler reads from its own buffer instead of
    calling read() for every opcode (halves the load time).
    """

    def __init__(self, data: bytes, toks: Tokens, builds: BuildLedger | None = None) -> None:
        source = toks.rewritten if toks.rewritten is not None else data[:toks.end]
        stream = io.BufferedReader(io.BytesIO(source), buffer_size=max(len(source), 1))
        super().__init__(stream, fix_imports=False, encoding="utf-8")
        self.stubs: dict[tuple[str, str], Any] = {}
        # (raw module, raw name, the walk's name for it) of each GLOBAL, in order
        self.walked = [(raw_m, raw_n, (module, name)) for module, name, raw_m, raw_n, _ in toks.globals]
        self.globals_met = 0
        self.builds_expected = toks.builds
        # every BUILD a stub's __setstate__ judged; the C unpickler runs BUILD on an object
        # without __setstate__ itself (a None state does nothing at all, a slot state sets
        # attributes), where torch refuses: such a BUILD must not pass unnoticed
        self.builds = builds if builds is not None else BuildLedger(DEFAULT_LIMITS.max_build_state_keys)

    def make_stub(self, module: str, name: str) -> Any:
        raise NotImplementedError

    def find_class(self, module: str, name: str) -> Any:
        if module == "__ckptguard__":   # our own rewrites (a pickle's own GLOBAL of this
            return _REWRITTEN[module, name]   # name is not allowlisted: the walk declined it)
        met = self.globals_met
        if met >= len(self.walked) or self.walked[met][:2] != (module, name):
            raise Decline(f"global {module}.{name} was not seen by the opcode walk")
        mapped = self.walked[met][2]
        self.globals_met = met + 1
        stub = self.stubs.get(mapped)
        if stub is None:
            stub = self.stubs[mapped] = self.make_stub(*mapped)
        return stub

    def load_or_decline(self) -> Any:
        """`load()`, with any failure a Decline and the cyclic GC paused meanwhile."""
        try:
            with collector_paused():   # millions of new containers, no cycle among them
                root = self.load()
        except Decline:
            raise
        except Exception as exc:
            raise Decline(f"{type(exc).__name__}: {exc}") from exc
        if self.builds.count != self.builds_expected:
            raise Decline("a BUILD on an object whose __setstate__ is not ours")
        return root
