"""The knowledge base behind core.threats.assess: which globals execute code, which are inert data.

Strategy: three kinds of rules, all keyed by dotted paths after name mapping.
- DANGEROUS_MODULES: a module and every submodule/attribute below it (`os`, `os.path.x`);
- DANGEROUS_NAMES: one exact `module.name` (and anything reached through it);
- BENIGN_NAMES / BENIGN_MODULES: data containers with no side effects that real
  checkpoints carry outside torch's allowlist (HF TrainingArguments, Lightning
  hyper-parameters, NumPy arrays and scalars, omegaconf configs, ...).
This table only ever escalates: "benign" and "unknown" are both non-`safe` (the weights-only
allowlist alone decides `safe`, DESIGN.md), so a gap here can never make a file safe.
Sources: fickling's UNSAFE_IMPORTS, picklescan's deny list, ModelScan's, JFrog's and
ProtectAI's write-ups on scanner bypasses (uuid._get_command_stdout, pydoc.locate,
numpy.testing runstring, torch.fx reduce_graph_module, functools/operator gadgets), and the
functions bench/gadget_mining.py finds reaching exec/eval/imports/processes/loaders
(docs/threat-inventory.md says which, and which versions).
"""

from __future__ import annotations

from ckptguard.core.errors import Code, Severity

_C, _H, _M = Severity.CRITICAL, Severity.HIGH, Severity.MEDIUM
_DG, _NEST = Code.PICKLE_DANGEROUS_GLOBAL, Code.PICKLE_NESTED_DESERIALIZER

Rule = tuple[Severity, Code, str]

_EXEC = "runs commands or code"
_IMPORT = "imports arbitrary modules"
_NESTED = "deserializes another payload (which may run code)"
_FILES = "reads or writes files"
_NET = "opens network connections"
_GADGET = "builds a call or attribute access from data (gadget)"
_INTRO = "reaches interpreter internals (introspection gadget)"
_EVAL = "evaluates a string as Python code (eval)"
_FETCH = "fetches URLs or opens files named by data"
_MUTATE = "mutates another object in place (gadget: edits registries, plants callables)"


def _rules(severity: Severity, code: Code, reason: str, names: str) -> dict[str, Rule]:
    return {n: (severity, code, reason) for n in names.split()}


# Module prefixes: the module itself and everything below it.
DANGEROUS_MODULES: dict[str, Rule] = {
    **_rules(_C, _DG, _EXEC, """
        os posix nt _posixsubprocess subprocess pty commands popen2 runpy code codeop
        pdb bdb timeit trace profile cProfile doctest site sitecustomize usercustomize
        venv ensurepip distutils setuptools pip pkg_resources _winapi msvcrt winreg _winreg
        _xxsubinterpreters _interpreters _xxinterpchannels idlelib compileall py_compile
        pydoc multiprocessing concurrent _thread thread asyncio signal atexit
        numpy.f2py numpy.distutils numpy.testing torch.utils.cpp_extension torch.testing
        torch.hub torch._inductor torch.utils.bottleneck IPython tkinter _tkinter _sitebuiltins
        keras.layers.Lambda keras.src.layers.core.lambda_layer tensorflow.keras.layers.Lambda
        pandas.core.computation _bootsubprocess _testcapi _testinternalcapi _testlimitedcapi
        test.support sympy.utilities.lambdify sympy.utilities.autowrap sympy.printing.preview
        sympy.testing.runtests sympy.utilities.runtests sympy.interactive.session torch.compiler
        torch.utils.benchmark.utils.cpp_jit torch.utils.benchmark.utils.valgrind_wrapper
        _aix_support _osx_support _pyrepl pexpect pipes lib2to3 _signal __builtins__"""),
    # torch internals that compile, exec or eval strings (docs/threat-inventory.md §torch):
    # TorchScript (frontend, annotations eval, unsupported_tensor_ops.execWrapper), dynamo
    # (guards eval, convert_frame exec, repro), FX tooling (symbolic_shapes guard eval,
    # rewriter exec), aot_autograd codegen, the remote-module template instantiator (writes a
    # module and execs it), guard/traceback helpers and invoke_leaf_function's eval
    **_rules(_C, _DG, _EXEC, """
        torch.jit torch._dynamo torch._guards torch.fx.experimental torch._functorch
        torch.distributed.nn.jit torch._higher_order_ops.invoke_leaf_function
        torch._higher_order_ops.triton_kernel_wrap torch.utils._traceback torch.export._unlift
        torch.fx.operator_schemas torch._library.infer_schema"""),
    # ConfigModule.load_config and the datapipes decoder's basichandlers unpickle their input
    **_rules(_C, _NEST, _NESTED, """
        torch.utils._config_module torch.utils.data.datapipes.utils.decoder"""),
    **_rules(_C, _DG, "imports modules named by data (unittest.main / TestLoader / mock.patch)",
             "unittest"),
    # uuid's MAC-address probes spawn ifconfig/ip/arp/netstat (uuid.UUID stays benign: an exact
    # benign name wins over its module's rule)
    **_rules(_H, _DG, _EXEC + " (uuid's node probes spawn processes)", "uuid"),
    **_rules(_C, _DG, "registers or overrides torch operator kernels process-wide",
             "torch.library"),
    # sympy's string entry points (sympify, parse_expr, kernS, every parser) build code and eval it
    **_rules(_C, _DG, _EVAL, "sympy.core.sympify sympy.parsing"),
    **_rules(_C, _DG, "downloads a file and torch.loads it (weights_only=False)",
             "torch.utils.model_zoo"),
    **_rules(_C, _DG, _IMPORT, """
        importlib imp zipimport pkgutil _imp _frozen_importlib _frozen_importlib_external"""),
    **_rules(_C, _DG, "calls native code", "ctypes _ctypes cffi numpy.ctypeslib"),
    **_rules(_C, _DG, "interpreter state (torch blocks sys)", "sys"),
    **_rules(_C, _NEST, _NESTED, """
        pickle _pickle cPickle dill cloudpickle marshal shelve jsonpickle _compat_pickle
        pickletools torch.package"""),
    **_rules(_H, _DG, _FILES, """
        shutil tempfile fileinput filecmp zipfile tarfile dbm _dbm _gdbm anydbm sqlite3 _sqlite3 mmap
        fcntl termios tty pwd grp spwd resource logging.config logging.handlers glob linecache
        numpy.lib.npyio numpy.lib._npyio_impl pandas.io tensorflow.io
        tensorflow.python.ops.io_ops"""),
    **_rules(_H, _DG, _NET, """
        socket _socket ssl _ssl select selectors socketserver SocketServer http httplib
        urllib urllib2 urllib3 requests httpx aiohttp ftplib smtplib smtpd poplib imaplib
        nntplib telnetlib xmlrpc xmlrpclib SimpleXMLRPCServer BaseHTTPServer
        SimpleHTTPServer CGIHTTPServer webbrowser wsgiref torch.distributed.rpc"""),
    **_rules(_H, _DG, "creates or unlinks named shared memory and semaphores (/dev/shm)",
             "_posixshmem _multiprocessing"),
    **_rules(_H, _DG, _FETCH, "numpy.lib._datasource"),
    **_rules(_H, _DG, "importing it opens a web browser (spawns a process, fetches a URL)",
             "antigravity"),
    **_rules(_H, _DG, _EXEC + " (platform probes spawn processes)", "platform"),
    **_rules(_H, _DG, _INTRO, "gc inspect threading _weakref"),
    **_rules(_H, _DG, "probes or resolves file-system paths (os.path by another name)",
             "posixpath ntpath genericpath"),
    **_rules(_H, _DG, "writes to the system log", "syslog"),
    **_rules(_H, _DG, _FILES + " (torch.onnx.export writes models)", "torch.onnx"),
    # found by mining installed packages for arguments that reach exec/eval/processes/loaders
    # (docs/threat-inventory.md, "Gadget mining"): click's editor, pager and launcher run
    # commands; dotenv's CLI execs its argument; DCP's converters torch.load(weights_only=False);
    # PyYAML's constructors import the modules a document names
    **_rules(_C, _DG, _EXEC, """
        click._termui_impl dotenv.cli torch.distributed.elastic.rendezvous.etcd_server
        alembic.script.write_hooks"""),
    **_rules(_C, _NEST, _NESTED, "torch.distributed.checkpoint.format_utils"),
    **_rules(_C, _DG, _IMPORT, "yaml.constructor"),
}

# Exact `module.name` entries (and anything reached through them).
DANGEROUS_NAMES: dict[str, Rule] = {
    **_rules(_C, _DG, _EXEC, """
        builtins.eval builtins.exec builtins.execfile builtins.compile builtins.breakpoint
        builtins.input builtins.raw_input builtins.help builtins.license builtins.exit
        builtins.quit builtins.reload builtins.apply builtins.__build_class__
        uuid._get_command_stdout uuid._popen uuid._find_mac uuid._ifconfig_getnode
        uuid._ip_getnode uuid._arp_getnode uuid._lanscan_getnode uuid._netstat_getnode
        numpy.testing._private.utils.runstring
        torch.fx.graph_module.reduce_graph_module torch.fx.graph_module.reduce_package_graph_module
        torch.fx.graph_module.reduce_deploy_graph_module torch.fx.graph_module._forward_from_src
        torch.fx.graph_module._exec_with_source torch.fx.graph_module._method_from_src
        torch.ops.load_library torch.classes.load_library torch._ops.load_library
        torch.utils.collect_env.run torch.utils.collect_env.run_and_read_all
        torch.jit.CompilationUnit torch.jit._script.CompilationUnit
        logging.config.listen logging.config.fileConfig logging.config.dictConfig
        code.interact cgitb.handler _osx_support._read_output pydoc.pipepager pandas.eval
        torch.compile torch._dynamo.optimize torch._dynamo.eval_frame.optimize
        torch._dynamo.export torch._dynamo.eval_frame.export torch.utils.benchmark.Timer
        torch.utils.benchmark.utils.timer.Timer torch.utils.benchmark.utils.timer.CPPTimer
        sympy.lambdify sympy.init_session sympy.preview sympy.test sympy.doctest"""),
    **_rules(_C, _DG, _EVAL, """
        sympy.sympify sympy.parse_expr sympy.S sympy.core.S sympy.core.singleton.S
        typing._eval_type typing.get_type_hints typing.ForwardRef._evaluate
        typing.ForwardRef.evaluate typing.evaluate_forward_ref typing_extensions._eval_type
        typing_extensions.get_type_hints typing_extensions.evaluate_forward_ref
        typing_extensions.get_annotations typing_extensions._eval_with_owner
        annotationlib.get_annotations annotationlib.call_evaluate_function
        annotationlib.call_annotate_function annotationlib.ForwardRef.evaluate"""),
    **_rules(_C, _DG, _IMPORT, """
        builtins.__import__ builtins.__loader__ builtins.__spec__ builtins.__builtins__
        pydoc.locate pydoc.importfile pydoc.safeimport warnings._getcategory warnings._setoption
        warnings._processoptions _py_warnings._getcategory _py_warnings._setoption
        _py_warnings._processoptions xml.sax.make_parser xml.sax._create_parser
        sympy.external.importtools.import_module sympy.utilities.source.get_class"""),
    **_rules(_C, _DG, _INTRO, """
        builtins.getattr builtins.setattr builtins.delattr builtins.globals builtins.locals
        builtins.vars builtins.__dict__ builtins.dir"""),
    **_rules(_C, _NEST, _NESTED, """
        torch.load torch.serialization.load torch.serialization._load
        torch.serialization._legacy_load torch.jit.load torch.jit._serialization.load
        torch.jit._load_for_lite_interpreter torch.storage._load_from_bytes
        torch._C._load_for_lite_interpreter torch._C.import_ir_module
        torch._C.import_ir_module_from_buffer torch.export.load torch._export.load
        numpy.load numpy.loads numpy.core.multiarray.loads numpy._core.multiarray.loads
        numpy.core.numeric.loads numpy.ma.loads numpy.ma.core.loads numpy.lib.format.read_array
        numpy.lib.format.open_memmap numpy.fromfile numpy.memmap numpy.core.memmap.memmap
        numpy._core.memmap.memmap joblib.load joblib.numpy_pickle.load joblib.numpy_pickle.loads
        sklearn.externals.joblib.load pandas.read_pickle pandas.io.pickle.read_pickle
        yaml.load yaml.load_all yaml.unsafe_load yaml.unsafe_load_all yaml.full_load
        yaml.full_load_all keras.models.load_model keras.saving.load_model
        tensorflow.keras.models.load_model torch.compiler.load_cache_artifacts
        torch.compiler.load_compiled_function
        torch.distributed.elastic.rendezvous.api.basichandlers"""),
    **_rules(_H, _DG, _FILES, """
        builtins.open builtins.file io.open io.open_code io.FileIO _io.open _io.open_code
        _io.FileIO codecs.open gzip.open gzip.GzipFile bz2.open bz2.BZ2File lzma.open
        lzma.LZMAFile numpy.save numpy.savez numpy.savez_compressed numpy.savetxt
        numpy.genfromtxt numpy.loadtxt numpy.tofile logging.FileHandler logging.basicConfig
        pathlib.Path.write_text pathlib.Path.write_bytes pathlib.Path.unlink
        pathlib.Path.touch pathlib.Path.mkdir pathlib.Path.rmdir pathlib.Path.rename
        pathlib.Path.replace pathlib.Path.chmod pathlib.Path.symlink_to pathlib.Path.open
        pathlib.Path.read_text pathlib.Path.read_bytes torch.save numpy.lib.format.write_array
        _pyio.open _pyio.open_code _pyio.FileIO tokenize.open numpy.fromregex numpy.rec.fromfile
        numpy.core.records.fromfile numpy._core.records.fromfile xml.dom.minidom.parse
        xml.dom.pulldom.parse xml.dom.expatbuilder.parse xml.etree.ElementTree.parse
        xml.etree.ElementTree.iterparse xml.etree.ElementTree.ElementTree.parse
        xml.etree.cElementTree.parse xml.etree.cElementTree.iterparse
        xml.etree.ElementInclude.include xml.etree.ElementInclude.default_loader
        sympy.utilities.codegen.codegen"""),
    **_rules(_H, _DG, _FETCH, """
        xml.sax.parse xml.sax.saxutils.prepare_input_source xml.sax.expatreader.ExpatParser.parse
        xml.sax.xmlreader.IncrementalParser.parse xml.dom.xmlbuilder.DOMBuilder.parseURI
        xml.dom.xmlbuilder.DOMBuilder.parse xml.dom.xmlbuilder.DOMEntityResolver.resolveEntity
        numpy.DataSource numpy.lib.DataSource"""),
    **_rules(_H, _DG, _GADGET, """
        operator.attrgetter operator.methodcaller operator.itemgetter operator.call
        _operator.attrgetter _operator.methodcaller _operator.itemgetter _operator.call
        functools.partial functools.partialmethod functools.reduce functools.singledispatch
        _functools.partial _functools.reduce types.FunctionType types.LambdaType
        types.CodeType types.MethodType types.ModuleType types.new_class types.BuiltinMethodType
        types.coroutine builtins.type builtins.super builtins.classmethod builtins.staticmethod
        builtins.property weakref.finalize copyreg.add_extension
        copyreg.remove_extension copyreg.clear_extension_cache copyreg.pickle copyreg.constructor
        copyreg._extension_registry copyreg._inverted_registry copyreg.dispatch_table"""),
    # `operator` is `_operator` re-exported: both spellings of every entry
    **_rules(_H, _DG, _MUTATE, " ".join(f"{m}.{n}" for m in ("operator", "_operator") for n in """
        setitem delitem iadd iand iconcat ifloordiv ilshift imatmul imod imul ior ipow irshift
        isub itruediv ixor""".split())),
}

# Gadgets found by mining installed packages (docs/threat-inventory.md, "Gadget mining"): a
# parameter reaches exec/eval, an import, a process or another deserializer.
DANGEROUS_NAMES.update({
    **_rules(_C, _DG, _EXEC, """
        optparse.Values.read_file sympy.polys.monomials.MonomialOps._build
        jinja2.environment.Template.from_code jinja2.Template.from_code
        sqlalchemy.util.langhelpers.exec_code_in_env sqlalchemy.util.exec_code_in_env
        pygments.lexers.load_lexer_from_file pygments.formatters.load_formatter_from_file
        click.edit click.termui.edit dataclasses._create_fn dataclasses._init_fn
        dataclasses._repr_fn dataclasses._frozen_get_del_attr dataclasses._cmp_fn
        dataclasses._hash_fn attr._make._linecache_and_compile
        prometheus_client.decorator.FunctionMaker decorator.FunctionMaker"""),
    **_rules(_C, _DG, _EVAL, """
        sympy.utilities.matchpy_connector.Replacer._get_lambda sqlalchemy.util.typing.eval_expression
        sqlalchemy.util.typing.eval_name_only sqlalchemy.util.typing.de_stringify_annotation"""),
    **_rules(_C, _DG, _IMPORT, """
        optparse.Values.read_module numpy.core._ufunc_reconstruct
        numpy.lib._utils_impl._makenamedict numpy._core.function_base.add_newdoc
        numpy.core.function_base.add_newdoc numpy.lib.add_newdoc numpy.add_newdoc
        pygments.lexers._load_lexers pygments.formatters._load_formatters jinja2.utils.import_string
        torch.nn.attention._fa3._fa3_import_module torch.nn.attention._fa4._fa4_import_module
        torch._logging._internal._get_module_and_submodules numpy.info numpy.lib._utils_impl.info
        torch.nn.attention._fa3.register_flash_attention_fa3
        torch.nn.attention._fa4.register_flash_attention_fa4"""),
    **_rules(_C, _NEST, _NESTED, """
        numpy.lib._format_impl.read_array jinja2.bccache.Bucket.load_bytecode
        jinja2.bccache.Bucket.bytecode_from_string
        torch.distributed.checkpoint.default_planner.DefaultLoadPlanner.load_bytes"""),
    **_rules(_H, _DG, _FETCH, "click.launch click.termui.launch"),
    **_rules(_H, _DG, "sets process environment variables from a file or stream (os.environ)",
             "dotenv.load_dotenv dotenv.main.load_dotenv"),
})

# Dunder names that are dangerous even as the first (and only) name component.
DANGEROUS_DUNDERS = frozenset("""
    __import__ __builtins__ __globals__ __loader__ __spec__ __subclasses__ __code__
    __closure__ __func__ __self__ __class__ __base__ __bases__ __mro__ __dict__
    __getattribute__ __getattr__ __setattr__ __delattr__ __reduce__ __reduce_ex__
    __setstate__ __getstate__ __init_subclass__ __call__ __init__ __new__ __del__
    __build_class__ __wrapped__ __module__ __get__ __set__ __objclass__ __annotations__
    __annotate__""".split())

# Attribute names that are dangerous wherever a traversal (dotted name, getattr, attrgetter,
# methodcaller) reaches them: they run commands, load payloads or touch files.
DANGEROUS_ATTRS = frozenset("""
    system popen popen2 popen3 popen4 spawnl spawnle spawnlp spawnlpe spawnv spawnve spawnvp
    spawnvpe execl execle execlp execlpe execv execve execvp execvpe posix_spawn posix_spawnp
    fork forkpty startfile kill killpg getoutput getstatusoutput check_call check_output
    Popen run call eval exec compile load loads load_module exec_module import_module
    __import__ open write write_text write_bytes unlink remove rmtree rmdir removedirs rename
    renames replace mkdir makedirs touch chmod chown symlink symlink_to link hardlink_to
    truncate putenv unsetenv setattr getattr delattr globals locals vars runcode runsource
    runctx run_path run_module interact set_trace breakpoint urlopen urlretrieve connect
    create_connection send sendall register load_library execute executescript
    """.split())

BENIGN_NAMES: dict[str, str] = {
    **{n: "NumPy array or scalar reconstruction (data only)" for n in """
        numpy.core.multiarray._reconstruct numpy._core.multiarray._reconstruct
        numpy.core.multiarray.scalar numpy._core.multiarray.scalar numpy.ndarray numpy.dtype
        numpy.core.numeric._frombuffer numpy._core.numeric._frombuffer numpy.ma.core._mareconstruct
        numpy.ma.core.MaskedArray numpy.matrix numpy.bool_ numpy.bool numpy.int8 numpy.int16
        numpy.int32 numpy.int64 numpy.uint8 numpy.uint16 numpy.uint32 numpy.uint64 numpy.intc
        numpy.uintc numpy.int_ numpy.intp numpy.uintp numpy.longlong numpy.ulonglong
        numpy.float16 numpy.float32 numpy.float64 numpy.half numpy.single numpy.double
        numpy.longdouble numpy.float_ numpy.complex64 numpy.complex128 numpy.clongdouble
        numpy.str_ numpy.bytes_ numpy.void numpy.datetime64 numpy.timedelta64
        joblib.numpy_pickle.NumpyArrayWrapper""".split()},
    **{n: "plain Python data type (no side effects)" for n in """
        builtins.slice builtins.range builtins.frozenset builtins.bytes builtins.int
        builtins.float builtins.str builtins.bool builtins.tuple builtins.list builtins.dict
        uuid.SafeUUID
        builtins.Ellipsis builtins.NotImplemented argparse.Namespace types.SimpleNamespace
        collections.defaultdict collections.deque collections.ChainMap collections.UserDict
        collections.UserList collections.UserString datetime.datetime datetime.date
        datetime.time datetime.timedelta datetime.timezone decimal.Decimal fractions.Fraction
        uuid.UUID pathlib.Path pathlib.PosixPath pathlib.WindowsPath pathlib.PurePath
        pathlib.PurePosixPath pathlib.PureWindowsPath typing.Any""".split()},
    **{n: "torch dtype/layout alias or rebuild helper outside the allowlist (data only)" for n in """
        torch.float torch.half torch.double torch.long torch.int torch.short torch.cfloat
        torch.cdouble torch.chalf torch.strided torch.sparse_coo torch.sparse_csr
        torch.sparse_csc torch.sparse_bsr torch.sparse_bsc torch._mkldnn torch.jagged
        torch.contiguous_format torch.channels_last torch.channels_last_3d
        torch.preserve_format torch.UntypedStorage torch.TypedStorage
        torch._utils._rebuild_xla_tensor torch._utils._rebuild_mps_tensor
        torch._utils._rebuild_sparse_csr_tensor torch._utils._rebuild_tensor_from_type
        torch._tensor._rebuild_from_type torch.torch_version.TorchVersion
        torch.nn.parameter.Buffer torch.nn.parameter.UninitializedParameter
        torch.nn.parameter.UninitializedBuffer torch._dynamo.decorators._DimRange""".split()},
    **{n: "configuration container (omegaconf/Lightning/transformers/accelerate)" for n in """
        omegaconf.dictconfig.DictConfig omegaconf.listconfig.ListConfig
        omegaconf.base.ContainerMetadata omegaconf.base.Metadata omegaconf.nodes.AnyNode
        omegaconf.nodes.StringNode omegaconf.nodes.IntegerNode omegaconf.nodes.FloatNode
        omegaconf.nodes.BooleanNode omegaconf.nodes.EnumNode omegaconf.nodes.BytesNode
        omegaconf.nodes.PathNode omegaconf.nodes.ValueNode
        pytorch_lightning.utilities.parsing.AttributeDict
        lightning.pytorch.utilities.parsing.AttributeDict
        lightning_fabric.utilities.data.AttributeDict lightning.fabric.utilities.data.AttributeDict
        transformers.training_args.TrainingArguments transformers.training_args.OptimizerNames
        transformers.training_args_seq2seq.Seq2SeqTrainingArguments
        transformers.trainer_utils.IntervalStrategy transformers.trainer_utils.SchedulerType
        transformers.trainer_utils.HubStrategy transformers.trainer_utils.SaveStrategy
        transformers.trainer_utils.EvaluationStrategy transformers.debug_utils.DebugOption
        transformers.trainer_pt_utils.AcceleratorConfig
        accelerate.utils.dataclasses.DistributedType""".split()},
}

# Modules whose plain (undotted, non-dunder) names are all inert data classes.
BENIGN_MODULES: dict[str, str] = {
    "numpy.dtypes": "NumPy dtype class (data only)",
    "torch.nn.modules": "torch module class of a whole-model pickle (no side effects on load)",
}

# Lookalike letters (Cyrillic/Greek) an attacker may use so that a name reads as `os.system`
# to a human or a lenient scanner; NFKC handles full-width and other compatibility forms.
CONFUSABLES = str.maketrans({
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "ѕ": "s", "і": "i",
    "ј": "j", "ԁ": "d", "ɡ": "g", "һ": "h", "ӏ": "l", "ո": "n", "ս": "u", "ν": "v", "ο": "o",
    "α": "a", "ε": "e", "ι": "i", "κ": "k", "τ": "t", "υ": "u", "ı": "i", "ℓ": "l",
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C",
    "Т": "T", "Х": "X", "Ѕ": "S", "І": "I", "Ј": "J",
    "\u200b": None, "\u200c": None, "\u200d": None, "\u2060": None, "\ufeff": None,
})
