"""torch.export's symbolic expressions: which `expr_str` values `sympy.sympify` (eval) would
run as code, judged on the text alone (no sympy import).

Strategy: torch.export.load runs `sympy.sympify(expr_str, locals=<torch's sympy functions + symbols>)`
(torch/_export/serde/serialize.py `_parse_sym_expr`): sympy tokenizes the text, rewrites it
and evals it with every builtin in scope. torch writes `srepr` of shape arithmetic, e.g.
"Add(Mul(Integer(2), Symbol('s77', positive=True, integer=True)), Integer(1))",
"FloorDiv(Symbol('s0', ...), Integer(2))", "Mul(Float('1.5', precision=53), Symbol('zuf0'))";
older writers wrote str(): "2*s0 + 1". Three outcomes:
* plain (that grammar, bounded numbers): nothing to report;
* outside it with evidence of code (a dunder, an attribute, a string sympify would parse
  again, a call of a name no torch writer emits, a call of a computed callable, `lambda`,
  `import`, look-alike Unicode): PT2_SYMPY_EXPR and PT2_SYMPY_EVAL (critical, unsafe);
* outside it without such evidence (number blow-ups, odd quoting, syntax sympy would
  reject): PT2_SYMPY_EXPR only (suspicious).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import Any

from ckptguard.core.limits import DEFAULT_LIMITS

# Callables a torch writer emits: srepr class names of sympy, the torch.utils._sympy.functions
# that `_parse_sym_expr` passes as locals, and the opaque unary/bitwise function families.
_EXPR_FUNCS = frozenset("""
    Symbol Dummy Integer Rational Float Add Mul Pow Mod Max Min Abs floor ceiling sign exp log
    sqrt sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh Piecewise ExprCondPair
    Eq Ne Lt Le Gt Ge Equality Unequality StrictLessThan LessThan StrictGreaterThan GreaterThan
    And Or Not Xor ITE Implies BooleanTrue BooleanFalse sympify_true
    FloorDiv ModularIndexing Where PythonMod CleanDiv CeilToInt FloorToInt CeilDiv LShift RShift
    PowByNatural FloatPow FloatTrueDiv IntTrueDiv IsNonOverlappingAndDenseIndicator
    TruncToFloat TruncToInt RoundToInt RoundDecimal ToFloat Identity""".split())
_EXPR_FUNC_FAMILY = re.compile(r"(?:OpaqueUnaryFn|BitwiseFn)_[a-z][a-z0-9_]{0,30}")
_EXPR_ATOMS = frozenset({"oo", "zoo", "nan", "true", "false", "int_oo", "pi", "E"})
_EXPR_ASSUMPTIONS = frozenset("""
    integer positive negative nonnegative nonpositive nonzero zero real extended_real finite
    infinite rational irrational even odd prime composite commutative complex imaginary
    algebraic transcendental noninteger extended_positive extended_negative
    extended_nonnegative extended_nonpositive extended_nonzero""".split())
_EXPR_SYMBOL = re.compile(r"[a-z][a-z0-9_]{0,30}[0-9]")           # s0 u3 zf1 zuf0 ps2 r0_1
_EXPR_SYMBOL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")      # Symbol('...') contents
_EXPR_FLOAT = re.compile(r"-?(?:\d{1,40}(?:\.\d{0,40})?|\.\d{1,40})(?:[eE][+-]?\d{1,4})?|[-+]?inf|nan")
_MAX_EXPR_DEPTH = 64
_MAX_CONST_BITS = 4096       # sympy evaluates constant arithmetic eagerly
_MAX_EXPONENT = 64
_MAX_FLOAT_PRECISION = 1024


class _NotPlain(Exception):
    """Why an expression is outside the grammar torch writes."""


def expr_is_plain(expr: str, max_len: int = DEFAULT_LIMITS.max_pt2_expr_chars) -> bool:
    """True if `expr` only combines shape symbols, bounded integers and known sympy functions."""
    return plain_problem(expr, max_len) is None


def plain_problem(expr: str, max_len: int) -> str | None:
    if len(expr) > max_len:
        return f"longer than {max_len} characters"
    if not expr.isascii() or "__" in expr or "\n" in expr or "\r" in expr:
        return "non-ASCII, a dunder or a line break"
    try:
        tree = ast.parse(expr, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return "not a Python expression"
    stack: list[tuple[ast.AST, int]] = [(tree.body, 1)]
    while stack:                                     # bound the depth before recursing
        node, depth = stack.pop()
        if depth > _MAX_EXPR_DEPTH:
            return f"nested deeper than {_MAX_EXPR_DEPTH}"
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    try:
        _const_bits(tree.body, expr)
    except _NotPlain as exc:
        return str(exc)
    return None


def _const_bits(node: ast.AST, src: str) -> int | None:
    """Bit size bound of a constant subexpression (None if it holds a symbol); raise _NotPlain."""
    bits: int | None
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool):
            return 1
        if isinstance(value, int):
            if abs(value) >= 10**19:
                raise _NotPlain("an integer literal of more than 19 digits")
            return value.bit_length()
        if isinstance(value, float):
            return 64
        raise _NotPlain(f"a {type(value).__name__} literal outside Symbol()/Float()")
    if isinstance(node, ast.Name):
        if node.id in _EXPR_ATOMS or (_EXPR_SYMBOL.fullmatch(node.id) and node.id not in _EXPR_FUNCS):
            return None
        raise _NotPlain(f"the name {node.id!r}")
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd, ast.Not,
                                                              ast.Invert)):
        return _const_bits(node.operand, src)
    if isinstance(node, ast.BinOp):
        if isinstance(node.op, (ast.Pow, ast.BitXor)):          # sympify reads `^` as `**`
            return _pow_bits(node.left, node.right, src)
        if not isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod,
                                    ast.BitAnd, ast.BitOr)):
            raise _NotPlain(f"the operator {type(node.op).__name__}")
        left, right = _const_bits(node.left, src), _const_bits(node.right, src)
        if left is None or right is None:
            return None
        bits = left + right if isinstance(node.op, ast.Mult) else max(left, right) + 1
    elif isinstance(node, ast.Compare):
        if not all(isinstance(op, (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE))
                   for op in node.ops):
            raise _NotPlain("a comparison other than ==, !=, <, <=, >, >=")
        for child in (node.left, *node.comparators):
            _const_bits(child, src)
        return None
    elif isinstance(node, ast.Call):
        return _call_bits(node, src)
    else:
        raise _NotPlain(f"{type(node).__name__} syntax")
    if bits > _MAX_CONST_BITS:
        raise _NotPlain(f"a constant of more than {_MAX_CONST_BITS} bits")
    return bits


def _call_bits(node: ast.Call, src: str) -> int | None:
    func = node.func.id if isinstance(node.func, ast.Name) else None
    if func is None or not (func in _EXPR_FUNCS or _EXPR_FUNC_FAMILY.fullmatch(func)):
        raise _NotPlain("a call of something other than a sympy/torch shape function")
    args = node.args
    if any(isinstance(a, ast.Starred) for a in args) or any(k.arg is None for k in node.keywords):
        raise _NotPlain("*args or **kwargs")
    if func in ("Symbol", "Dummy", "Float"):
        if len(args) != 1:
            raise _NotPlain(f"{func}() with {len(args)} positional arguments")
        arg = args[0]
        text = ast.get_source_segment(src, arg) or ""
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            pattern = _EXPR_FLOAT if func == "Float" else _EXPR_SYMBOL_NAME
            if not (text.startswith("'") and pattern.fullmatch(arg.value)):
                raise _NotPlain(f"{func}({text[:40]}) is not how torch writes a {func}")
        elif func != "Float" or _const_bits(arg, src) is None:
            raise _NotPlain(f"{func}() of something other than a name literal")
        for kw in node.keywords:
            value = kw.value.value if isinstance(kw.value, ast.Constant) else None
            if func == "Float" and kw.arg in ("precision", "dps") and type(value) is int \
                    and 0 < value <= _MAX_FLOAT_PRECISION:
                continue
            if func != "Float" and kw.arg in _EXPR_ASSUMPTIONS and type(value) is bool:
                continue
            raise _NotPlain(f"{func}() with the keyword {kw.arg}")
        return 64 if func == "Float" else None
    if node.keywords:
        raise _NotPlain(f"{func}() with keywords")
    if func in ("Pow", "PowByNatural", "FloatPow", "LShift") and len(args) == 2:
        if func == "LShift":                       # a << b: the bits of a plus b
            base = _const_bits(args[0], src)
            shift = _const_bits(args[1], src)
            if shift is not None and shift > 6:
                raise _NotPlain("a shift by more than 63")
            bits = None if base is None or shift is None else base + (1 << shift)
        else:
            bits = _pow_bits(args[0], args[1], src)
    else:
        sizes = [_const_bits(a, src) for a in args]
        if any(b is None for b in sizes) or not sizes:
            return None
        known = [b for b in sizes if b is not None]
        bits = sum(known) if func == "Mul" else max(known) + len(known).bit_length()
    if bits is not None and bits > _MAX_CONST_BITS:
        raise _NotPlain(f"a constant of more than {_MAX_CONST_BITS} bits")
    return bits


def _pow_bits(base: ast.AST, exponent: ast.AST, src: str) -> int | None:
    """base ** exponent: the exponent must hold a symbol or be a small literal."""
    base_bits = _const_bits(base, src)
    if _const_bits(exponent, src) is None:
        return None                                # symbolic exponent: sympy keeps Pow(b, e)
    e = exponent
    while isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
        e = e.operand
    if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and \
            e.func.id in ("Integer", "Rational", "Float") and e.args:
        e = e.args[0]
        while isinstance(e, ast.UnaryOp) and isinstance(e.op, (ast.USub, ast.UAdd)):
            e = e.operand
    value = e.value if isinstance(e, ast.Constant) else None
    if isinstance(value, str):                     # Float('0.5', precision=53)
        value = float(value)
    if not (isinstance(value, (int, float)) and abs(value) <= _MAX_EXPONENT):
        raise _NotPlain(f"an exponent that is not a literal up to {_MAX_EXPONENT}")
    if base_bits is None:
        return None
    bits = base_bits * max(1, int(abs(value)))
    if bits > _MAX_CONST_BITS:
        raise _NotPlain(f"a constant of more than {_MAX_CONST_BITS} bits")
    return bits


# Evidence that sympify would run code, read on the raw text (linear regexes, any length, any
# syntax: sympy's own tokenizer accepts more than Python's parser).
_EV_STRING = re.compile(r"""'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*\"""", re.S)
_EV_NAME_ARG = re.compile(r"(?<![A-Za-z0-9_])(?:Symbol|Dummy|Float)[ \t]*\([ \t]*\Z")
_EV_NUMBER = re.compile(r"(?<![A-Za-z0-9_])(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)"
                        r"(?:[eE][+-]?\d[\d_]*)?[jJ]?")
_EV_KEYWORD = re.compile(r"(?<![A-Za-z0-9_])(lambda|import|yield|await)(?![A-Za-z0-9_])")
_EV_ATTR = re.compile(r"\.[\s\\]*[A-Za-z_]")
_EV_CALL = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)[\s\\]*\(")
_EV_COMPUTED_CALL = re.compile(r"[)\]}][\s\\]*\(")
_EV_NOT_CALLS = frozenset({"and", "or", "not", "in", "is", "if", "else", "for"})


def code_evidence(expr: str) -> str | None:
    """Why `sympy.sympify(expr)` would run code beyond shape arithmetic, or None."""
    if not expr.isascii():
        return "non-ASCII characters (Python folds look-alike letters into identifiers)"
    if "__" in expr:
        return "a dunder name"
    for m in _EV_STRING.finditer(expr):
        if not _EV_NAME_ARG.search(expr, max(0, m.start() - 40), m.start()):
            return "a string literal outside Symbol()/Float() (sympify parses strings again)"
    rest = _EV_NUMBER.sub("0", _EV_STRING.sub("0", expr))
    keyword = _EV_KEYWORD.search(rest)
    if keyword:
        return f"the keyword {keyword.group(1)!r}"
    if _EV_ATTR.search(rest):
        return "an attribute access"
    for call in _EV_CALL.finditer(rest):
        name = call.group(1)
        if name not in _EXPR_FUNCS and name not in _EV_NOT_CALLS \
                and not _EXPR_FUNC_FAMILY.fullmatch(name):
            return f"a call of {name!r}, which no torch writer emits"
    if _EV_COMPUTED_CALL.search(rest):
        return "a call of a computed callable"
    return None


def iter_exprs(node: Any, depth: int = 0) -> Iterator[str]:
    stack: list[tuple[Any, int]] = [(node, depth)]
    while stack:
        cur, d = stack.pop()
        if d > 512:
            continue
        if isinstance(cur, dict):
            expr = cur.get("as_expr")
            if isinstance(expr, dict) and "expr_str" in expr:
                yield expr["expr_str"] if isinstance(expr["expr_str"], str) else repr(expr["expr_str"])
            stack.extend((v, d + 1) for v in cur.values())
        elif isinstance(cur, list):
            stack.extend((v, d + 1) for v in cur)
