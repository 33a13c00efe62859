"""A plain pickle file (joblib/scikit-learn style, or any `pickle.dump` output).

torch.load would send such a file down its legacy path and refuse it ("Invalid magic
number"), so for this format `weights_only.loadable` states the policy question
users actually ask: would torch's restricted unpickler accept this pickle?
"""

from __future__ import annotations

from core.analysis import Analysis
from core.errors import Code, LimitExceeded
from core.pickle_scan import scan_pickle
from core.report import WeightsOnly
from core.source import ByteSource
from core.weights_only import safe_globals_hint, unsafe_globals


def analyze(source: ByteSource, an: Analysis) -> None:
    limits = an.options.limits
    if source.size > limits.max_pickle_bytes:
        raise LimitExceeded(Code.LIMIT_PICKLE_SIZE,
                            f"{source.size}-byte pickle exceeds {limits.max_pickle_bytes}")
    data = source.read_at(0, source.size)
    scan = scan_pickle(data, an, record=None, base_offset=0)
    wo = scan.weights_only
    listed = unsafe_globals(data, an.options.allow)
    names = listed if isinstance(listed, list) else []
    benign = [g.full for g in an.globals.values() if g.status == "benign"]
    an.weights_only = WeightsOnly(
        loadable=wo.error is None,
        error=wo.error.message.splitlines()[0] if wo.error else None,
        error_type=wo.error.type if wo.error else None,
        unsafe_globals=names,
        safe_globals_hint=safe_globals_hint(benign) if benign else None,
    )
    if wo.error is not None:
        an.add(Code.TORCH_WEIGHTS_ONLY_FAILED, wo.error.message.splitlines()[0],
               offset=wo.error.offset)
