"""Threat analysis of one interpreted pickle: every global judged, dangerous calls found.

Strategy: the weights-only allowlist alone decides `allowed` (torch_map'ed name, as torch
reads it); everything else is judged by the knowledge base (core.threats.table): benign or
unknown as torch names it, and dangerous if ANY reading is — CPython's fix_imports mapping,
the raw bytes, whitespace-stripped, NFKC and confusable-folded forms — so a name that
differs between readers (or between a reader and a human) cannot slip through. The
call graph (`VmResult.calls`) is then searched for what a global list cannot show:
a dangerous callable actually called, a callable computed by another call (the
`getattr(__import__('os'), 'system')` family), `attrgetter`/`methodcaller` gadgets,
dangerous globals handed to allowlisted rebuilders, BUILD states that plant
`__setstate__`, and EXT-code or persistent-id callables. A nested deserializer's inline
payload (`pickle.loads(b"...")`) is interpreted and assessed too (core.threats.graph reads
the call graph statically).

    >>> classify_global("posix", "system").status
    'dangerous'
"""

from __future__ import annotations

import unicodedata
from functools import lru_cache

from ckptguard.core.errors import Code, Severity
from ckptguard.core.pickle.renames import python_map, torch_map
from ckptguard.core.pickle.result import GlobalUse, VmResult
from ckptguard.core.records import record
from ckptguard.core.report import GlobalStatus
from ckptguard.core.state import Analysis
from ckptguard.core.threats.graph import module_pid_class, payload, preview, resolve_path
from ckptguard.core.threats.table import (
    BENIGN_MODULES,
    BENIGN_NAMES,
    CONFUSABLES,
    DANGEROUS_ATTRS,
    DANGEROUS_DUNDERS,
    DANGEROUS_MODULES,
    DANGEROUS_NAMES,
)
from ckptguard.core.torch.allowlist import ALLOWED_GLOBALS, BASELINE_USER_GLOBALS
from ckptguard.core.torch.rules import BLOCKED_MODULES
from ckptguard.core.values import Call, ExtRef, Global, PersId

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any, Literal, TypeAlias

ThreatStatus: TypeAlias = 'Literal["dangerous", "benign", "unknown"]'

_RANK = {"benign": 0, "unknown": 1, "dangerous": 2}
# what a BUILD state may plant on an object (`__dict__` itself is what BUILD updates)
_PLANTED_DUNDERS = tuple(sorted(DANGEROUS_DUNDERS - {"__dict__"}))
_PICKLE_STARTS = frozenset(bytes([b]) for b in b"\x80(]}cN)IJKVX")   # PROTO or a protocol 0/1 start


@record(frozen=True, slots=True)
class Threat:
    """The knowledge base's judgement of one global."""

    status: ThreatStatus
    severity: Severity
    code: Code
    reason: str


_UNKNOWN = Threat("unknown", Severity.MEDIUM, Code.PICKLE_UNKNOWN_GLOBAL,
                  "not in the weights-only allowlist")


def classify_global(module: str, name: str) -> Threat:
    """Judge `module.name` as dangerous, benign or unknown (never "safe": see DESIGN.md).

    >>> classify_global("builtins", "getattr").code
    <Code.PICKLE_DANGEROUS_GLOBAL: 'PICKLE_DANGEROUS_GLOBAL'>
    >>> classify_global("argparse", "Namespace").status
    'benign'
    """
    return _classify(module[:1000], name[:1000])


@lru_cache(maxsize=4096)
def _classify(module: str, name: str) -> Threat:
    worst = _judge(module, name)
    if worst.status == "dangerous":
        return worst
    for label, (m, n) in _variants(module, name):
        t = _judge(m, n)
        if t.status == "dangerous":
            return Threat("dangerous", t.severity, t.code,
                          f"{label} of {m}.{n}, which {t.reason}")
        if _RANK[t.status] > _RANK[worst.status]:
            worst = t
    return worst


def _variants(module: str, name: str) -> list[tuple[str, tuple[str, str]]]:
    """Other spellings some reader (or a human) may resolve the name to."""
    out: list[tuple[str, tuple[str, str]]] = []

    def add(label: str, m: str, n: str) -> None:
        if (m, n) != (module, name) and all(p != (m, n) for _, p in out):
            out.append((label, (m, n)))

    add("torch's Python 2 name mapping", *torch_map(module, name))
    add("pickle's Python 2 name mapping", *python_map(module, name, 2))
    stripped = ("".join(c for c in module if c.isprintable()).strip(" .\t"),
                "".join(c for c in name if c.isprintable()).strip(" .\t"))
    add("a whitespace/control-padded spelling", *stripped)
    # A scanner that re-joins STACK_GLOBAL operands as GLOBAL text lines ("os\nsystem" + "x")
    # and splits on whitespace reads another global than the one pickle imports.
    tokens = f"{module} {name}".split()
    if len(tokens) >= 2 and (len(tokens) > 2 or tokens != [module, name]):
        add("a whitespace-split reading", tokens[0], tokens[1])
    if not (module.isascii() and name.isascii()):
        nfkc = (unicodedata.normalize("NFKC", module), unicodedata.normalize("NFKC", name))
        add("an NFKC-equivalent spelling", *nfkc)
        add("a lookalike (confusable) spelling", nfkc[0].translate(CONFUSABLES),
            nfkc[1].translate(CONFUSABLES))
        add("a lookalike (confusable) spelling", stripped[0].translate(CONFUSABLES),
            stripped[1].translate(CONFUSABLES))
    return out


def _judge(module: str, name: str) -> Threat:
    names = name.split(".")
    for i, part in enumerate(names):
        if part.startswith("__") and part.endswith("__") and len(part) > 4 and (
                i > 0 or part in DANGEROUS_DUNDERS):
            return Threat("dangerous", Severity.CRITICAL, Code.PICKLE_DANGEROUS_GLOBAL,
                          f"reaches {part} (introspection gadget)")
        if i > 0 and part in DANGEROUS_ATTRS:
            return Threat("dangerous", Severity.HIGH, Code.PICKLE_DANGEROUS_GLOBAL,
                          f"reaches the attribute {part!r} through a dotted name")
    benign = BENIGN_NAMES.get(f"{module}.{name}")
    if benign is not None:      # an exact name is the most specific rule (uuid.UUID in uuid)
        return Threat("benign", Severity.LOW, Code.PICKLE_BENIGN_GLOBAL, benign)
    parts = [p for p in module.split(".")] + names
    rule = _most_specific(parts)
    if rule is not None:
        severity, code, reason = rule
        return Threat("dangerous", severity, code, reason)
    # Protocol 4 resolves a dotted name attribute by attribute, so a module another module
    # imported is reachable through it: `pathlib` + `os.getcwd` is os.getcwd (fickling
    # GHSA-5j3x-jp52-966f). Every traversed (non-final) name component may start a module.
    for j in range(len(names) - 1):
        rule = _most_specific(names[j:])
        if rule is not None:
            severity, code, reason = rule
            return Threat("dangerous", severity, code,
                          f"reaches {names[j]} through an attribute chain, which {reason}")
    if benign is None and len(names) == 1 and name.isidentifier() and not name.startswith("__"):
        benign = _benign_module(module)
    if benign is not None:
        return Threat("benign", Severity.LOW, Code.PICKLE_BENIGN_GLOBAL, benign)
    return _UNKNOWN


def _most_specific(parts: list[str]) -> tuple[Severity, Code, str] | None:
    """The deny rule of the longest dotted prefix of `parts` (a module rule, or a name rule of
    at least two components), if any."""
    for k in range(len(parts), 0, -1):
        prefix = ".".join(parts[:k])
        rule = DANGEROUS_MODULES.get(prefix) or (DANGEROUS_NAMES.get(prefix) if k > 1 else None)
        if rule is not None:
            return rule
    return None


def _benign_module(module: str) -> str | None:
    parts = module.split(".")
    for k in range(len(parts), 0, -1):
        reason = BENIGN_MODULES.get(".".join(parts[:k]))
        if reason is not None:
            return reason
    return None


def classify_path(path: str) -> Threat:
    """Judge a dotted path whose module/attribute split is unknown (e.g. from a getattr chain)."""
    module, _, name = path.rpartition(".")
    return classify_global(module, name) if module else classify_global(path, "")


def assess(vm: VmResult, an: Analysis, *, allow: frozenset[str], record: str | None) -> None:
    """Record every global of `vm` in `an` with its status; add threat findings and VM notes.

    >>> assess(run_vm(b"cos\\nsystem\\n(S'id'\\ntR."), an, allow=frozenset(), record=None)
    >>> an.globals[("os", "system")].status
    'dangerous'
    """
    _Assessor(an, allow, record, 0).run(vm)


class _Assessor:
    def __init__(self, an: Analysis, allow: frozenset[str], record: str | None, depth: int) -> None:
        self.an = an
        self.limits = an.options.limits
        self.allow = allow
        self.allowed = ALLOWED_GLOBALS | BASELINE_USER_GLOBALS | allow
        self.record = record
        self.depth = depth
        self.call_findings = 0
        self.global_findings: dict[Code, int] = {}
        self.seen_calls: set[str] = set()

    def run(self, vm: VmResult) -> None:
        cache: dict[tuple[str, str, str, str], tuple[GlobalStatus, Threat | None, str, str]] = {}
        for use in vm.globals:
            key = (use.module, use.name, use.raw_module, use.raw_name)
            judged = cache.get(key)
            if judged is None:
                judged = cache[key] = self.judge_use(use)
            self.note(use, *judged)
        judged_funcs: dict[int, Threat] = {}   # the VM shares one Global per GLOBAL opcode
        for call in vm.calls:
            self.call(call, judged_funcs)
        counts: dict[Code, int] = {}
        for code, message, offset in vm.notes:
            n = counts[code] = counts.get(code, 0) + 1
            if n <= self.limits.max_notes_per_code:
                self.an.add(code, message, record=self.record, offset=offset)
        for code, n in counts.items():
            if n > self.limits.max_notes_per_code:
                self.an.add(code, f"... and {n - self.limits.max_notes_per_code} more like the "
                            "above", record=self.record)

    # -- globals -----------------------------------------------------------------------------
    def judge_use(self, use: GlobalUse) -> tuple[GlobalStatus, Threat | None, str, str]:
        """(status, threat, module, name) — module/name as torch's unpickler names them.

        benign/unknown is torch's reading; CPython's reading and the raw bytes can only
        escalate to dangerous (a raw `__builtin__.int` is not "unknown" for that)."""
        tm, tn = torch_map(use.raw_module, use.raw_name)
        worst = classify_global(tm, tn)
        if worst.status != "dangerous":
            for other in (classify_global(use.module, use.name),
                          classify_global(use.raw_module, use.raw_name)):
                if other.status == "dangerous":
                    worst = other
                    break
        if worst.status == "dangerous":
            return "dangerous", worst, tm, tn
        if f"{tm}.{tn}" in self.allowed and tm not in BLOCKED_MODULES:
            return "allowed", None, tm, tn
        return worst.status, worst, tm, tn

    def note(self, use: GlobalUse, status: GlobalStatus, threat: Threat | None,
             module: str, name: str) -> None:
        entry = self.an.globals.get((module, name))
        if entry is not None and _RANK.get(entry.status, -1) >= _RANK.get(status, -1):
            entry.count += 1
            return
        reason = threat.reason if threat else None
        if entry is None:
            self.an.note_global(module, name, status, record=self.record, offset=use.offset,
                                reason=reason)
        else:   # a worse reading of the same name (another raw spelling): escalate
            entry.count += 1
            entry.status, entry.reason = status, reason
        if threat is None:
            return
        shown = f"{module}.{name}"
        raw = f"{use.raw_module}.{use.raw_name}"
        spelled = f" (written {raw!r})" if raw != shown else ""
        what = {"dangerous": "dangerous global", "benign": "commonly benign global outside the "
                "weights-only allowlist", "unknown": "global outside the weights-only allowlist"}
        n = self.global_findings[threat.code] = self.global_findings.get(threat.code, 0) + 1
        if n > self.limits.max_global_findings:
            if n == self.limits.max_global_findings + 1:
                self.an.add(threat.code, f"more globals like the above (only the first "
                            f"{self.limits.max_global_findings} are listed; all are in `globals`)",
                            record=self.record, offset=use.offset, severity=threat.severity)
            return
        self.an.add(threat.code, f"{what[threat.status]} {shown}{spelled}: {threat.reason}"[:500],
                    record=self.record, offset=use.offset, severity=threat.severity)

    # -- calls ---------------------------------------------------------------------------------
    def call(self, call: Call, judged: dict[int, Threat]) -> None:
        func = call.func
        if type(func) is Global:
            threat = judged.get(id(func))
            if threat is None:
                threat = judged[id(func)] = classify_global(func.module, func.name)
            if threat.status == "dangerous":
                shown = f"{func.full}({preview(call.args)}){self.detail(call)}"
                self.flag(f"call:{shown}", call, threat.severity, f"{call.opcode} calls {shown}")
                if threat.code is Code.PICKLE_NESTED_DESERIALIZER:
                    self.nested(call)
            self.scan_args(call, func.full)
        elif type(func) is Call:
            path = resolve_path(func)
            severity = Severity.CRITICAL if path and classify_path(path).status == "dangerous" \
                else Severity.HIGH
            shown = path or preview(func)
            self.flag(f"computed:{shown}", call, severity,
                      f"{call.opcode} calls a callable computed by another call: {shown}"
                      f"({preview(call.args)})")
        elif type(func) is ExtRef:
            self.flag(f"ext:{func.code}", call, Severity.HIGH,
                      f"{call.opcode} calls extension code {func.code}: the callable is "
                      "whatever copyreg's registry holds at load time")
        elif type(func) is PersId:
            target = module_pid_class(func)
            if target is None:
                self.flag(f"persid:{func.offset}", call, Severity.HIGH,
                          f"{call.opcode} calls an object returned by persistent_load")
            else:   # legacy torch.save(model): ('module', cls, file, source) -> cls
                threat = classify_global(target.module, target.name)
                if threat.status == "dangerous":
                    self.flag(f"call:{target.full}", call, threat.severity,
                              f"{call.opcode} calls {target.full} through a 'module' persistent id")
        for state in call.state:
            self.check_state(call, state)

    def detail(self, call: Call) -> str:
        """A resolved target for getattr/attrgetter/import calls, e.g. ' -> os.system'."""
        path = resolve_path(call)
        return f" -> {path}" if path else ""

    def scan_args(self, call: Call, func_name: str) -> None:
        """A dangerous global passed (not called) to another call: `_rebuild_from_type_v2(eval,
        ...)`, `functools.partial(os.system, ...)` — the callee calls it for the attacker."""
        todo: list[tuple[Any, int]] = [(call.args, 0)]
        budget = 256
        while todo and budget > 0:
            value, level = todo.pop()
            t = type(value)
            items = value.values() if t is dict else value if t is tuple or t is list else (value,)
            for item in items:
                budget -= 1
                if budget <= 0:
                    break
                ti = type(item)
                if ti is Global:
                    threat = classify_global(item.module, item.name)
                    if threat.status == "dangerous":
                        self.flag(f"arg:{func_name}:{item.full}", call, threat.severity,
                                  f"{item.full} is passed to {func_name}, which may call it "
                                  f"({threat.reason})")
                elif level < 3 and (ti is tuple or ti is list or ti is dict):
                    todo.append((item, level + 1))

    def check_state(self, call: Call, state: Any) -> None:
        """BUILD with `{'__setstate__': f}` plants f; the next BUILD on the object calls it."""
        dicts = [state] if type(state) is dict else [
            s for s in state[:2] if type(s) is dict] if type(state) is tuple else []
        for d in dicts:
            # look the few names up rather than walk the keys: one memoized state of 10k keys
            # applied by 100k BUILDs must not cost 1 G steps
            for key in _PLANTED_DUNDERS:
                if key in d:
                    self.flag(f"state:{call.offset}:{key}", call, Severity.CRITICAL,
                              f"BUILD sets {key} on an object: a later BUILD or call runs "
                              f"{preview(d[key])}")

    def flag(self, key: str, call: Call, severity: Severity, message: str) -> None:
        if key in self.seen_calls:
            return
        self.seen_calls.add(key)
        self.call_findings += 1
        if self.call_findings < self.limits.max_call_findings:
            self.an.add(Code.PICKLE_DANGEROUS_CALL, message[:500], record=self.record,
                        offset=call.offset, severity=severity)
        elif self.call_findings == self.limits.max_call_findings:
            self.an.add(Code.PICKLE_DANGEROUS_CALL, "more dangerous calls follow (not listed)",
                        record=self.record, offset=call.offset, severity=severity)

    def nested(self, call: Call) -> None:
        """Interpret an inline nested pickle (`pickle.loads(b'...')`) and judge it as well."""
        if self.depth >= self.limits.max_nested_pickle_depth:
            return
        data = payload(call.args[0] if type(call.args) is tuple and call.args else None, 0)
        if data is None or data[:1] not in _PICKLE_STARTS:
            return      # a zip or .npy (judged as a whole file elsewhere), or not a pickle
        limits = self.an.options.limits
        if len(data) > limits.max_pickle_bytes:
            return
        # one memoized payload passed to pickle.loads 1,000 times, each calling it 1,000
        # times more, is a million interpretations of a 12 KB file: each payload once, and
        # a bounded number in all (the call itself is already a finding)
        seen = self.an.nested_pickles
        import hashlib  # only for inline pickles: not a cold-start cost of every scan

        digest = hashlib.blake2b(data, digest_size=16).digest()
        if digest in seen:
            return
        seen.add(digest)
        max_nested = self.limits.max_nested_pickles
        if len(seen) > max_nested:
            if len(seen) == max_nested + 1:
                self.an.add(Code.PICKLE_NESTED_DESERIALIZER, f"more than {max_nested} "
                            "inline pickles: the rest are not interpreted", record=self.record,
                            offset=call.offset)
            return
        # the interpreter only for an inline pickle: a clean file's fast lane judges its
        # globals here without loading the VM (tests/core/scan/test_cold_start.py)
        from ckptguard.core.pickle.vm import run_vm

        record = f"{self.record or ''}@{call.offset}:nested"
        inner = run_vm(data, base_offset=0, limits=limits)
        _Assessor(self.an, self.allow, record, self.depth + 1).run(inner)
