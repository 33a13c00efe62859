"""A value walk's paths as links to their parent: a child costs one small list, whatever its
depth, and only a tensor's path is spelled out in full.

Why: both walks that name tensors (core.manifest.build and the fast lane's) met every child
with a copy of its parent's path. A 71 KB pickle holding a list of 60,000 items under 10,000
nested tuples made 600 M path items (4.6 GB, red team): the cost followed depth x width, not
the pickle. Now a child is `[parent, segment, depth]` (a `Link`), and `spelled` builds the
tuple of segments only for a tensor, whose path items the manifest's cap counts
(`Limits.max_manifest_dims`).

A path is either a tuple of segments (the root `()`, or one already spelled out) or a link.
"""

from __future__ import annotations

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any, TypeAlias

Segments: TypeAlias = "tuple[Any, ...]"   # str | int segments from the root
Link: TypeAlias = "list[Any]"             # [parent path, segment, depth]
AnyPath: TypeAlias = "Segments | Link"


def depth(path: AnyPath) -> int:
    """How many segments `path` has."""
    return path[2] if type(path) is list else len(path)  # type: ignore[no-any-return]


def spelled(path: AnyPath) -> Segments:
    """`path`'s segments from the root (O(depth): only for what the report lists)."""
    tail: list[Any] = []
    while type(path) is list:
        tail.append(path[1])
        path = path[0]
    if not tail:
        return path  # type: ignore[return-value]
    tail.reverse()
    return (*path, *tail)
