"""The one error tree of ckptguard and the stable finding codes.

    CkptError(code, message, *, offset=None, record=None)
     +-- SourceError     could not read the input at all: no verdict
     +-- FormatError     the bytes are not what they claim: verdict invalid
     +-- LimitExceeded   a resource cap was hit: verdict invalid (fail closed)

Every error pickles with its fields intact, so it crosses the worker-process
boundary of the service. `Code` values are public: a released value never changes.
Each code carries its default severity, the verdict it forces, and the one-line
description used for the README table.
"""

from __future__ import annotations

from enum import StrEnum

TYPE_CHECKING = False   # typing stays unimported at run time (core/typenames.py)
if TYPE_CHECKING:
    from typing import Any


class Severity(StrEnum):
    CRITICAL = "critical"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    INFO = "info"


class Effect(StrEnum):
    """What a finding does to the verdict (worst wins: unsafe > invalid > suspicious > safe)."""

    UNSAFE = "unsafe"
    INVALID = "invalid"
    SUSPICIOUS = "suspicious"
    NONE = "none"


_C, _H, _M, _L, _I = (Severity.CRITICAL, Severity.HIGH, Severity.MEDIUM, Severity.LOW,
                      Severity.INFO)
_U, _X, _S, _N = Effect.UNSAFE, Effect.INVALID, Effect.SUSPICIOUS, Effect.NONE


class Code(StrEnum):
    """Stable finding/error codes. Layer prefix: SOURCE_ ZIP_ PICKLE_ TORCH_ ST_ NPY_ PT2_ REGION_ LIMIT_."""

    severity: Severity
    effect: Effect
    doc: str

    def __new__(cls, value: str, severity: Severity, effect: Effect, doc: str) -> Code:
        obj = str.__new__(cls, value)
        obj._value_ = value
        obj.severity = severity
        obj.effect = effect
        obj.doc = doc
        return obj

    # --- source: reading the input --------------------------------------------------
    SOURCE_IO = "SOURCE_IO", _H, _X, "the input could not be read"
    SOURCE_SHORT_READ = "SOURCE_SHORT_READ", _H, _X, "the input ended before an expected byte"
    SOURCE_HTTP = "SOURCE_HTTP", _H, _X, "an HTTP range request failed or was answered wrongly"
    SOURCE_CHANGED = "SOURCE_CHANGED", _H, _X, "the remote file changed between range requests"
    SOURCE_URL_REFUSED = "SOURCE_URL_REFUSED", _H, _X, "the URL or a redirect target is not allowed"
    SOURCE_BAD_REQUEST = "SOURCE_BAD_REQUEST", _H, _X, "the URL or a request header is malformed"

    # --- format detection -------------------------------------------------------------
    FORMAT_UNKNOWN = "FORMAT_UNKNOWN", _M, _S, "the content matches no known checkpoint format"
    FORMAT_EMPTY = "FORMAT_EMPTY", _M, _X, "the input is empty"
    FORMAT_EXTENSION_MISMATCH = ("FORMAT_EXTENSION_MISMATCH", _L, _N,
                                 "the file name suggests another format than its content")

    # --- zip container --------------------------------------------------------------
    ZIP_NO_EOCD = "ZIP_NO_EOCD", _H, _X, "no end-of-central-directory record"
    ZIP_BAD_EOCD = "ZIP_BAD_EOCD", _H, _X, "EOCD or zip64 records are inconsistent"
    ZIP_BAD_CENTRAL_DIR = "ZIP_BAD_CENTRAL_DIR", _H, _X, "central directory is malformed"
    ZIP_BAD_LOCAL_HEADER = "ZIP_BAD_LOCAL_HEADER", _H, _X, "a local file header is malformed"
    ZIP_DUPLICATE_NAME = ("ZIP_DUPLICATE_NAME", _C, _U,
                          "two entries share a name (or differ only in case) and hold different "
                          "bytes, or bytes too many to compare: readers disagree on which one counts")
    ZIP_LOCAL_CENTRAL_MISMATCH = ("ZIP_LOCAL_CENTRAL_MISMATCH", _C, _U,
                                  "local header disagrees with central directory in a field readers "
                                  "locate, decode or name the bytes by (name, method, sizes, the "
                                  "UTF-8 flag of a non-ASCII name)")
    ZIP_OVERLAPPING_ENTRIES = ("ZIP_OVERLAPPING_ENTRIES", _C, _U,
                               "two entries' bytes overlap")
    ZIP_PREPENDED_DATA = ("ZIP_PREPENDED_DATA", _H, _S,
                          "bytes before the first record (polyglot or self-extracting)")
    ZIP_APPENDED_DATA = "ZIP_APPENDED_DATA", _H, _S, "bytes after the end of the archive"
    ZIP_UNREFERENCED_DATA = ("ZIP_UNREFERENCED_DATA", _M, _S,
                             "bytes between records that no entry accounts for")
    ZIP_COMPRESSED_ENTRY = ("ZIP_COMPRESSED_ENTRY", _L, _N,
                            "a record is compressed: offsets cannot be computed for it")
    ZIP_UNSUPPORTED_METHOD = "ZIP_UNSUPPORTED_METHOD", _M, _S, "unsupported compression method"
    ZIP_ENCRYPTED_ENTRY = "ZIP_ENCRYPTED_ENTRY", _H, _S, "a record is encrypted"
    ZIP_PATCHED_ENTRY = ("ZIP_PATCHED_ENTRY", _H, _S,
                         "a record is flagged as compressed patched data (bit 5), which torch's "
                         "zip reader refuses ('unsupported feature')")
    ZIP_DIRECTORY_WITH_DATA = ("ZIP_DIRECTORY_WITH_DATA", _H, _U,
                               "an entry with bytes is a directory to torch's zip reader (its "
                               "name ends with / or its DOS directory attribute is set): torch "
                               "reads uninitialized memory where other readers read the bytes")
    ZIP_NAME_OUTSIDE_PREFIX = ("ZIP_NAME_OUTSIDE_PREFIX", _M, _S,
                               "an entry lies outside the archive's prefix directory")
    ZIP_BAD_NAME = "ZIP_BAD_NAME", _M, _S, "an entry name is absolute, has .. or is not UTF-8"
    ZIP_CRC_MISMATCH = "ZIP_CRC_MISMATCH", _M, _S, "a record's CRC-32 does not match its bytes"
    ZIP_MULTIPLE_DISKS = "ZIP_MULTIPLE_DISKS", _M, _X, "multi-disk archives are not supported"
    ZIP_COMMENT = "ZIP_COMMENT", _I, _N, "the archive has a comment"
    ZIP_BAD_RECORD_DATA = ("ZIP_BAD_RECORD_DATA", _M, _S,
                           "a compressed record does not inflate to its declared size")
    ZIP_DUPLICATE_IDENTICAL = ("ZIP_DUPLICATE_IDENTICAL", _L, _N,
                               "entries share a name (or differ only in case) but hold the same "
                               "bytes by the same method: whichever a reader picks, it reads them")
    ZIP_LOCAL_CENTRAL_COSMETIC = ("ZIP_LOCAL_CENTRAL_COSMETIC", _L, _N,
                                  "local header differs from the central directory only in fields "
                                  "no reader locates or decodes the bytes by (CRC, data-descriptor "
                                  "or other option flags): every reader reads the same bytes, some "
                                  "refuse or warn")

    # --- pickle -----------------------------------------------------------------------
    PICKLE_TRUNCATED = "PICKLE_TRUNCATED", _H, _X, "the pickle ends before STOP"
    PICKLE_MALFORMED = ("PICKLE_MALFORMED", _H, _X,
                        "an opcode or argument is malformed (bad opcode, stack underflow, ...)")
    PICKLE_UNKNOWN_OPCODE = "PICKLE_UNKNOWN_OPCODE", _H, _X, "an opcode no protocol defines"
    PICKLE_DANGEROUS_GLOBAL = ("PICKLE_DANGEROUS_GLOBAL", _C, _U,
                               "a global known to allow code execution or system access")
    PICKLE_DANGEROUS_CALL = ("PICKLE_DANGEROUS_CALL", _C, _U,
                             "a call of a dangerous global, or a call built from gadgets")
    PICKLE_UNKNOWN_GLOBAL = ("PICKLE_UNKNOWN_GLOBAL", _M, _S,
                             "a global outside the weights-only allowlist")
    PICKLE_BENIGN_GLOBAL = ("PICKLE_BENIGN_GLOBAL", _L, _S,
                            "a global outside the allowlist that is commonly benign")
    PICKLE_NESTED_DESERIALIZER = ("PICKLE_NESTED_DESERIALIZER", _C, _U,
                                  "a call into another deserializer (pickle, torch.load, ...)")
    PICKLE_TRAILING_DATA = "PICKLE_TRAILING_DATA", _M, _S, "bytes after the pickle's STOP"
    PICKLE_SECOND_PICKLE = ("PICKLE_SECOND_PICKLE", _H, _S,
                            "a second pickle stream follows the first")
    PICKLE_NON_ASCII_GLOBAL = ("PICKLE_NON_ASCII_GLOBAL", _M, _S,
                               "a global name that is not a plain identifier")
    PICKLE_OUT_OF_BAND_BUFFER = ("PICKLE_OUT_OF_BAND_BUFFER", _M, _S,
                                 "NEXT_BUFFER/READONLY_BUFFER (protocol 5 out-of-band data)")
    PICKLE_EXTENSION_CODE = ("PICKLE_EXTENSION_CODE", _M, _S,
                             "EXT1/2/4 copyreg extension reference (global not statically known)")
    PICKLE_PROTOCOL = "PICKLE_PROTOCOL", _I, _N, "pickle protocol other than torch's default 2"
    PICKLE_POLYGLOT = ("PICKLE_POLYGLOT", _H, _U,
                       "the file's first bytes are also a pickle that imports (pickle.load would run it)")
    PICKLE_COMPUTED_GLOBAL = ("PICKLE_COMPUTED_GLOBAL", _M, _S,
                              "a STACK_GLOBAL module or name computed by pure calls: folded to a "
                              "constant, the global is judged as if written")
    PICKLE_COMPUTED_IMPORT = ("PICKLE_COMPUTED_IMPORT", _H, _U,
                              "a STACK_GLOBAL module or name computed by calls that cannot be "
                              "resolved statically (evasion: no benign pickle computes its imports)")
    PICKLE_FRAME_DIVERGENCE = ("PICKLE_FRAME_DIVERGENCE", _H, _U,
                               "an opcode runs past its FRAME's end: pickle.load(file) reads other "
                               "bytes than pickle.loads (hidden opcodes; what that reader runs is "
                               "judged too, at its file offsets)")
    PICKLE_GLOBAL_MUTATION = ("PICKLE_GLOBAL_MUTATION", _H, _U,
                              "BUILD/SETITEM(S)/APPEND(S) on an imported object (sys.path, os.environ)")

    # --- torch semantics -----------------------------------------------------------------
    TORCH_WEIGHTS_ONLY_FAILED = ("TORCH_WEIGHTS_ONLY_FAILED", _M, _S,
                                 "torch.load(weights_only=True) would refuse this file")
    TORCHSCRIPT_ARCHIVE = ("TORCHSCRIPT_ARCHIVE", _H, _S,
                           "a TorchScript archive: code, not weights; not weights-only loadable")
    TORCH_TAR_UNDECIDED = ("TORCH_TAR_UNDECIDED", _H, _S,
                           "whether torch.load reads the file as a legacy .tar cannot be told "
                           "(a header chain past Limits.max_tar_probe_bytes, or pax records "
                           "Python's tarfile versions parse differently): both readings are judged")
    TORCH_LEGACY_TAR = ("TORCH_LEGACY_TAR", _M, _S,
                        "legacy .tar checkpoint: refused by weights_only (CVE-2025-32434 path)")
    TORCH_MISSING_RECORD = "TORCH_MISSING_RECORD", _H, _X, "a storage's data record is missing"
    TORCH_RECORD_SIZE_MISMATCH = ("TORCH_RECORD_SIZE_MISMATCH", _H, _S,
                                  "a storage record's size differs from numel x element size")
    TORCH_OFFSET_MISMATCH = ("TORCH_OFFSET_MISMATCH", _L, _N,
                             "a storage is not where torch's own writer would put it (another "
                             "zip writer): torch.load reads it at its local header")
    TORCH_OFFSET_UNVERIFIABLE = ("TORCH_OFFSET_UNVERIFIABLE", _L, _N,
                                 "offsets cannot be chained (pre-2.7 file or compressed record); names "
                                 "the deflated storages torch.load(mmap=True) reads as compressed bytes")
    TORCH_STORAGE_ORDER = ("TORCH_STORAGE_ORDER", _M, _S,
                           "data records are not in pickle order (first key is not '0')")
    TORCH_TENSOR_OUT_OF_BOUNDS = ("TORCH_TENSOR_OUT_OF_BOUNDS", _H, _S,
                                  "a tensor view reaches outside its storage")
    TORCH_BAD_TENSOR_ARGS = ("TORCH_BAD_TENSOR_ARGS", _M, _S,
                             "a tensor rebuild call has arguments torch would reject, or a BUILD "
                             "re-points the tensor it made (torch.save never writes one)")
    TORCH_UNREFERENCED_RECORD = ("TORCH_UNREFERENCED_RECORD", _M, _S,
                                 "an archive record no storage refers to (hidden payload?)")
    TORCH_BAD_VERSION = "TORCH_BAD_VERSION", _M, _S, "the archive version record is missing or invalid"
    TORCH_BAD_BYTEORDER = "TORCH_BAD_BYTEORDER", _M, _S, "the byteorder record is invalid"
    TORCH_BIG_ENDIAN = "TORCH_BIG_ENDIAN", _I, _N, "storages are big-endian (torch byte-swaps them)"
    TORCH_LEGACY_FORMAT = ("TORCH_LEGACY_FORMAT", _I, _N,
                           "legacy pickled-stream checkpoint (_use_new_zipfile_serialization=False)")
    TORCH_BAD_LEGACY_STREAM = ("TORCH_BAD_LEGACY_STREAM", _H, _X,
                               "the legacy stream's magic, protocol or storage blocks are wrong")

    # --- safetensors / numpy / torch.export ------------------------------------------------
    ST_BAD_HEADER = "ST_BAD_HEADER", _H, _X, "the safetensors header is invalid"
    ST_BAD_OFFSETS = "ST_BAD_OFFSETS", _H, _X, "safetensors data offsets are invalid"
    ST_BAD_DTYPE = "ST_BAD_DTYPE", _H, _X, "a safetensors tensor has an unknown dtype"
    ST_BAD_SHAPE = "ST_BAD_SHAPE", _H, _X, "a safetensors shape is not a list of unsigned integers"
    ST_SIZE_MISMATCH = ("ST_SIZE_MISMATCH", _H, _X,
                        "a safetensors tensor's byte span differs from shape x dtype size")
    ST_NOT_COVERED = ("ST_NOT_COVERED", _H, _X,
                      "safetensors tensors do not cover the data buffer exactly")
    ST_BAD_METADATA = "ST_BAD_METADATA", _H, _X, "safetensors __metadata__ is not a str -> str map"
    ST_DUPLICATE_NAME = ("ST_DUPLICATE_NAME", _M, _S,
                         "a safetensors tensor name repeats: readers may pick different entries")
    NPY_BAD_HEADER = "NPY_BAD_HEADER", _H, _X, "the .npy header is invalid"
    NPY_OBJECT_ARRAY = ("NPY_OBJECT_ARRAY", _M, _S,
                        "an object array: its data is a pickle (allow_pickle needed)")
    NPY_BAD_SHAPE = "NPY_BAD_SHAPE", _H, _X, "a .npy shape has a negative dimension"
    NPY_TRUNCATED = "NPY_TRUNCATED", _H, _X, "a .npy file ends before its array data does"
    NPY_TRAILING_DATA = ("NPY_TRAILING_DATA", _M, _S,
                         "bytes after a .npy array's data (np.load ignores them)")
    PT2_BAD_ARCHIVE = "PT2_BAD_ARCHIVE", _H, _X, "the torch.export archive is malformed"
    PT2_VERIFIER = "PT2_VERIFIER", _H, _S, "the exported program fails torch's verifier rules"
    PT2_UNSAFE_PAYLOAD = ("PT2_UNSAFE_PAYLOAD", _H, _S,
                          "a part torch.export.load would unpickle without weights_only")
    PT2_MISSING_RECORD = ("PT2_MISSING_RECORD", _H, _X,
                          "a record torch.export.load reads (config, weight, sample inputs) is missing")
    PT2_GUARDS_CODE = ("PT2_GUARDS_CODE", _H, _S,
                       "guards_code: Python source that ExportedProgram.module() runs with exec")
    PT2_UNSAFE_TARGET = ("PT2_UNSAFE_TARGET", _C, _U,
                         "a graph node target resolving to a torch callable outside torch.ops")
    PT2_SYMPY_EXPR = ("PT2_SYMPY_EXPR", _H, _S,
                      "a symbolic expression torch.export.load would pass to sympy.sympify")
    PT2_SYMPY_EVAL = ("PT2_SYMPY_EVAL", _C, _U,
                      "an expr_str that runs code when sympy.sympify evaluates it")

    # --- regions: bytes torch does not read, but another reader would (core.regions) ---------
    REGION_PAYLOAD = ("REGION_PAYLOAD", _C, _U,
                      "bytes torch skips (appended, prepended, a gap, an unreferenced, refused or "
                      "extra member) hold a pickle with a dangerous global or call: a payload "
                      "that another reader would run")
    REGION_PICKLE = ("REGION_PICKLE", _M, _S,
                     "bytes torch skips hold a pickle that imports globals (none known dangerous)")
    REGION_UNJUDGED = ("REGION_UNJUDGED", _M, _S,
                       "a region torch skips was left unjudged: the scan's region budget ran out "
                       "or its pickle runs past the scanner's limits")

    # --- limits and the sandbox ------------------------------------------------------------
    LIMIT_OPCODES = "LIMIT_OPCODES", _H, _X, "too many pickle opcodes"
    LIMIT_MEMO = "LIMIT_MEMO", _H, _X, "too many memo entries"
    LIMIT_DEPTH = "LIMIT_DEPTH", _H, _X, "nesting too deep"
    LIMIT_STRING = "LIMIT_STRING", _H, _X, "a string or bytes argument is too long"
    LIMIT_CONTAINER = "LIMIT_CONTAINER", _H, _X, "a container or the stack is too large"
    LIMIT_ENTRIES = "LIMIT_ENTRIES", _H, _X, "too many archive entries"
    LIMIT_PICKLE_SIZE = "LIMIT_PICKLE_SIZE", _H, _X, "the pickle is larger than allowed"
    LIMIT_TENSORS = "LIMIT_TENSORS", _H, _X, "too many tensors"
    LIMIT_BYTES_READ = "LIMIT_BYTES_READ", _H, _X, "the scan would read more bytes than allowed"
    LIMIT_HEADER = "LIMIT_HEADER", _H, _X, "a format header is larger than allowed"
    LIMIT_NAME = ("LIMIT_NAME", _L, _N,
                  "tensor names or paths longer than the cap were shortened to a prefix and a digest")
    LIMIT_REPORT = ("LIMIT_REPORT", _M, _S,
                    "the report would pass its size cap: its lists were cut, the rest counted")
    RESOURCE_LIMIT = "RESOURCE_LIMIT", _H, _X, "the scan worker ran out of memory or CPU time"
    TIMEOUT = "TIMEOUT", _H, _X, "the scan took longer than the wall-clock limit"
    WORKER_CRASHED = "WORKER_CRASHED", _H, _X, "the scan worker died"
    INTERNAL_ERROR = "INTERNAL_ERROR", _H, _X, "a scanner bug: the input could not be judged"


# Why each code that makes a file `unsafe` is evidence, not oddity: which two readers that
# people really use would read different bytes or run different code. A code earns the
# `unsafe` effect only with such a line (tests/test_errors.py checks the two agree); the
# README prints them under the codes table (`ckptguard codes`).
UNSAFE_EVIDENCE: dict[Code, str] = {
    Code.ZIP_DUPLICATE_NAME: "torch (miniz: sorted central directory, binary search), Python's "
    "zipfile (the last entry of a name) and 7-Zip (`7z x`: the last with -aoa, the first with -aos) "
    "can pick different entries of one name, and the entries were not proven byte-identical (else "
    "ZIP_DUPLICATE_IDENTICAL)",
    Code.ZIP_LOCAL_CENTRAL_MISMATCH: "torch 2.13 and zipfile take method and sizes from the central "
    "directory, Info-ZIP unzip takes them from the local header (measured: other bytes out), and "
    "Java's ZipInputStream names the entry by its local name; a UTF-8 flag that differs on a "
    "non-ASCII name decodes it to another name (differences in CRC or other flags only are "
    "ZIP_LOCAL_CENTRAL_COSMETIC: 7-Zip refuses most of them with \"Headers Error\" and otherwise "
    "reads the central directory's bytes, like torch)",
    Code.ZIP_OVERLAPPING_ENTRIES: "central-directory readers (torch, zipfile) and streaming readers "
    "that walk local headers one after another see different entries in the shared bytes",
    Code.ZIP_DIRECTORY_WITH_DATA: "torch (miniz: a name ending in / or the DOS directory attribute "
    "makes an entry a directory, whose extract writes nothing) reads an uninitialized buffer of the "
    "entry's size, its values changing from run to run, where Python's zipfile.read returns the "
    "entry's bytes",
    Code.PICKLE_DANGEROUS_GLOBAL: "torch.load(weights_only=False) and pickle.load import and run it; "
    "the weights-only unpickler refuses it",
    Code.PICKLE_DANGEROUS_CALL: "torch.load(weights_only=False) and pickle.load make this call; the "
    "weights-only unpickler refuses it",
    Code.PICKLE_NESTED_DESERIALIZER: "pickle.load runs a second deserializer on bytes no weights-only "
    "reader ever checks",
    Code.PICKLE_POLYGLOT: "torch.load/np.load/safetensors read the file as weights; pickle.load (and "
    "torch.load(weights_only=False) on a non-zip) runs its first bytes as a pickle that imports",
    Code.PICKLE_GLOBAL_MUTATION: "pickle.load changes the loading process itself (sys.path, os.environ); "
    "the weights-only unpickler refuses it",
    Code.PICKLE_COMPUTED_IMPORT: "pickle.load imports whatever the computed name turns out to be; "
    "no reader can tell beforehand, and no benign writer computes its imports",
    Code.PICKLE_FRAME_DIVERGENCE: "pickle.load(file) honours FRAME boundaries and pickle.loads does "
    "not: the two run different opcodes",
    Code.REGION_PAYLOAD: "torch.load skips these bytes; zipfile, pickle.load, np.load or a loader "
    "hook that reads the extra member runs the pickle in them",
    Code.PT2_UNSAFE_TARGET: "torch.export.load builds a graph that calls a torch function outside "
    "torch.ops; the verifier of an honest export never emits one",
    Code.PT2_SYMPY_EVAL: "torch.export.load passes the text to sympy.sympify, which evaluates it as "
    "Python",
}


class CkptError(Exception):
    """Base of every error ckptguard raises; picklable across processes."""

    def __init__(self, code: Code, message: str, *, offset: int | None = None,
                 record: str | None = None) -> None:
        super().__init__(code, message, offset, record)
        self.code = code if isinstance(code, Code) else Code[str(code)]
        self.message = message
        self.offset = offset
        self.record = record

    def __reduce__(self) -> tuple[type[CkptError], tuple[Code, str], dict[str, object]]:
        return (type(self), (self.code, self.message),
                {"offset": self.offset, "record": self.record})

    def __setstate__(self, state: dict[str, Any] | None) -> None:
        self.__dict__.update(state or {})

    def __str__(self) -> str:
        where = f" at offset {self.offset}" if self.offset is not None else ""
        rec = f" in {self.record}" if self.record else ""
        return f"{self.code}: {self.message}{where}{rec}"


class SourceError(CkptError):
    """The input could not be read (I/O, HTTP, refused URL): there is no verdict."""


class FormatError(CkptError):
    """The bytes are malformed: the verdict is invalid."""


class LimitExceeded(CkptError):
    """A resource cap was hit: fail closed with verdict invalid."""


class Decline(Exception):
    """A fast path cannot vouch for this input: the caller runs the exact interpreters.

    Not a CkptError: it never reaches a report. Raised by the C-speed paths (core.pickle.fast,
    core.zip.columns, core.lane) before they have recorded anything.
    """
