"""Every resource cap of a scan, in one frozen record."""

from __future__ import annotations

from ckptguard.core.records import record


@record(frozen=True, slots=True)
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
    # characters of the tensors' whole names over all tensors: a name is joined and hashed
    # whole before it is shortened to max_name_chars (one memoized long key under many
    # tensors is a few KB of pickle)
    max_manifest_name_chars: int = 256 * 1024 * 1024
    # one tensor's name (and path): longer ones keep a prefix + "...#sha256:" + the digest of
    # the whole name (LIMIT_NAME), so names under a deep memoized key stay small
    max_name_chars: int = 512
    # The report's JSON (`json.dumps(report.to_json())`) may take so much per byte of the
    # pickles the scan judged (decompressed), per tensor and per zip entry (a region or a
    # finding about it), or the floor if that is more, never more than max_report_bytes; past
    # it the lists are cut with counts (LIMIT_REPORT, suspicious at best). Issue 14's target:
    # 8 x pickle bytes + 2 KiB per tensor.
    max_report_bytes: int = 256 * 1024 * 1024
    report_floor_bytes: int = 64 * 1024
    report_bytes_per_pickle_byte: int = 8
    report_bytes_per_tensor: int = 2048
    report_bytes_per_entry: int = 256
    max_bytes_read: int = 1024 * 1024 * 1024     # what a scan may read (not the file size)
    # a remote body slower than this on average, once the grace period has passed, is cut:
    # a server trickling one byte every few seconds never trips a per-read timeout
    min_transfer_rate: int = 64 * 1024            # bytes per second
    transfer_grace_seconds: float = 30.0
    max_header_bytes: int = 100_000_000          # safetensors' own cap
    max_npy_header_bytes: int = 10_000           # numpy's default cap
    max_npy_headers_total: int = 2 * 1024 * 1024  # all .npy headers of one .npz together
    max_trailing_pickles: int = 16
    # Keys of all OrderedDict BUILD states of one pickle, and items of the containers calls
    # copy (set(list), OrderedDict(pairs), Counter(dict)): torch updates `__dict__` with every
    # key of every BUILD, so one memoized 10k-key state applied by 100k BUILDs costs 1 G steps
    # (torch's and every walk of ours). Past it: not modelled, "would take minutes or hang".
    max_build_state_keys: int = 1_000_000
    max_vm_notes: int = 10_000                  # the symbolic VM's notes per pickle
    # dict-key / set-member nodes the VM hashes for one pickle: the same memoized 10k-node
    # tuple used as a key 200k times would cost 2 G steps, in our walk and in CPython's hash
    max_key_nodes: int = 2_000_000
    # Constant folding of computed STACK_GLOBAL operands (core.pickle.fold): one str/bytes/
    # container in or out, the calls evaluated for one operand, its nesting, and the steps
    # of every fold of one pickle together (evaluation and the mutation check). Past them
    # the operand is unresolved, which is itself reported as evasion (fail closed).
    max_fold_bytes: int = 64 * 1024
    max_fold_calls: int = 1024                  # calls and map()/reduce() applications
    max_fold_depth: int = 64
    max_fold_steps: int = 1_000_000
    max_nested_pickles: int = 64                # inline pickles (pickle.loads(b'...')) interpreted per scan
    max_nested_pickle_depth: int = 2            # an inline pickle inside an inline pickle, at most
    # legacy .tar: header blocks walked, bytes of one pax/GNU long-name record, and how far
    # torch's tarfile.open probe may need to read before the first real header
    max_tar_headers: int = 10_000
    max_tar_pax_bytes: int = 1 << 20
    max_tar_probe_bytes: int = 1 << 20
    # torch.export .pt2: model JSON, small records, models judged, the report's summary
    max_pt2_json_bytes: int = 256 * 1024 * 1024
    max_pt2_small_record: int = 64
    max_pt2_models: int = 64
    max_pt2_summary_json: int = 2048
    max_pt2_expr_chars: int = 4096              # one symbolic expression (sympy would eval it)
    max_pt2_graph_depth: int = 32               # nested higher-order subgraphs
    max_pt2_violations: int = 200               # verifier violations listed per model
    # Regions torch skips (appended/prepended bytes, gaps, unreferenced or refused records,
    # extra members) are sniffed and, when pickle-like, judged (core.regions). One budget per
    # scan: past it a region is REGION_UNJUDGED (suspicious), never read whole.
    max_region_bytes: int = 64 * 1024 * 1024     # bytes all regions of one scan may read
    max_regions: int = 4096                     # regions judged per scan (sniffed, at least)
    max_region_depth: int = 2                   # a zip in a region in a zip in a region
    region_sniff_bytes: int = 4096              # first read of a region: decides what it is
    max_region_findings: int = 8                # REGION_UNJUDGED listed one by one, then a summary
    # Entries that share a name are read and compared (core.zip.checks): byte-identical ones
    # are a note, not evidence. Past this many bytes per scan they stay ZIP_DUPLICATE_NAME.
    max_duplicate_bytes: int = 64 * 1024 * 1024
    # Findings: past these a report lists one summary per code instead of every repeat, so
    # its size follows the anomalies' kinds, not their count.
    max_zip_findings_per_code: int = 50         # zip forensics
    max_findings_per_code: int = 1_000          # any code (and severity), then one summary
    max_pt2_findings_per_code: int = 100
    max_pt2_message_chars: int = 600
    max_nested_findings: int = 200              # merged from a checkpoint nested in a .pt2
    max_format_findings: int = 64               # safetensors violations
    max_call_findings: int = 64                 # dangerous calls per pickle
    max_notes_per_code: int = 32                # the VM's notes, per code and pickle
    max_global_findings: int = 256              # per code and pickle (every global keeps its entry)
    # Report.regions (the map of the file): past it, archive records are merged into runs
    max_map_regions: int = 10_000


DEFAULT_LIMITS = Limits()
