"""Every resource cap of a scan, in one frozen record."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps that turn hostile input into an `invalid` report instead of a hang or an OOM."""

    max_pickle_bytes: int = 512 * 1024 * 1024   # data.pkl of a 1M-tensor checkpoint is ~100 MB
    max_opcodes: int = 50_000_000
    max_memo_entries: int = 10_000_000
    max_depth: int = 10_000                      # MARK nesting and value nesting
    max_stack: int = 10_000_000
    max_str_bytes: int = 256 * 1024 * 1024       # one string/bytes argument
    max_container_items: int = 50_000_000
    max_zip_entries: int = 2_000_000             # real checkpoints have >10k entries
    max_central_dir_bytes: int = 512 * 1024 * 1024
    max_tensors: int = 5_000_000
    max_manifest_dims: int = 16_000_000          # shape, stride and path items over all tensors
    max_bytes_read: int = 1024 * 1024 * 1024     # what a scan may read (not the file size)
    max_header_bytes: int = 100_000_000          # safetensors' own cap
    max_npy_header_bytes: int = 10_000           # numpy's default cap
    max_npy_headers_total: int = 2 * 1024 * 1024  # all .npy headers of one .npz together
    max_trailing_pickles: int = 16


DEFAULT_LIMITS = Limits()

# Keys of all OrderedDict BUILD states of one pickle: torch updates `__dict__` with every
# key of every BUILD, so one memoized 10k-key state applied by 100k BUILDs costs 1 G steps
# (torch's and every walk of ours). Past it: not modelled, "would take minutes or hang".
MAX_BUILD_STATE_KEYS = 1_000_000
