"""The globals torch 2.13's `torch.load(weights_only=True)` accepts, by name (FORMATS.md §3.2-§3.3).

Strategy: the names only, apart from what the callables do with their arguments
(core.torch.callables) and the emulator that replays the unpickler (core.torch.weights_only):
the fast lane and the threat analysis judge a clean file's globals by these tables alone,
and must not pay for loading the emulator to do it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ckptguard.core.pickle.renames import last_dot_split
from ckptguard.core.torch.dtypes import STORAGE_DTYPE, TORCH_DTYPE_GLOBALS
from ckptguard.core.torch.rules import BLOCKED_MODULES

QSCHEMES = frozenset(("per_tensor_affine", "per_tensor_symmetric", "per_channel_affine",
                      "per_channel_symmetric", "per_channel_affine_float_qparams"))
REBUILDERS = frozenset(f"torch._utils._rebuild_{n}" for n in (
    "parameter", "parameter_with_state", "qtensor", "tensor", "tensor_v2", "tensor_v3",
    "sparse_tensor", "meta_tensor_no_storage", "nested_tensor", "wrapper_subclass",
    "device_tensor_from_numpy", "device_tensor_from_cpu_tensor"))
_TENSOR_TYPES = ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")
TENSOR_TYPE_GLOBALS = frozenset(
    [f"torch.{t}Tensor" for t in _TENSOR_TYPES] + [f"torch.cuda.{t}Tensor" for t in _TENSOR_TYPES]
    + [f"torch.sparse.{t}Tensor" for t in _TENSOR_TYPES if t != "Bool"]
    + [f"torch.cuda.sparse.{t}Tensor" for t in _TENSOR_TYPES if t != "Bool"])
STORAGE_GLOBALS = frozenset([f"torch.{s}" for s in STORAGE_DTYPE]
                            + [f"torch.cuda.{s}" for s in STORAGE_DTYPE if not s.startswith("Q")])
# class name -> the metaclass torch reports for `type(cls)` (measured: tests/differential)
CLASSES: dict[str, str] = {
    "collections.OrderedDict": "type", "collections.Counter": "type", "torch.Size": "type",
    "torch.device": "type", "builtins.bytearray": "type", "builtins.set": "type",
    "builtins.complex": "type", "torch.storage.TypedStorage": "type",
    "torch.storage.UntypedStorage": "type",
    "torch.nn.parameter.Parameter": "torch.nn.parameter._ParameterMeta",
    "torch.Tensor": "torch._C._TensorMeta",
}
# FORMATS.md §3.3: torch._weights_only_unpickler._get_allowed_globals() keys
ALLOWED_GLOBALS: frozenset[str] = frozenset(
    [*CLASSES, "torch.serialization._get_layout", "_codecs.encode",
     "torch._tensor._rebuild_from_type_v2", *REBUILDERS, *STORAGE_GLOBALS, *TENSOR_TYPE_GLOBALS]
    + [f"torch.{d}" for d in TORCH_DTYPE_GLOBALS] + [f"torch.{q}" for q in QSCHEMES])
# what a fresh `import torch` (2.13, CPU) puts in the user safe set (FORMATS.md §3.2)
BASELINE_USER_GLOBALS: frozenset[str] = frozenset((
    "torch.nested._internal.nested_tensor.NestedTensor",
    "torch.nested._internal.nested_tensor._rebuild_njt",
    "torch.distributed._mesh_layout._MeshLayout",
    "torch.distributed._mesh_layout._FlatLayout",
))

def torch_split(module: str, name: str) -> tuple[str, str]:
    """A global as torch's tables name it. torch's unpickler looks a GLOBAL up by its joined
    path (`f"{module}.{name}"`), so `torch` + `_utils._rebuild_tensor_v2` is the allowlisted
    `_rebuild_tensor_v2` itself: a path torch allowlists is split at its last dot, the way the
    emulator, the fast paths and the manifest name it. Any other name keeps its split (the
    threat analysis reads each component of a dotted name)."""
    full = f"{module}.{name}"
    if "." in name and (full in ALLOWED_GLOBALS or full in BASELINE_USER_GLOBALS):
        return last_dot_split(module, name)
    return module, name


def allowed_checker(allow: frozenset[str]) -> Callable[[str], bool]:
    """The fast paths' test of a global's joined name: torch's allowlist, the user safe set
    and `allow`, minus the blocked modules."""
    allowed = ALLOWED_GLOBALS | BASELINE_USER_GLOBALS | allow
    blocked = tuple(m + "." for m in BLOCKED_MODULES)

    def is_allowed(full: str) -> bool:
        # torch checks the exact module against the blocklist first; declining every
        # "os.*"-looking name is stricter and leaves the exact verdict to the slow path.
        return full in allowed and not full.startswith(blocked)
    return is_allowed


def safe_globals_hint(names: Iterable[str]) -> str:
    """Ready-to-paste code that allowlists `names` (what the user would add).

    >>> safe_globals_hint(["argparse.Namespace", "builtins.slice"])
    'import argparse; torch.serialization.add_safe_globals([argparse.Namespace, slice])'
    """
    modules: list[str] = []
    exprs: list[str] = []
    for full in sorted(set(names)):
        module, _, name = full.rpartition(".")
        if module in BLOCKED_MODULES:  # torch refuses these whatever the allowlist says
            continue
        if module in ("builtins", ""):
            exprs.append(name)
            continue
        if module not in modules:
            modules.append(module)
        exprs.append(full)
    head = f"import {', '.join(modules)}; " if modules else ""
    return head + f"torch.serialization.add_safe_globals([{', '.join(exprs)}])"
