import pickle

import pytest

from ckptguard.core.errors import CkptError, Code, Effect, FormatError, LimitExceeded, SourceError
from ckptguard.core.report import Finding, decide_verdict


@pytest.mark.parametrize("cls", [CkptError, SourceError, FormatError, LimitExceeded])
def test_errors_cross_process_boundary_intact(cls: type[CkptError]) -> None:
    err = cls(Code.PICKLE_TRUNCATED, "ends early", offset=17, record="a/data.pkl")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert (back.code, back.message, back.offset, back.record) == (
        Code.PICKLE_TRUNCATED, "ends early", 17, "a/data.pkl")
    assert "offset 17" in str(back)


def test_every_code_value_equals_its_name_and_has_a_doc() -> None:
    for code in Code:
        assert code.value == code.name
        assert code.doc and code.severity and code.effect


def test_verdict_worst_effect_wins() -> None:
    f = lambda c: Finding(c, "m")  # noqa: E731
    assert decide_verdict([], True) == "safe"
    assert decide_verdict([], False) == "suspicious"
    assert decide_verdict([f(Code.ZIP_COMMENT)], True) == "safe"
    assert decide_verdict([f(Code.PICKLE_UNKNOWN_GLOBAL)], True) == "suspicious"
    assert decide_verdict([f(Code.PICKLE_TRUNCATED), f(Code.PICKLE_UNKNOWN_GLOBAL)], False) == "invalid"
    assert decide_verdict([f(Code.PICKLE_TRUNCATED), f(Code.PICKLE_DANGEROUS_GLOBAL)], False) == "unsafe"
    assert Code.PICKLE_DANGEROUS_GLOBAL.effect is Effect.UNSAFE


def test_every_unsafe_code_names_the_readers_that_disagree() -> None:
    """`unsafe` needs evidence: each code with that effect says which two readers people use
    would read different bytes or run different code, and only those codes do."""
    from ckptguard.core.errors import UNSAFE_EVIDENCE, Code, Effect

    unsafe = {c for c in Code if c.effect is Effect.UNSAFE}
    assert set(UNSAFE_EVIDENCE) == unsafe
    assert all(len(why) > 40 for why in UNSAFE_EVIDENCE.values())


def test_every_critical_code_is_unsafe_with_its_rule_in_the_codes_table() -> None:
    """`critical` is the severity of evidence alone: each critical code makes the file unsafe,
    and the README's codes table prints its rule (the readers that disagree) beside it."""
    from ckptguard.app.cli import codes_markdown
    from ckptguard.core.errors import UNSAFE_EVIDENCE, Code, Effect, Severity

    table = codes_markdown()
    for code in Code:
        if code.severity is Severity.CRITICAL:
            assert code.effect is Effect.UNSAFE, code
            assert f"- `{code.value}` (critical): {UNSAFE_EVIDENCE[code]}." in table, code
