"""Python 2 -> 3 global name mapping, as torch and as CPython's pickle apply it.

Two readers, two tables:
- torch's weights-only unpickler maps every GLOBAL through `torch._utils`'
  IMPORT_MAPPING / NAME_MAPPING (FORMATS.md §3.2), whatever the protocol;
- CPython's `pickle.Unpickler` maps through the larger `_compat_pickle` tables, and
  only when the pickle's protocol is < 3 (`fix_imports=True`, the default).
What a real `pickle.load` would import is what a threat analysis must judge.
"""

from __future__ import annotations

import _compat_pickle

# torch._utils.IMPORT_MAPPING / NAME_MAPPING of torch 2.13 (a subset of _compat_pickle's)
TORCH_IMPORT_MAPPING: dict[str, str] = {
    "__builtin__": "builtins", "copy_reg": "copyreg", "Queue": "queue", "repr": "reprlib",
    "_abcoll": "collections.abc", "UserDict": "collections", "UserList": "collections",
    "UserString": "collections", "whichdb": "dbm", "StringIO": "io", "cStringIO": "io",
}
TORCH_NAME_MAPPING: dict[tuple[str, str], tuple[str, str]] = {
    ("__builtin__", "xrange"): ("builtins", "range"),
    ("__builtin__", "reduce"): ("functools", "reduce"),
    ("__builtin__", "intern"): ("sys", "intern"),
    ("__builtin__", "unichr"): ("builtins", "chr"),
    ("__builtin__", "unicode"): ("builtins", "str"),
    ("__builtin__", "long"): ("builtins", "int"),
    ("itertools", "izip"): ("builtins", "zip"),
    ("itertools", "imap"): ("builtins", "map"),
    ("itertools", "ifilter"): ("builtins", "filter"),
    ("itertools", "ifilterfalse"): ("itertools", "filterfalse"),
    ("itertools", "izip_longest"): ("itertools", "zip_longest"),
    ("UserDict", "IterableUserDict"): ("collections", "UserDict"),
    ("UserList", "UserList"): ("collections", "UserList"),
    ("UserString", "UserString"): ("collections", "UserString"),
    ("__builtin__", "basestring"): ("builtins", "str"),
    ("exceptions", "StandardError"): ("builtins", "Exception"),
    ("UserDict", "UserDict"): ("collections", "UserDict"),
}


def torch_map(module: str, name: str) -> tuple[str, str]:
    """`_read_global_instruction`'s mapping: NAME_MAPPING first, else IMPORT_MAPPING."""
    if (module, name) in TORCH_NAME_MAPPING:
        return TORCH_NAME_MAPPING[(module, name)]
    return TORCH_IMPORT_MAPPING.get(module, module), name


def last_dot_split(module: str, name: str) -> tuple[str, str]:
    """`module.name` split at its last dot: how torch's tables name a dotted path, which its
    unpickler looks up by the joined string whatever the pickle's split."""
    if "." not in name:
        return module, name
    head, _, tail = f"{module}.{name}".rpartition(".")
    return head, tail


def python_map(module: str, name: str, protocol: int) -> tuple[str, str]:
    """`pickle.Unpickler.find_class`'s mapping with fix_imports=True (protocol < 3 only)."""
    if protocol >= 3:
        return module, name
    if (module, name) in _compat_pickle.NAME_MAPPING:
        return _compat_pickle.NAME_MAPPING[(module, name)]
    return _compat_pickle.IMPORT_MAPPING.get(module, module), name
