"""A plain pickle file (joblib/scikit-learn style, or any `pickle.dump` output).

torch.load would send such a file down its legacy path and refuse it ("Invalid magic
number"), so for this format `weights_only.loadable` states the policy question
users actually ask: would torch's restricted unpickler accept this pickle?
"""

from __future__ import annotations

from ckptguard.core.errors import Code, LimitExceeded
from ckptguard.core.filemap import add_region
from ckptguard.core.io.source import ByteSource
from ckptguard.core.judge import scan_pickle, set_weights_only
from ckptguard.core.state import Analysis


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
