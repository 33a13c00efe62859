"""The containers the C unpickler builds on the fast paths, in place of list, dict and
OrderedDict: each refuses (raises `Decline`) what torch's restricted unpickler would refuse
or what the C unpickler would do differently (core.pickle.fast.tokenize rewrites EMPTY_LIST
and EMPTY_DICT to build them; core.pickle.fast.stubs subclasses `OrderedDictStub` per load).

A module of their own, with no regex and no pickle machinery, so the torch rules that
recognise them (core.torch.rules) import them without the fast paths' start-up cost.
"""

from __future__ import annotations

from collections import OrderedDict

from ckptguard.core.errors import Decline

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any


class CheckedList(list["Any"]):
    """EMPTY_LIST: a list that, like torch's unpickler, refuses SETITEM."""

    __slots__ = ()

    def __setitem__(self, key: Any, value: Any) -> None:
        raise Decline("SETITEM on a list")


# dict keys the C-speed paths let the C unpickler hash: plain data, O(1) to hash
PLAIN_KEYS = frozenset((str, int, bool, type(None), bytes, float))


def check_key(key: Any) -> None:
    """Decline a dict key that is not plain data: hashing a tuple visits every path through
    it (a tuple DAG built from the memo: 2**depth steps, in C, with no way to stop it), and
    storages, tensors, globals or NaN as keys are the exact interpreters' to judge."""
    if type(key) not in PLAIN_KEYS or key != key:
        raise Decline(f"a {type(key).__name__} dict key")


class CheckedDict(dict["Any", "Any"]):
    """EMPTY_DICT: a dict that takes only plain keys (`check_key`). Each key costs one
    Python call (the C unpickler calls `__setitem__` of a dict subclass)."""

    __slots__ = ()

    def __setitem__(self, key: Any, value: Any) -> None:
        if type(key) not in PLAIN_KEYS or key != key:   # check_key, inline: one call a key
            check_key(key)
        dict.__setitem__(self, key, value)


class BuildLedger:
    """The BUILDs one load's stubs judged (`__setstate__` calls) and the keys checked."""

    __slots__ = ("count", "keys", "max_keys")

    def __init__(self, max_keys: int) -> None:
        self.count = 0
        self.keys = 0
        self.max_keys = max_keys   # Limits.max_build_state_keys: past it the exact path decides

    def judge(self, state: Any) -> None:
        """Decline unless `state` is what the fast paths may apply to an OrderedDict: a dict
        with no dunder key (`{'__setstate__': f}` plants f: core.threats.assess judges that, on
        the exact path)."""
        self.count += 1
        if type(state) is not CheckedDict:
            raise Decline("BUILD on OrderedDict with a non-dict state")
        self.keys += len(state)
        if self.keys > self.max_keys:
            raise Decline("BUILD states with too many keys in all")
        if any(type(k) is not str or k.startswith("__") for k in state):
            raise Decline("BUILD on OrderedDict with a dunder or non-str key")


class OrderedDictStub(OrderedDict["Any", "Any"]):
    """`OrderedDict()` at C speed; BUILD updates `__dict__` with a dict, as torch does.
    Subclassed per load: `builds` is that load's count of judged BUILDs."""

    builds: BuildLedger
    # no arguments (`OrderedDict(pairs)` raises in C: the exact path models it); an
    # OrderedDict is valid without its __init__, which only adds the arguments
    __init__ = dict.clear  # type: ignore[assignment]

    def __setitem__(self, key: Any, value: Any) -> None:   # see pickletoken.CheckedDict
        if type(key) not in PLAIN_KEYS or key != key:
            check_key(key)
        OrderedDict.__setitem__(self, key, value)

    def __setstate__(self, state: Any) -> None:
        self.builds.judge(state)
        self.__dict__.update(state)
