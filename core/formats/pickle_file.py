"""A plain pickle file (joblib/scikit-learn style, or any `pickle.dump` output).

torch.load sends such a file down its legacy path and refuses it ("Invalid magic number;
corrupt file?" once the restricted unpickler read the first pickle): that is
`weights_only.loadable`. The question users actually ask, would torch's restricted
unpickler accept this pickle, is `weights_only.policy_accepts`, and the verdict follows it.
"""

from __future__ import annotations

from ckptguard.core.errors import Code, LimitExceeded
from ckptguard.core.filemap import add_region
from ckptguard.core.io.source import ByteSource
from ckptguard.core.judge import scan_pickle
from ckptguard.core.state import Analysis
from ckptguard.core.torch.answer import first_line, set_weights_only


def analyze(source: ByteSource, an: Analysis) -> None:
    limits = an.options.limits
    if source.size > limits.max_pickle_bytes:
        raise LimitExceeded(Code.LIMIT_PICKLE_SIZE,
                            f"{source.size}-byte pickle exceeds {limits.max_pickle_bytes}")
    data = source.read_at(0, source.size)
    scan = scan_pickle(data, an, record=None, base_offset=0)
    # no STOP: the whole file is what pickle.load would read
    end = scan.end if scan.vm.complete else source.size
    add_region(an.map_regions, "pickle", "pickle", 0, end)
    trailing = next((f.offset for f in an.findings if f.code is Code.PICKLE_TRAILING_DATA
                     and f.record is None and f.offset is not None), source.size)
    add_region(an.map_regions, "pickle", "pickles after STOP", end, trailing - end)
    set_weights_only(an, scan.weights_only.error, None if scan.fast else data,
                     calls=scan.vm.calls)
    if not scan.vm.persids and an.weights_only is not None:   # else core.scan replays it
        policy = an.weights_only
        # torch's legacy reader, only for the answer torch.load gives (a small scan of a
        # pickle must not import the manifest builder at start: tests/core/scan/test_cold_start)
        from ckptguard.core.formats.torch_legacy import legacy_answer

        error = legacy_answer(source, an, first=scan.weights_only)
        policy.policy_accepts = policy.loadable
        policy.loadable = error is None
        policy.error = first_line(error.message) if error else None
        policy.error_type = error.type if error else None
