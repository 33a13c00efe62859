"""torch.export's verifier, replayed on the serialized program (no torch import).

Strategy: `torch._export.verifier` checks a deserialized ExportedProgram; deserializing
would run sympy and resolve operator names, so we check the same rules on the JSON
(FORMATS.md §5 checklist, torch/_export/verifier.py `_verify_exported_program_signature`,
`_check_valid_op`, `_verify_exported_program_module_call_graph`). Each violation is a
`Violation(rule, message)`; the caller turns them into PT2_VERIFIER findings. Node
targets that `deserialize_operator` would resolve by `getattr` on the `torch` module to
something other than an operator (`torch.load`, `torch.os.system`) are reported apart:
they are callables the graph would run.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from ckptguard.core.records import record

# verifier.py `_allowed_builtin_ops` + `_allowed_torch_functions`, as serialized names
ALLOWED_BUILTIN_TARGETS = frozenset(
    [f"_operator.{n}" for n in ("getitem", "add", "mul", "sub", "truediv", "ge", "le", "gt", "lt",
                                "eq", "ne", "floordiv", "mod", "and_", "or_", "not_", "pow",
                                "neg", "abs", "lshift", "rshift", "pos")]
    + ["math.ceil", "math.floor", "math.trunc", "builtins.round", "round"]
    + [f"torch.{n}" for n in ("sym_int", "sym_float", "sym_ite", "sym_max", "sym_min", "sym_not",
                              "sym_sqrt", "sym_sum")]
    + ["torch._C._set_grad_enabled", "torch.amp.autocast_mode._enter_autocast",
       "torch.amp.autocast_mode._exit_autocast"]
    + [f"torch._functorch.predispatch.{n}" for n in (
        "_add_batch_dim", "_remove_batch_dim", "_vmap_increment_nesting",
        "_vmap_decrement_nesting", "lazy_load_decompositions", "_make_dual", "_unpack_dual",
        "_jvp_increment_nesting", "_jvp_decrement_nesting", "_unwrap_for_grad",
        "_enter_dual_level", "_exit_dual_level")]
)
OP_NAMESPACES = frozenset({"aten", "prims"})
_IDENT = r"([A-Za-z_][A-Za-z0-9_]*)"
_OP_RE = re.compile(rf"torch\.ops\.{_IDENT}\.{_IDENT}\.{_IDENT}\Z")
_HOP_RE = re.compile(r"torch\.ops\.higher_order\.[A-Za-z_][A-Za-z0-9_]*\Z")


@record(frozen=True, slots=True)
class Violation:
    rule: str                  # stable rule id, e.g. "inputs-match-specs"
    message: str
    unsafe: bool = False       # a callable outside torch.ops the graph would call


def verify_program(program: Mapping[str, Any], weights: Mapping[str, Mapping[str, Any]],
                   constants: Mapping[str, Mapping[str, Any]], *, max_violations: int,
                   max_graph_depth: int) -> list[Violation]:
    """The first `max_violations` rule violations of one models/<name>.json against its
    weight/constant configs; subgraphs nested deeper than `max_graph_depth` are not read."""
    out: list[Violation] = []
    gm = _dict(program.get("graph_module"))
    graph = _dict(gm.get("graph"))
    sig = _dict(gm.get("signature"))
    dialects = program.get("verifiers") or []
    training = dialects == ["TRAINING"] or program.get("dialect") == "TRAINING"
    _check_schema(program, out)
    _check_inputs(graph, sig, weights, constants, out)
    _check_outputs(graph, sig, out)
    _check_ops(graph, training, out, max_graph_depth)
    _check_call_graph(gm, graph, out)
    return out[:max_violations]


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def arg_name(arg: Any) -> str | None:
    """Name of an Argument union (`{"as_tensor": {"name": x}}`) or a named argument."""
    for _ in range(4):
        if not isinstance(arg, dict):
            return None
        if isinstance(arg.get("name"), str):
            return str(arg["name"])
        if isinstance(arg.get("as_name"), str):
            return str(arg["as_name"])
        if len(arg) != 1:
            return None
        arg = next(iter(arg.values()))
    return None


def _check_schema(program: Mapping[str, Any], out: list[Violation]) -> None:
    version = _dict(program.get("schema_version"))
    major, minor = version.get("major"), version.get("minor")
    # serialize.py: major must equal SCHEMA_VERSION[0] (8) unless the version is 0.0
    if major != 8 and not (major == 0 and minor == 0):
        out.append(Violation("schema-version", f"serialized schema version {major}.{minor} does "
                             "not match torch 2.13's 8.x"))


_SPEC_KINDS = ("parameter", "buffer", "tensor_constant", "custom_obj", "token", "constant_input",
               "user_input")


def _spec(spec: Any) -> tuple[str, Mapping[str, Any]]:
    if isinstance(spec, dict) and len(spec) == 1:
        kind, body = next(iter(spec.items()))
        return str(kind), _dict(body)
    return "?", {}


def _check_inputs(graph: Mapping[str, Any], sig: Mapping[str, Any],
                  weights: Mapping[str, Mapping[str, Any]],
                  constants: Mapping[str, Mapping[str, Any]], out: list[Violation]) -> None:
    inputs = _list(graph.get("inputs"))
    specs = _list(sig.get("input_specs"))
    if len(inputs) != len(specs):
        out.append(Violation("inputs-match-specs", f"number of graph inputs ({len(inputs)}) does not "
                             f"match number of inputs in the graph signature ({len(specs)})"))
    for i, (inp, spec) in enumerate(zip(inputs, specs, strict=False)):
        kind, body = _spec(spec)
        node = arg_name(inp)
        name = body.get("name") if kind == "constant_input" else arg_name(body.get("arg"))
        if kind not in ("constant_input", "custom_obj") and name is not None and name != node:
            out.append(Violation("inputs-match-specs",
                                 f"input spec name {name} does not match node name {node} (#{i})"))
        if kind == "user_input" or kind == "constant_input":
            continue
        target = _str(body.get(f"{kind}_name"))
        if kind == "parameter":
            _need_tensor_arg(kind, body, out)
            meta = weights.get(target) if target is not None else None
            if meta is None:
                out.append(Violation("parameter-in-state-dict",
                                     f"Parameter {target} is not in the state dict."))
            elif meta.get("is_param") is not True:
                out.append(Violation("parameter-in-state-dict", f"State dict entry for parameter "
                                     f"{target} is not an instance of torch.nn.Parameter."))
        elif kind == "buffer":
            _need_tensor_arg(kind, body, out)
            persistent = body.get("persistent")
            if persistent is None:
                out.append(Violation("buffer-persistence", f"Buffer {target} is missing a "
                                     "persistence flag"))
            elif persistent is True and target not in weights and target not in constants:
                out.append(Violation("buffer-persistence",
                                     f"Buffer {target} is not in the state dict."))
            elif persistent is False and target in weights:
                out.append(Violation("buffer-persistence", f"Non-persistent buffer {target} is in "
                                     "the state dict, it should not be."))
        elif kind in ("tensor_constant", "custom_obj"):
            if kind == "tensor_constant":
                _need_tensor_arg(kind, body, out)
            if target is None or target not in constants:
                out.append(Violation("constant-present", f"{kind.replace('_', ' ')} {target} is not "
                                     "in the constants dictionary."))
        elif kind != "token":
            out.append(Violation("inputs-match-specs", f"Unknown InputKind {kind}."))


def _need_tensor_arg(kind: str, body: Mapping[str, Any], out: list[Violation]) -> None:
    arg = body.get("arg")
    if not (isinstance(arg, dict) and isinstance(arg.get("name"), str)):
        out.append(Violation("inputs-match-specs", f"{kind} input spec is not a tensor argument: "
                             f"{str(arg)[:100]}"))


_MUTATION_KINDS = {"buffer_mutation": ("buffer_name", "buffer"),
                   "parameter_mutation": ("parameter_name", "parameter"),
                   "user_input_mutation": ("user_input_name", "user_input")}


def _check_outputs(graph: Mapping[str, Any], sig: Mapping[str, Any], out: list[Violation]) -> None:
    outputs = [arg_name(o) for o in _list(graph.get("outputs"))]
    specs = [_spec(s) for s in _list(sig.get("output_specs"))]
    if len(outputs) != len(specs):
        out.append(Violation("outputs-match-specs", f"number of output nodes {len(outputs)} is "
                             f"different than the number of output specs {len(specs)}"))
    in_specs = [_spec(s) for s in _list(sig.get("input_specs"))]
    targets = {
        "buffer": {_str(b.get("buffer_name")) for k, b in in_specs if k == "buffer"},
        "parameter": {_str(b.get("parameter_name")) for k, b in in_specs if k == "parameter"},
        "user_input": {arg_name(b.get("arg")) for k, b in in_specs if k == "user_input"},
    }
    tokens = sum(1 for k, _ in specs if k == "token")
    mutations = [(k, b) for k, b in specs if k in _MUTATION_KINDS]
    users = [arg_name(b.get("arg")) for k, b in specs if k == "user_output"]
    # the verifier slices the graph outputs: tokens, then mutations, then user outputs
    mutate_nodes = outputs[tokens : tokens + len(mutations)]
    by_node = {arg_name(b.get("arg")): (k, b) for k, b in mutations}
    for node in mutate_nodes:
        if node not in by_node:
            out.append(Violation("mutation-outputs", f"Mutation node {node} is neither a buffer, a "
                                 "parameter nor a user input"))
            continue
        kind, body = by_node[node]
        field, pool = _MUTATION_KINDS[kind]
        if _str(body.get(field)) not in targets[pool]:
            out.append(Violation("mutation-outputs", f"{kind} output {node} does not point to a "
                                 f"{pool.replace('_', ' ')} that exists: {body.get(field)}"))
    start = tokens + len(mutations)
    for node, name in zip(outputs[start : start + len(users)], users, strict=False):
        if node != name:
            out.append(Violation("user-output-order", f"User output {node} is not in the correct "
                                 f"order or is not found in the user output list: {users}"))


def iter_nodes(graph: Mapping[str, Any], max_depth: int,
               depth: int = 0) -> Iterator[tuple[Mapping[str, Any], int]]:
    """Every node of `graph` and of its higher-order subgraphs (`as_graph` arguments)."""
    if depth > max_depth:
        return
    for node in _list(graph.get("nodes")):
        if not isinstance(node, dict):
            continue
        yield node, depth
        for inp in _list(node.get("inputs")):
            sub = _dict(_dict(_dict(inp).get("arg")).get("as_graph")).get("graph")
            if isinstance(sub, dict):
                yield from iter_nodes(sub, max_depth, depth + 1)


def _check_ops(graph: Mapping[str, Any], training: bool, out: list[Violation], max_depth: int) -> None:
    seen: set[str] = set()
    for node, _ in iter_nodes(graph, max_depth):
        target = node.get("target")
        if not isinstance(target, str):
            out.append(Violation("operator-allowed", f"node {node.get('name')} has no target"))
            continue
        if target in seen:
            continue
        seen.add(target)
        problem = target_problem(target, training)
        if problem is not None:
            rule, message, unsafe = problem
            out.append(Violation(rule, f"node {node.get('name')}: {message}", unsafe))


def target_problem(target: str, training: bool) -> tuple[str, str, bool] | None:
    """Why `target` would fail `_check_valid_op` (and whether it is an arbitrary callable)."""
    if _HOP_RE.match(target) or target in ALLOWED_BUILTIN_TARGETS:
        return None
    m = _OP_RE.match(target)
    if m:
        ns, op, overload = m.groups()
        if ns not in OP_NAMESPACES:
            return ("operator-allowed", f"operator '{target}' is not in the aten/prims namespaces",
                    False)
        if not training and (op.endswith("_") or overload.startswith("out")):
            return ("functional-ops", f"operator '{target}' is not functional", False)
        return None
    if target.startswith("#"):
        return ("operator-allowed", f"extension operator '{target}' needs a registered handler",
                False)
    unsafe = target.startswith("torch") and not target.startswith("torch.ops.")
    message = (f"'{target}' resolves by getattr on the torch module to a callable the graph "
               "would run" if unsafe else f"operator '{target}' is not an allowed operator type")
    return ("operator-allowed", message, unsafe)


def _check_call_graph(gm: Mapping[str, Any], graph: Mapping[str, Any], out: list[Violation]) -> None:
    names = {arg_name(i) for i in _list(graph.get("inputs"))}
    for node in _list(graph.get("nodes")):
        if isinstance(node, dict):
            names.add(node.get("name") if isinstance(node.get("name"), str) else None)
            for o in _list(node.get("outputs")):
                names.add(arg_name(o))
    for entry in _list(gm.get("module_call_graph")):
        sig = _dict(_dict(entry).get("signature"))
        for which in ("inputs", "outputs"):
            for arg in _list(sig.get(which)):
                name = arg_name(arg)
                if name and name not in names:
                    out.append(Violation("module-call-graph", f"{which[:-1].capitalize()} {name} "
                                         "does not exist in the graph."))
