"""core/formats/export/archive.py + export_verifier.py on real torch.export archives and edits."""

from __future__ import annotations

import copy
import io
import json
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from ckptguard.core.errors import Code
from ckptguard.core.formats.export.expressions import expr_is_plain
from ckptguard.core.formats.export.verifier import target_problem
from ckptguard.core.io.source import BytesSource
from ckptguard.core.report import Report
from ckptguard.core.scan import scan_source
from tests.core.formats.fmt_cases import pt2_bytes, zip_json, zip_replace

pytestmark = pytest.mark.torch

MODEL = "models/model.json"
WCFG = "data/weights/model_weights_config.json"
CCFG = "data/constants/model_constants_config.json"


def scan(data: bytes) -> Report:
    return scan_source(BytesSource(data, name="m.pt2"))


def codes(report: Report) -> set[Code]:
    return {f.code for f in report.findings}


def rules(report: Report) -> set[str]:
    return {f.message.split("]")[0].lstrip("[") for f in report.findings
            if f.code in (Code.PT2_VERIFIER, Code.PT2_UNSAFE_TARGET)}


def edit_json(data: bytes, rel: str, fn: Callable[[Any], None]) -> bytes:
    doc = copy.deepcopy(zip_json(data, rel))
    fn(doc)
    return zip_replace(data, {rel: json.dumps(doc).encode()})


def test_clean_archive_is_safe_with_a_full_manifest(pt2_full: bytes) -> None:
    report = scan(pt2_full)
    assert report.format == "torch-export"
    assert report.verdict == "safe", [f.to_json() for f in report.findings]
    kinds = {t.name: t.kind for t in report.tensors}
    assert kinds == {"lin.weight": "parameter", "lin.bias": "parameter", "running": "buffer",
                     "const": "constant", "np_buf": "constant"}
    summary = report.extra["pt2"]["models"]["model"]
    assert summary["verifiers"] == ["TRAINING"] and summary["verifier"] == []
    assert "s77" in json.dumps(summary["range_constraints"]) or summary["range_constraints"]


def test_tied_and_view_weights_offsets(pt2_tied: bytes) -> None:
    import torch

    report = scan(pt2_tied)
    assert report.verdict == "safe", [f.to_json() for f in report.findings]
    by = {t.name: t for t in report.tensors}
    # tied weights share one record; the view buffer starts storage_offset elements in
    assert by["head.weight"].storage == by["emb.weight"].storage
    assert by["head.weight"].data_offset == by["emb.weight"].data_offset
    view = by["view"]
    assert view.storage_offset == 5 and view.stride == [4, 1]
    storage = next(s for s in report.storages if s.key == view.storage)
    assert view.data_offset == storage.data_offset + 5 * 8
    full = torch.arange(12, dtype=torch.float64)
    assert pt2_tied[storage.data_offset : storage.data_offset + storage.nbytes] == full.numpy().tobytes()
    assert by["bf"].dtype == "bfloat16" and by["h16"].dtype == "float16" and by["ints"].dtype == "int32"


def test_aten_dialect_archive_is_clean(pt2_conv_aten: bytes) -> None:
    report = scan(pt2_conv_aten)
    assert report.verdict == "safe", [f.to_json() for f in report.findings]
    assert report.extra["pt2"]["models"]["model"]["verifiers"] == ["ATEN"]


def _drop_weight(doc: Any) -> None:
    del doc["config"]["lin.bias"]


def _param_flag(doc: Any) -> None:
    doc["config"]["lin.weight"]["is_param"] = False


def _input_specs_short(doc: Any) -> None:
    doc["graph_module"]["signature"]["input_specs"].pop()


def _input_name(doc: Any) -> None:
    doc["graph_module"]["graph"]["inputs"][0]["as_tensor"]["name"] = "renamed"


def _persistence_none(doc: Any) -> None:
    for spec in doc["graph_module"]["signature"]["input_specs"]:
        if "buffer" in spec:
            spec["buffer"]["persistent"] = None


def _nonpersistent_in_state(doc: Any) -> None:
    for spec in doc["graph_module"]["signature"]["input_specs"]:
        if "buffer" in spec and spec["buffer"]["buffer_name"] == "running":
            spec["buffer"]["persistent"] = False


def _constant_missing(doc: Any) -> None:
    for spec in doc["graph_module"]["signature"]["input_specs"]:
        if "tensor_constant" in spec:
            spec["tensor_constant"]["tensor_constant_name"] = "nope"


def _outputs_count(doc: Any) -> None:
    doc["graph_module"]["signature"]["output_specs"].append(
        {"user_output": {"arg": {"as_tensor": {"name": "extra"}}}})


def _user_output_order(doc: Any) -> None:
    doc["graph_module"]["signature"]["output_specs"][0]["user_output"]["arg"]["as_tensor"]["name"] = "x"


def _custom_ns(doc: Any) -> None:
    doc["graph_module"]["graph"]["nodes"][1]["target"] = "torch.ops.mylib.evil.default"


def _builtin_target(doc: Any) -> None:
    doc["graph_module"]["graph"]["nodes"][1]["target"] = "builtins.print"


def _schema(doc: Any) -> None:
    doc["schema_version"]["major"] = 7


def _call_graph(doc: Any) -> None:
    doc["graph_module"]["module_call_graph"][0]["signature"]["inputs"] = [
        {"as_tensor": {"name": "ghost"}}]


VERIFIER_EDITS = [
    (WCFG, _drop_weight, "parameter-in-state-dict"),
    (WCFG, _param_flag, "parameter-in-state-dict"),
    (MODEL, _input_specs_short, "inputs-match-specs"),
    (MODEL, _input_name, "inputs-match-specs"),
    (MODEL, _persistence_none, "buffer-persistence"),
    (MODEL, _nonpersistent_in_state, "buffer-persistence"),
    (MODEL, _constant_missing, "constant-present"),
    (MODEL, _outputs_count, "outputs-match-specs"),
    (MODEL, _user_output_order, "user-output-order"),
    (MODEL, _custom_ns, "operator-allowed"),
    (MODEL, _builtin_target, "operator-allowed"),
    (MODEL, _schema, "schema-version"),
    (MODEL, _call_graph, "module-call-graph"),
]


@pytest.mark.parametrize(("rel", "edit", "rule"), VERIFIER_EDITS,
                         ids=[e[1].__name__ for e in VERIFIER_EDITS])
def test_verifier_rule_violations(pt2_full: bytes, rel: str, edit: Callable[[Any], None],
                                  rule: str) -> None:
    report = scan(edit_json(pt2_full, rel, edit))
    assert rule in rules(report), [f.to_json() for f in report.findings]
    assert Code.PT2_VERIFIER in codes(report)
    assert report.verdict in ("suspicious", "invalid")


def test_mutation_outputs_rule_on_a_decomposed_program() -> None:
    data = pt2_bytes("full", decompose=True)
    clean = scan(data)
    assert clean.verdict == "safe", [f.to_json() for f in clean.findings]

    def bad_mutation(doc: Any) -> None:
        for spec in doc["graph_module"]["signature"]["output_specs"]:
            if "buffer_mutation" in spec:
                spec["buffer_mutation"]["buffer_name"] = "no_such_buffer"

    assert "mutation-outputs" in rules(scan(edit_json(data, MODEL, bad_mutation)))

    def inplace(doc: Any) -> None:
        doc["graph_module"]["graph"]["nodes"][0]["target"] = "torch.ops.aten.add_.Tensor"

    assert "functional-ops" in rules(scan(edit_json(data, MODEL, inplace)))


def test_torch_callable_target_is_unsafe(pt2_full: bytes) -> None:
    def evil(doc: Any) -> None:
        doc["graph_module"]["graph"]["nodes"][1]["target"] = "torch.os.system"

    report = scan(edit_json(pt2_full, MODEL, evil))
    assert Code.PT2_UNSAFE_TARGET in codes(report)
    assert report.verdict == "unsafe"


def test_sympy_expression_outside_the_grammar(pt2_full: bytes) -> None:
    def evil(doc: Any) -> None:
        meta = doc["graph_module"]["graph"]["tensor_values"]["x"]
        meta["sizes"][0]["as_expr"]["expr_str"] = "__import__('os').system('id')"

    report = scan(edit_json(pt2_full, MODEL, evil))
    assert Code.PT2_SYMPY_EXPR in codes(report)
    assert not report.weights_only.loadable


@pytest.mark.parametrize(("expr", "ok"), [
    ("Symbol('s77', positive=True, integer=True)", True),
    ("2*s0 + 1", True), ("FloorDiv(s0, 2)", True), ("Max(1, s0)", True), ("s0**2 - s1", True),
    ("Mod(s0, 8)", True), ("s0.__class__", False), ("__import__('os')", False),
    ("Symbol('s0').func", False), ("lambda: 1", False), ("Max('x')", False),
    ("exec('1')", False), ("s0; s1", False), ("s0[0]", False), ("Symbol(\"s0\")", False),
])
def test_expr_grammar(expr: str, ok: bool) -> None:
    assert expr_is_plain(expr) is ok


def test_guards_code_is_flagged(pt2_full: bytes) -> None:
    guards = ["L['x'].size()[0] > 1"]
    report = scan(edit_json(pt2_full, MODEL, lambda d: d.__setitem__("guards_code", guards)))
    assert Code.PT2_GUARDS_CODE in codes(report)


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return (os.system, ("echo pwned",))


def _torch_save(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_use_pickle_weight_is_scanned_and_flagged(pt2_full: bytes) -> None:
    import torch

    def flag(doc: Any) -> None:
        doc["config"]["lin.bias"]["use_pickle"] = True

    data = edit_json(pt2_full, WCFG, flag)
    path = zip_json(pt2_full, WCFG)["config"]["lin.bias"]["path_name"]
    benign = zip_replace(data, {f"data/weights/{path}": _torch_save(torch.ones(3))})
    report = scan(benign)
    assert Code.PT2_UNSAFE_PAYLOAD in codes(report) and report.verdict == "suspicious"
    evil = zip_replace(data, {f"data/weights/{path}": _torch_save(_Boom())})
    report = scan(evil)
    assert report.verdict == "unsafe"
    assert any(g.name == "system" for g in report.globals)


def test_opaque_object_constant_is_unsafe(pt2_full: bytes) -> None:
    def add(doc: Any) -> None:
        doc["config"]["obj"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True,
                                "tensor_meta": None}

    data = edit_json(pt2_full, CCFG, add)
    data = zip_replace(data, {}, add={"data/constants/opaque_obj_0": pickle.dumps(_Boom())})
    report = scan(data)
    assert Code.PT2_UNSAFE_PAYLOAD in codes(report)
    assert report.verdict == "unsafe"


def test_custom_obj_and_unknown_constant_kinds(pt2_full: bytes) -> None:
    def add(doc: Any) -> None:
        doc["config"]["co"] = {"path_name": "custom_obj_0", "is_param": False, "use_pickle": True,
                               "tensor_meta": None}
        doc["config"]["weird"] = {"path_name": "weird_0", "is_param": False, "use_pickle": False,
                                  "tensor_meta": None}

    data = zip_replace(edit_json(pt2_full, CCFG, add), {},
                       add={"data/constants/custom_obj_0": _torch_save({"a": 1}),
                            "data/constants/weird_0": b"x"})
    report = scan(data)
    msgs = [f.message for f in report.findings]
    assert any("TorchScript object" in m for m in msgs)
    assert any("Unsupported constant type" in m for m in msgs)


def test_sample_inputs_not_weights_only_loadable(pt2_full: bytes) -> None:
    data = zip_replace(pt2_full, {"data/sample_inputs/model.pt": _torch_save((_Boom(),))})
    report = scan(data)
    assert Code.PT2_UNSAFE_PAYLOAD in codes(report)
    assert report.verdict == "unsafe"


def test_missing_records(pt2_full: bytes) -> None:
    report = scan(zip_replace(pt2_full, {"data/sample_inputs/model.pt": None, WCFG: None}))
    assert Code.PT2_MISSING_RECORD in codes(report)
    assert report.verdict == "invalid"


def test_bad_archive_format_and_weight_geometry(pt2_full: bytes) -> None:
    assert Code.PT2_BAD_ARCHIVE in codes(scan(zip_replace(pt2_full, {"archive_format": b"zip"})))
    path = zip_json(pt2_full, WCFG)["config"]["lin.weight"]["path_name"]
    short = scan(zip_replace(pt2_full, {f"data/weights/{path}": b"\0" * 7}))
    assert Code.PT2_BAD_ARCHIVE in codes(short)

    def shift(doc: Any) -> None:
        doc["config"]["lin.weight"]["tensor_meta"]["storage_offset"] = {"as_int": 2}

    report = scan(edit_json(pt2_full, WCFG, shift))
    assert Code.TORCH_TENSOR_OUT_OF_BOUNDS in codes(report)


def test_legacy_weights_file_is_flagged(pt2_full: bytes) -> None:
    import torch

    data = zip_replace(pt2_full, {}, add={"data/weights/model.pt": _torch_save({"w": torch.ones(2)})})
    report = scan(data)
    assert any("legacy weights" in f.message for f in report.findings)


def test_compressed_archive_has_no_offsets(pt2_full: bytes) -> None:
    src_names = zip_replace(pt2_full, {}, compress=True)
    report = scan(src_names)
    assert report.tensors and all(t.data_offset is None for t in report.tensors)


def test_target_problem_table() -> None:
    assert target_problem("torch.ops.aten.add.Tensor", training=False) is None
    assert target_problem("torch.ops.higher_order.cond", training=False) is None
    assert target_problem("_operator.getitem", training=False) is None
    assert target_problem("torch.sym_max", training=False) is None
    assert target_problem("torch.ops.aten.add_.Tensor", training=True) is None
    problem = target_problem("torch.ops.aten.add_.Tensor", training=False)
    assert problem is not None and problem[0] == "functional-ops"
    problem = target_problem("torch.load", training=True)
    assert problem is not None and problem[2] is True
    problem = target_problem("#custom:op", training=True)
    assert problem is not None and problem[2] is False


def test_higher_order_subgraphs_are_checked() -> None:
    data = pt2_bytes("cond")
    report = scan(data)
    assert report.verdict == "safe", [f.to_json() for f in report.findings]
    assert "torch.ops.higher_order.cond" in report.extra["pt2"]["models"]["model"]["targets"]

    def evil(doc: Any) -> None:
        for node in doc["graph_module"]["graph"]["nodes"]:
            for inp in node["inputs"]:
                sub = inp["arg"].get("as_graph")
                if sub:
                    sub["graph"]["nodes"][0]["target"] = "torch.hub.load"

    report = scan(edit_json(data, MODEL, evil))
    assert Code.PT2_UNSAFE_TARGET in codes(report) and report.verdict == "unsafe"


@pytest.mark.parametrize("expr", ["2**99999999", "s0**100000", "12345678901234567890*s0",
                                  "(2**30)**(2**30)"])
def test_expr_grammar_refuses_number_blowups(expr: str) -> None:
    assert not expr_is_plain(expr)


def test_nested_pt2_is_not_recursed(pt2_full: bytes) -> None:
    report = scan(zip_replace(pt2_full, {"data/sample_inputs/model.pt": pt2_full}))
    assert any("nested torch.export archive" in f.message for f in report.findings)


def test_findings_and_summary_stay_bounded(pt2_full: bytes) -> None:
    def many(doc: Any) -> None:
        for i in range(300):
            doc["config"][f"p{i}"] = {"path_name": "weight_0", "is_param": False, "use_pickle": True}

    def huge(doc: Any) -> None:
        doc["range_constraints"] = {f"s{i}": {"min_val": 0, "max_val": i} for i in range(5000)}

    data = edit_json(edit_json(pt2_full, WCFG, many), MODEL, huge)
    report = scan(data)
    unsafe = [f for f in report.findings if f.code is Code.PT2_UNSAFE_PAYLOAD]
    assert 100 <= len(unsafe) <= 102
    summary = report.extra["pt2"]["models"]["model"]
    assert isinstance(summary["range_constraints"], str) and "omitted" in summary["range_constraints"]


# -- red team round 3: expr_str that runs code under sympy.sympify is unsafe ------------------

def set_first_size(expr: str) -> Callable[[Any], None]:
    def edit(doc: Any) -> None:
        meta = doc["graph_module"]["graph"]["tensor_values"]["x"]
        meta["sizes"][0] = {"as_expr": {"expr_str": expr, "hint": {"as_int": 2}}}
    return edit


@pytest.mark.parametrize("expr", [
    "__import__('os').system('touch x')",
    "exec(chr(105) + chr(100))",                          # no dunder, no quotes
    "Symbol('s0').func",                                   # attribute access
    "Max('s0', 1)",                                        # sympify parses the string again
    "(lambda: 1)()",
    "ｅｘｅｃ(chr(49))",                                    # NFKC folds to exec
    "Integer(s0)(1)",                                      # a call of a computed callable
    "breakpoint()",
])
def test_sympy_expr_with_code_is_unsafe(pt2_full: bytes, expr: str) -> None:
    report = scan(edit_json(pt2_full, MODEL, set_first_size(expr)))
    assert report.verdict == "unsafe", [f.to_json() for f in report.findings]
    assert {Code.PT2_SYMPY_EXPR, Code.PT2_SYMPY_EVAL} <= codes(report)
    assert "sympy.sympify" in next(f.message for f in report.findings
                                   if f.code is Code.PT2_SYMPY_EVAL)
    assert not report.weights_only.loadable


@pytest.mark.parametrize("expr", ["2**99999999", "s0; s1", "s0[0]", 'Symbol("s0")',
                                  "12345678901234567890*s0", "Pow(999999999999, 999999999999)"])
def test_sympy_expr_outside_the_grammar_without_code_stays_suspicious(pt2_full: bytes,
                                                                      expr: str) -> None:
    report = scan(edit_json(pt2_full, MODEL, set_first_size(expr)))
    assert report.verdict == "suspicious", [f.to_json() for f in report.findings]
    assert Code.PT2_SYMPY_EXPR in codes(report) and Code.PT2_SYMPY_EVAL not in codes(report)


@pytest.mark.parametrize("expr", [
    # what torch 2.13's serializer writes (sympy.srepr), captured from real exports
    "Symbol('s77', positive=True, integer=True)",
    "Symbol('zuf0')",
    "Symbol('u0', integer=True)",
    "Add(Mod(Symbol('s77', positive=True, integer=True), Integer(5)), Integer(1))",
    "Add(Mul(Symbol('s17', positive=True, integer=True), Symbol('s77', positive=True, "
    "integer=True)), Integer(-3))",
    "FloorDiv(Symbol('s77', positive=True, integer=True), Integer(2))",
    "Mul(Integer(6), Max(Integer(1), TruncToInt(Mul(Float('1.5', precision=53), "
    "ToFloat(Symbol('s77', positive=True, integer=True))))))",
    "Mul(Symbol('zuf0'), ToFloat(Symbol('s77', positive=True, integer=True)))",
    "Pow(Symbol('s77', positive=True, integer=True), Integer(2))",
    "Pow(Symbol('s0', integer=True), Rational(1, 2))",
    "GreaterThan(Symbol('u0', integer=True), Integer(0))",
    "Piecewise(ExprCondPair(Symbol('s0', integer=True), StrictGreaterThan(Symbol('s0', "
    "integer=True), Integer(1))), ExprCondPair(Integer(0), true))",
    "OpaqueUnaryFn_sqrt(Symbol('s0', integer=True))",
    "ModularIndexing(Symbol('s0', integer=True), Integer(2), Integer(4))",
    "-int_oo",
])
def test_expr_grammar_accepts_what_torch_writes(expr: str) -> None:
    assert expr_is_plain(expr)


@pytest.mark.parametrize(("expr", "evidence"), [
    ("s0.__class__", "dunder"), ("getattr(s0, 'x')", "string literal"),
    ("vars()", "call of 'vars'"), ("s0 .func", "attribute"), ("2.5.real", "attribute"),
    ("Symbol(f's0')", "string literal"), ("lambda: 1", "lambda"),
    ("(exec)(chr(49))", "call of 'chr'"), ("Symbol('s0')(1)", "computed callable"),
    ("s0; s1", None), ("2**99999999", None), ("x!", None), ("1.e5*s0 + s0[0]", None),
])
def test_code_evidence(expr: str, evidence: str | None) -> None:
    from ckptguard.core.formats.export.expressions import code_evidence as _code_evidence

    why = _code_evidence(expr)
    assert (why is None) if evidence is None else (why is not None and evidence in why)


def test_code_evidence_is_linear_on_huge_expressions() -> None:
    """Ten times the input costs about ten times the CPU (a backtracking pattern costs 100x):
    a ratio of this process's CPU time, so a loaded machine does not decide it."""
    import time

    from ckptguard.core.formats.export.expressions import code_evidence as _code_evidence

    def cpu_seconds(n: int) -> float:
        start = time.process_time()
        assert _code_evidence("a" * 2 * n + " " * 2 * n + "x") is None
        assert _code_evidence(")" * n + " " * n) is None
        assert _code_evidence("s0 +" * (n // 2) + " exec (1)") is not None
        return time.process_time() - start

    small = max(min(cpu_seconds(100_000) for _ in range(3)), 1e-3)
    assert cpu_seconds(1_000_000) < 40 * small


def test_real_export_with_float_and_unbacked_symbols_has_plain_exprs() -> None:
    """Dim.AUTO + scale_factor + .item(): Float('1.5', precision=53), Symbol('zuf0'), Mod, //."""
    import torch

    class M(torch.nn.Module):
        def forward(self, x: Any) -> Any:
            y = torch.nn.functional.interpolate(x.unsqueeze(0).unsqueeze(0), scale_factor=1.5)
            return y, x[: x.shape[0] // 2] * (x.shape[0] % 5), x.float().sum().item() * x.shape[0]

    ep = torch.export.export(M(), (torch.randn(6, 4),),
                             dynamic_shapes={"x": {0: torch.export.Dim.AUTO}})
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    text = json.dumps(zip_json(buf.getvalue(), MODEL))
    assert "Float(" in text and "zuf" in text and "FloorDiv(" in text
    report = scan(buf.getvalue())
    assert not codes(report) & {Code.PT2_SYMPY_EXPR, Code.PT2_SYMPY_EVAL}, \
        [f.to_json() for f in report.findings]
    assert report.verdict != "unsafe"
