"""core/pickle/opcodes.py: the table equals pickletools', TORCH_ACCEPTED equals torch's, text decoders."""

from __future__ import annotations

import pathlib
import pickle
import pickletools
import re

import pytest

import ckptguard.core.pickle.opcodes as opc
from ckptguard.core.errors import Code, FormatError
from ckptguard.core.pickle.opcodes import BY_NAME, OPCODES
from ckptguard.core.torch.rules import TORCH_ACCEPTED


def test_table_equals_pickletools() -> None:
    expected = {
        o.name: (o.code.encode("latin-1")[0], o.arg.name if o.arg else None, o.proto)
        for o in pickletools.opcodes
    }
    assert {n: (i.code, i.arg, i.proto) for n, i in BY_NAME.items()} == expected
    assert sum(info is not None for info in OPCODES) == len(pickletools.opcodes) == 68
    for byte, info in enumerate(OPCODES):
        assert info is None or info.code == byte


def test_fixed_sizes_match_pickletools() -> None:
    for o in pickletools.opcodes:
        info = BY_NAME[o.name]
        n = o.arg.n if o.arg else 0
        assert info.fixed_size == (n if n >= 0 else None), o.name


def test_torch_accepted_equals_torch_source() -> None:
    import torch._weights_only_unpickler as wou

    src = pathlib.Path(wou.__file__).read_text()
    load = src[src.index("    def load(self):"):src.index("    # Return a list of items pushed")]
    names = set(re.findall(r"key\[0\] == ([A-Z0-9_]+)\[0\]", load))
    for group in re.findall(r"key\[0\] in \[([A-Z0-9_\[\], ]+)\]", load):
        names |= set(re.findall(r"([A-Z0-9_]+)\[0\]", group))
    assert names == TORCH_ACCEPTED
    assert TORCH_ACCEPTED <= set(BY_NAME)


def test_torch_accepted_covers_protocol2_state_dict(state_dict_pkl: bytes) -> None:
    used = {op.name for op, _arg, _pos in pickletools.genops(state_dict_pkl)}
    assert used <= TORCH_ACCEPTED


@pytest.mark.parametrize(("line", "value"), [
    (b"00", False), (b"01", True), (b"0", 0), (b"-17", -17), (b"123", 123), (b"0x10", 16),
])
def test_decode_int_line(line: bytes, value: int) -> None:
    got = opc.decode_int_line(line, offset=0)
    assert got == value and type(got) is type(value)
    assert got == pickle.loads(b"I" + line + b"\n.")


@pytest.mark.parametrize("line", [b"", b"abc", b"1.5", b"9" * 5000, b"9" * 1_000_000])
def test_decode_int_line_rejects(line: bytes) -> None:
    with pytest.raises(FormatError) as ei:
        opc.decode_int_line(line, offset=5)
    assert ei.value.code is Code.PICKLE_MALFORMED and ei.value.offset == 5


def test_decode_long_float_index_string_unicode() -> None:
    assert opc.decode_long_line(b"12345678901234567890L", offset=0) == 12345678901234567890
    assert opc.decode_long_line(b"-3", offset=0) == -3
    assert opc.decode_float_line(b"1e300", offset=0) == 1e300
    assert opc.decode_index_line(b"42", offset=0) == 42
    assert opc.decode_string_line(b"'a\\nb'", offset=0) == "a\nb"
    assert opc.decode_string_line(b'"\\xff"', offset=0) == b"\xff"
    assert opc.decode_unicode_line(b"\\u20ac", offset=0) == "€"
    for bad in (lambda: opc.decode_float_line(b"x", offset=0),
                lambda: opc.decode_index_line(b"-1", offset=0),
                lambda: opc.decode_string_line(b"noquotes", offset=0),
                lambda: opc.decode_string_line(b"'\\'", offset=0),
                lambda: opc.decode_unicode_line(b"\\u12", offset=0),
                lambda: opc.decode_long_line(b"1" * 10**6 + b"L", offset=0)):
        with pytest.raises(FormatError):
            bad()
