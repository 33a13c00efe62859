"""core.threats.assess: the knowledge base and the assessment of interpreted pickles."""

from __future__ import annotations

import argparse
import collections
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptguard.core.errors import Code, Severity
from ckptguard.core.threats.assess import Threat, classify_global, classify_path
from tests.builders.pickle_asm import asm
from tests.builders.torchsave import torch_data_pkl


@pytest.mark.parametrize(("module", "name", "code"), [
    ("os", "system", Code.PICKLE_DANGEROUS_GLOBAL),
    ("os.path", "join", Code.PICKLE_DANGEROUS_GLOBAL),        # module prefix rule
    ("posix", "popen", Code.PICKLE_DANGEROUS_GLOBAL),
    ("subprocess", "run", Code.PICKLE_DANGEROUS_GLOBAL),
    ("builtins", "exec", Code.PICKLE_DANGEROUS_GLOBAL),
    ("builtins", "__import__", Code.PICKLE_DANGEROUS_GLOBAL),
    ("builtins", "getattr", Code.PICKLE_DANGEROUS_GLOBAL),
    ("runpy", "_run_code", Code.PICKLE_DANGEROUS_GLOBAL),
    ("ctypes", "CDLL", Code.PICKLE_DANGEROUS_GLOBAL),
    ("socket", "create_connection", Code.PICKLE_DANGEROUS_GLOBAL),
    ("requests.api", "get", Code.PICKLE_DANGEROUS_GLOBAL),
    ("operator", "attrgetter", Code.PICKLE_DANGEROUS_GLOBAL),
    ("functools", "reduce", Code.PICKLE_DANGEROUS_GLOBAL),
    ("types", "CodeType", Code.PICKLE_DANGEROUS_GLOBAL),
    ("pickle", "loads", Code.PICKLE_NESTED_DESERIALIZER),
    ("_pickle", "Unpickler", Code.PICKLE_NESTED_DESERIALIZER),
    ("dill._dill", "_create_code", Code.PICKLE_NESTED_DESERIALIZER),
    ("marshal", "loads", Code.PICKLE_NESTED_DESERIALIZER),
    ("torch", "load", Code.PICKLE_NESTED_DESERIALIZER),
    ("torch.jit", "load", Code.PICKLE_NESTED_DESERIALIZER),
    ("torch.hub", "load", Code.PICKLE_DANGEROUS_GLOBAL),
    ("numpy", "load", Code.PICKLE_NESTED_DESERIALIZER),
    ("joblib", "load", Code.PICKLE_NESTED_DESERIALIZER),
    ("sys", "modules", Code.PICKLE_DANGEROUS_GLOBAL),
    ("pydoc", "locate", Code.PICKLE_DANGEROUS_GLOBAL),
    ("platform", "popen", Code.PICKLE_DANGEROUS_GLOBAL),
    ("asyncio.subprocess", "create_subprocess_shell", Code.PICKLE_DANGEROUS_GLOBAL),
    ("keras.layers", "Lambda", Code.PICKLE_DANGEROUS_GLOBAL),           # runs a stored lambda
    ("_tkinter", "create", Code.PICKLE_DANGEROUS_GLOBAL),               # Tcl eval
    ("pandas.io.pickle", "read_pickle", Code.PICKLE_NESTED_DESERIALIZER),   # longest rule wins
    ("pandas.io.parsers", "read_csv", Code.PICKLE_DANGEROUS_GLOBAL),
    ("linecache", "getline", Code.PICKLE_DANGEROUS_GLOBAL),
    ("torch", "Tensor.__reduce_ex__", Code.PICKLE_DANGEROUS_GLOBAL),   # dotted dunder
    ("pathlib", "Path.write_bytes", Code.PICKLE_DANGEROUS_GLOBAL),     # dotted attribute
])
def test_dangerous(module: str, name: str, code: Code) -> None:
    t = classify_global(module, name)
    assert (t.status, t.code) == ("dangerous", code)
    assert t.severity in (Severity.CRITICAL, Severity.HIGH) and t.reason


@pytest.mark.parametrize(("module", "name"), [
    ("argparse", "Namespace"), ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy._core.multiarray", "scalar"), ("numpy.dtypes", "Float32DType"),
    ("collections", "defaultdict"), ("builtins", "slice"), ("builtins", "range"),
    ("builtins", "frozenset"), ("builtins", "bytes"), ("pathlib", "PosixPath"),
    ("datetime", "datetime"), ("torch", "float"), ("torch", "half"),
    ("torch._utils", "_rebuild_xla_tensor"), ("torch.nn.modules.linear", "Linear"),
    ("omegaconf.dictconfig", "DictConfig"),
    ("lightning.fabric.utilities.data", "AttributeDict"),
    ("transformers.training_args", "TrainingArguments"),
])
def test_benign(module: str, name: str) -> None:
    t = classify_global(module, name)
    assert (t.status, t.code, t.severity) == ("benign", Code.PICKLE_BENIGN_GLOBAL, Severity.LOW)


@pytest.mark.parametrize(("module", "name"), [
    ("__main__", "Net"), ("copyreg", "_reconstructor"), ("mypkg.models", "Config"),
    ("numpy.dtypes", "Float32DType.mro"),          # benign module, dotted name: not benign
    ("torch.nn.modules.linear", "__version__"),
    ("builtins", "object"), ("codecs", "decode"),
    ("pandas.core.frame", "DataFrame"), ("pandas._libs.internals", "_unpickle_block"),
])
def test_unknown(module: str, name: str) -> None:
    assert classify_global(module, name).status == "unknown"


@pytest.mark.parametrize(("module", "name", "label"), [
    ("оs", "system", "confusable"),            # Cyrillic о
    ("ｏｓ", "system", "NFKC"),                 # full-width
    ("o\u200bs", "system", "control"),           # zero-width space inside
    (" subprocess", "Popen", "whitespace"),
    ("os\nsystem", "x", "whitespace-split"),
    ("__builtin__", "eval", "Python 2 name mapping"),
    ("commands", "getoutput", "runs commands"),
])
def test_spelling_variants_are_judged(module: str, name: str, label: str) -> None:
    t = classify_global(module, name)
    assert t.status == "dangerous" and label in t.reason


def test_classify_path_splits_anywhere() -> None:
    assert classify_path("os.system").status == "dangerous"
    assert classify_path("torch.hub.load").status == "dangerous"
    assert classify_path("collections.OrderedDict").status == "unknown"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40), st.text(max_size=40))
def test_classify_total_and_never_safe(module: str, name: str) -> None:
    t = classify_global(module, name)
    assert isinstance(t, Threat) and t.status in ("dangerous", "benign", "unknown")


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["os", "subprocess", "builtins", "pickle", "torch.hub", "sys"]),
       st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True), min_size=1, max_size=3))
def test_dangerous_modules_cover_their_submodules(module: str, tail: list[str]) -> None:
    if module == "builtins":
        tail = ["eval", *tail]
    assert classify_global(f"{module}.{'.'.join(tail[:-1])}".rstrip("."), tail[-1]).status == \
        "dangerous"


# -- assess -------------------------------------------------------------------------------------

def test_real_state_dict_is_all_allowed(assess_pickle: Any) -> None:
    import torch

    sd = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2)).state_dict()
    sd["q"] = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)
    an = assess_pickle(torch_data_pkl(sd))
    assert an.findings == []
    assert an.globals and all(g.status == "allowed" for g in an.globals.values())
    assert an.globals[("torch._utils", "_rebuild_tensor_v2")].count == 1    # memoized by pickle


def test_namespace_checkpoint_is_benign_not_safe(assess_pickle: Any) -> None:
    an = assess_pickle(torch_data_pkl({"args": argparse.Namespace(lr=0.1)}))
    entry = an.globals[("argparse", "Namespace")]
    assert entry.status == "benign" and entry.reason
    assert [f.code for f in an.findings] == [Code.PICKLE_BENIGN_GLOBAL]


def test_one_finding_per_distinct_global(assess_pickle: Any) -> None:
    data = pickle.dumps([collections.defaultdict(int)], protocol=0)   # memoized: one GLOBAL
    assert assess_pickle(data).globals[("collections", "defaultdict")].count == 1
    items: list[Any] = [("PROTO", 2), "EMPTY_LIST", "MARK"]
    items += [("GLOBAL", "collections", "defaultdict"), ("GLOBAL", "__main__", "X")] * 5
    an = assess_pickle(asm(*items, "APPENDS", "STOP"))
    assert an.globals[("collections", "defaultdict")].count == 5
    assert [f.code for f in an.findings] == [Code.PICKLE_BENIGN_GLOBAL, Code.PICKLE_UNKNOWN_GLOBAL]


def test_unknown_global_from_main(assess_pickle: Any) -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "__main__", "Net"), "EMPTY_TUPLE", "NEWOBJ", "STOP")
    an = assess_pickle(data)
    assert an.globals[("__main__", "Net")].status == "unknown"
    assert [f.code for f in an.findings] == [Code.PICKLE_UNKNOWN_GLOBAL]


def test_user_allow_makes_a_global_allowed(assess_pickle: Any) -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "__main__", "Net"), "STOP")
    an = assess_pickle(data, allow=frozenset({"__main__.Net"}))
    assert an.globals[("__main__", "Net")].status == "allowed" and an.findings == []


def test_torch_blocklist_beats_user_allow(assess_pickle: Any) -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "__builtin__", "intern"), "STOP")   # -> sys.intern
    an = assess_pickle(data, allow=frozenset({"sys.intern"}))
    assert an.globals[("sys", "intern")].status == "dangerous"


def test_py2_names_are_reported_as_torch_reads_them(assess_pickle: Any) -> None:
    data = asm(("PROTO", 2), ("GLOBAL", "__builtin__", "set"), "STOP")
    an = assess_pickle(data)
    assert an.globals[("builtins", "set")].status == "allowed"


def test_worse_spelling_escalates_existing_entry(assess_pickle: Any) -> None:
    # `UserDict.UserDict` (allowed? no: collections.UserDict is benign) then a padded variant
    data = asm(("PROTO", 4), ("SHORT_BINUNICODE", "collections"), ("SHORT_BINUNICODE", "UserDict"),
               "STACK_GLOBAL", "POP", ("GLOBAL", "UserDict", "UserDict"), "STOP")
    an = assess_pickle(data)
    assert an.globals[("collections", "UserDict")].count == 2


def test_call_findings_are_capped(assess_pickle: Any) -> None:
    items: list[Any] = [("PROTO", 4), "EMPTY_LIST", "MARK"]
    for i in range(500):
        items += [("GLOBAL", "os", "system"), ("SHORT_BINUNICODE", f"echo {i}"), "TUPLE1", "REDUCE"]
    items += ["APPENDS", "STOP"]
    an = assess_pickle(asm(*items))
    calls = [f for f in an.findings if f.code == Code.PICKLE_DANGEROUS_CALL]
    assert len(calls) == 64 and calls[-1].message == "more dangerous calls follow (not listed)"
    assert sum(f.code == Code.PICKLE_DANGEROUS_GLOBAL for f in an.findings) == 1


def test_global_findings_are_capped(assess_pickle: Any) -> None:
    items: list[Any] = [("PROTO", 2), "EMPTY_LIST", "MARK"]
    items += [("GLOBAL", f"pkg{i}", "Cls") for i in range(300)]
    an = assess_pickle(asm(*items, "APPENDS", "STOP"))
    unknown = [f for f in an.findings if f.code == Code.PICKLE_UNKNOWN_GLOBAL]
    assert len(unknown) == 257 and "only the first 256" in unknown[-1].message
    assert len(an.globals) == 300


def test_vm_notes_become_findings_capped(assess_pickle: Any) -> None:
    items: list[Any] = [("PROTO", 2), "EMPTY_LIST", "MARK"]
    items += [("EXT1", 1)] * 100
    items += ["APPENDS", "STOP"]
    an = assess_pickle(asm(*items))
    ext = [f for f in an.findings if f.code == Code.PICKLE_EXTENSION_CODE]
    assert len(ext) == 33 and "more like the above" in ext[-1].message


def test_nested_payload_depth_is_bounded(assess_pickle: Any) -> None:
    payload = asm(("PROTO", 2), ("GLOBAL", "os", "system"), "STOP")
    for _ in range(5):
        payload = asm(("PROTO", 2), ("GLOBAL", "pickle", "loads"),
                      ("BINBYTES", payload), "TUPLE1", "REDUCE", "STOP")
    an = assess_pickle(payload)
    assert an.globals[("pickle", "loads")].status == "dangerous"
    assert ("os", "system") not in an.globals      # 5 levels down: beyond the bound


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_assess_never_raises(data: bytes) -> None:
    from ckptguard.core.pickle.vm import run_vm
    from ckptguard.core.state import Analysis
    from ckptguard.core.threats.assess import assess

    an = Analysis()
    assess(run_vm(data), an, allow=frozenset(), record=None)
    for g in an.globals.values():
        assert g.status in ("allowed", "dangerous", "benign", "unknown")


# -- red team round 3: string-eval, import, file/URL and mutation gadgets ---------------------

_DG, _NEST = Code.PICKLE_DANGEROUS_GLOBAL, Code.PICKLE_NESTED_DESERIALIZER
_C, _H = Severity.CRITICAL, Severity.HIGH


@pytest.mark.parametrize(("module", "name", "code", "severity", "reason"), [
    # sympy's string entry points: sympify/parse_expr eval their input
    ("sympy", "sympify", _DG, _C, "eval"),
    ("sympy.core.sympify", "sympify", _DG, _C, "eval"),        # the real __module__
    ("sympy.core", "sympify", _DG, _C, "eval"),                 # attribute of sympy.core
    ("sympy.core.sympify", "kernS", _DG, _C, "eval"),
    ("sympy.parsing.sympy_parser", "parse_expr", _DG, _C, "eval"),
    ("sympy.parsing.sympy_parser", "eval_expr", _DG, _C, "eval"),
    ("sympy.parsing.sympy_parser", "stringify_expr", _DG, _C, "eval"),
    ("sympy", "parse_expr", _DG, _C, "eval"),
    ("sympy", "S", _DG, _C, "eval"),                            # S('...') is sympify
    ("sympy.core.singleton", "S", _DG, _C, "eval"),
    ("sympy.parsing.mathematica", "parse_mathematica", _DG, _C, "eval"),
    ("sympy.utilities.lambdify", "lambdify", _DG, _C, "code"),  # exec of generated source
    ("sympy", "lambdify", _DG, _C, "code"),
    ("sympy.utilities.autowrap", "autowrap", _DG, _C, "code"),
    ("sympy.printing.preview", "preview", _DG, _C, "code"),
    ("sympy.external.importtools", "import_module", _DG, _C, "imports"),
    ("sympy.utilities.source", "get_class", _DG, _C, "imports"),
    # typing / typing_extensions evaluate string annotations
    ("typing", "_eval_type", _DG, _C, "eval"),
    ("typing", "get_type_hints", _DG, _C, "eval"),
    ("typing", "ForwardRef._evaluate", _DG, _C, "eval"),
    ("typing_extensions", "get_type_hints", _DG, _C, "eval"),
    ("typing_extensions", "evaluate_forward_ref", _DG, _C, "eval"),
    # CPython test and bootstrap internals
    ("_testcapi", "run_in_subinterp", _DG, _C, "code"),
    ("_testinternalcapi", "run_in_subinterp_with_config", _DG, _C, "code"),
    ("_bootsubprocess", "_fork_exec", _DG, _C, "code"),
    ("_bootsubprocess", "check_output", _DG, _C, "code"),
    ("_imp", "create_dynamic", _DG, _C, "imports"),
    ("_imp", "exec_builtin", _DG, _C, "imports"),
    ("_frozen_importlib", "_call_with_frames_removed", _DG, _C, "imports"),
    ("_frozen_importlib", "__import__", _DG, _C, "__import__"),
    ("_frozen_importlib_external", "SourceFileLoader", _DG, _C, "imports"),
    ("warnings", "_getcategory", _DG, _C, "imports"),
    ("warnings", "_setoption", _DG, _C, "imports"),
    ("xml.sax", "make_parser", _DG, _C, "imports"),
    # torch: downloads, compilers, operator registration, benchmark stmt strings
    ("torch.utils.model_zoo", "load_url", _DG, _C, "torch.load"),
    ("torch.hub", "load_state_dict_from_url", _DG, _C, "code"),   # covered by the torch.hub prefix
    ("torch.hub", "download_url_to_file", _DG, _C, "code"),
    ("torch", "compile", _DG, _C, "code"),
    ("torch.compiler", "compile", _DG, _C, "code"),
    ("torch.compiler", "load_cache_artifacts", _NEST, _C, "deserializes"),
    ("torch._dynamo", "optimize", _DG, _C, "code"),
    ("torch.library", "Library", _DG, _C, "kernels"),
    ("torch.library", "custom_op", _DG, _C, "kernels"),
    ("torch.utils.benchmark", "Timer", _DG, _C, "code"),
    ("torch.utils.benchmark.utils.timer", "Timer", _DG, _C, "code"),
    ("torch.utils.benchmark.utils.cpp_jit", "compile_timeit_template", _DG, _C, "code"),
    # files, URLs, shared memory
    ("_pyio", "open", _DG, _H, "files"),
    ("_pyio", "FileIO", _DG, _H, "files"),
    ("_pyio", "open_code", _DG, _H, "files"),
    ("tokenize", "open", _DG, _H, "files"),
    ("xml.sax", "parse", _DG, _H, "URLs"),
    ("xml.sax.saxutils", "prepare_input_source", _DG, _H, "URLs"),
    ("xml.dom.minidom", "parse", _DG, _H, "files"),
    ("xml.etree.ElementTree", "parse", _DG, _H, "files"),
    ("numpy.lib._datasource", "open", _DG, _H, "URLs"),
    ("numpy.lib._datasource", "DataSource", _DG, _H, "URLs"),
    ("numpy", "DataSource", _DG, _H, "URLs"),
    ("antigravity", "geohash", _DG, _H, "browser"),
    ("_posixshmem", "shm_unlink", _DG, _H, "shared memory"),
    ("_posixshmem", "shm_open", _DG, _H, "shared memory"),
    ("_multiprocessing", "sem_unlink", _DG, _H, "semaphores"),
    # in-place mutators, under both spellings of the operator module
    ("_operator", "setitem", _DG, _H, "mutates"),
    ("operator", "setitem", _DG, _H, "mutates"),
    ("_operator", "delitem", _DG, _H, "mutates"),
    ("operator", "iadd", _DG, _H, "mutates"),
    ("_operator", "iconcat", _DG, _H, "mutates"),
    ("builtins", "__annotations__", _DG, _C, "__annotations__"),
])
def test_red_team_round_3_globals_are_dangerous(module: str, name: str, code: Code,
                                                severity: Severity, reason: str) -> None:
    t = classify_global(module, name)
    assert (t.status, t.code, t.severity) == ("dangerous", code, severity), t
    assert reason in t.reason


@pytest.mark.parametrize(("module", "name", "status"), [
    ("typing", "Any", "benign"),                                 # exact names only in typing
    ("typing", "ForwardRef", "unknown"),
    ("sympy.core.symbol", "Symbol", "unknown"),                   # sympy data classes stay unknown
    ("sympy.core.numbers", "Integer", "unknown"),
    ("torch.utils.benchmark.utils.common", "Measurement", "unknown"),   # pickled results
    ("torch._dynamo.decorators", "_DimRange", "benign"),
    ("operator", "getitem", "unknown"),
    ("warnings", "WarningMessage", "unknown"),
    ("xml.sax.handler", "ContentHandler", "unknown"),
    ("numpy.dtypes", "Float32DType", "benign"),
])
def test_red_team_round_3_neighbours_keep_their_status(module: str, name: str, status: str) -> None:
    assert classify_global(module, name).status == status


def test_operator_and_underscore_operator_rules_agree() -> None:
    """`operator` re-exports `_operator`: a rule for one spelling must exist for the other."""
    from ckptguard.core.threats.table import DANGEROUS_NAMES

    ops = {k.split(".", 1)[1] for k in DANGEROUS_NAMES if k.split(".")[0] in ("operator", "_operator")}
    for name in ops:
        assert DANGEROUS_NAMES.get(f"operator.{name}") == DANGEROUS_NAMES.get(f"_operator.{name}")
        assert DANGEROUS_NAMES.get(f"operator.{name}") is not None, name
    assert {"setitem", "delitem", "attrgetter", "methodcaller", "itemgetter", "call"} <= ops


def test_annotations_is_a_dangerous_dunder() -> None:
    from ckptguard.core.threats.table import DANGEROUS_DUNDERS

    assert "__annotations__" in DANGEROUS_DUNDERS
    assert classify_global("typing", "NamedTuple.__annotations__").status == "dangerous"
