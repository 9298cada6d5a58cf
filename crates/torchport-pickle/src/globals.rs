//! Owns the classification of globals: which `module.name` references could only mean code
//! execution or system access, and so make a pickle refused.

/// Modules whose every global is refused (the module itself and its submodules). Dotted
/// entries (`torch.hub`) cover that submodule only. Each entry is a family of gadgets:
/// process and system access, code loading, threads, profilers and documentation helpers
/// that run or import code by name, networking, package installers, and nested loaders.
const DANGEROUS_MODULES: &[&str] = &[
    // process, system and interpreter access
    "os",
    "posix",
    "nt",
    "subprocess",
    "_posixsubprocess",
    "sys",
    "signal",
    "pty",
    "commands",
    "popen2",
    "shutil",
    "ctypes",
    "_ctypes",
    "site",
    // code loading and evaluation
    "runpy",
    "importlib",
    "imp",
    "zipimport",
    "pickle",
    "_pickle",
    "cPickle",
    "marshal",
    "shelve",
    "dill",
    "cloudpickle",
    "joblib",
    "code",
    "codeop",
    "pdb",
    "bdb",
    "timeit",
    "trace",
    "idlelib",
    "logging.config",
    // profilers and documentation tools that run or import code by name
    "cProfile",
    "profile",
    "_lsprof",
    "pydoc",
    // threads and processes
    "_thread",
    "thread",
    "threading",
    "asyncio",
    "multiprocessing",
    "concurrent",
    // network
    "socket",
    "_socket",
    "webbrowser",
    "urllib",
    "urllib2",
    "urllib3",
    "http",
    "httplib",
    "requests",
    "ftplib",
    "smtplib",
    "telnetlib",
    // package installers
    "pip",
    "ensurepip",
    "setuptools",
    "distutils",
    "venv",
    // loaders nested in torch and numpy: each loads or runs another untrusted file or source
    "torch.hub",
    "torch.package",
    "torch.jit.unsupported_tensor_ops",
    "torch.utils.cpp_extension",
    "numpy.lib.npyio",
    "numpy.lib._npyio_impl",
    "numpy.lib.format",
    "numpy.f2py",
    "numpy.distutils",
];

/// Names in `builtins` (Python 3) / `__builtin__` (Python 2) that run code, reach into
/// objects or do I/O. Inert constructors such as `set`, `slice`, `complex` are not here.
const DANGEROUS_BUILTINS: &[&str] = &[
    "eval",
    "exec",
    "execfile",
    "compile",
    "getattr",
    "setattr",
    "delattr",
    "__import__",
    "__build_class__",
    "__loader__",
    "open",
    "file",
    "input",
    "raw_input",
    "globals",
    "locals",
    "vars",
    "breakpoint",
    "apply",
    "reload",
    "reduce",
    "exit",
    "quit",
    "help",
    "print",
];

/// Single globals outside the modules above, as `(module, name)`.
const DANGEROUS_NAMES: &[(&str, &str)] = &[
    ("functools", "partial"),
    ("functools", "reduce"),
    ("_functools", "partial"),
    ("_functools", "reduce"),
    ("operator", "attrgetter"),
    ("operator", "methodcaller"),
    ("operator", "itemgetter"),
    ("operator", "call"),
    ("_operator", "attrgetter"),
    ("_operator", "methodcaller"),
    ("_operator", "itemgetter"),
    ("_operator", "call"),
    ("types", "FunctionType"),
    ("types", "CodeType"),
    ("types", "MethodType"),
    ("types", "LambdaType"),
    ("platform", "popen"),
    ("codecs", "open"),
    ("io", "open"),
    ("io", "open_code"),
    ("io", "FileIO"),
    ("_io", "open"),
    ("_io", "open_code"),
    ("_io", "FileIO"),
    ("numpy.testing._private.utils", "runstring"),
    // Nested loads: `torch.load` of attacker-chosen bytes or paths, with pickle allowed.
    ("torch", "load"),
    ("torch.serialization", "load"),
    ("torch.serialization", "_load"),
    ("torch.serialization", "_legacy_load"),
    ("torch.jit", "load"),
    ("torch.jit._serialization", "load"),
    ("numpy", "load"),
    // Pickled fx GraphModules: their reduce functions compile and run Python source.
    ("torch.fx.graph_module", "reduce_graph_module"),
    ("torch.fx.graph_module", "reduce_package_graph_module"),
    ("torch.fx.graph_module", "reduce_deploy_graph_module"),
    ("torch.fx.graph_module", "_forward_from_src"),
    ("torch.fx.graph_module", "_exec_with_source"),
];

/// Attribute names that reach interpreter internals; a dotted name using one is refused
/// whatever its module.
const DANGEROUS_ATTRIBUTES: &[&str] = &[
    "__globals__",
    "__builtins__",
    "__subclasses__",
    "__import__",
    "__code__",
    "__getattribute__",
    "__reduce__",
    "__reduce_ex__",
];

/// Python 2 module names that unpicklers (Python's and torch's) read as their Python 3
/// names; every check here is made on the Python 3 name.
pub(crate) fn python3_module(module: &str) -> &str {
    match module {
        "__builtin__" => "builtins",
        "copy_reg" => "copyreg",
        other => other,
    }
}

/// True when `module.name` could only mean code execution, system access or a nested load
/// of another untrusted file: `os.*`, `subprocess.*`, `builtins.eval`, `builtins.getattr`,
/// `functools.partial`, `pydoc.locate`, `cProfile.run`, `torch.load`, `torch.hub.*`,
/// `numpy.load`, `threading.Thread`, `urllib.request.urlopen`, … . Data constructors
/// (`builtins.set`, `collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`, …) are not
/// dangerous. `name` may be dotted (protocol 4 qualified names, so `torch` + `hub.load` is
/// `torch.hub.load`): every dotted prefix of `module.name` is checked, and any part naming
/// interpreter internals (`__globals__`, `__subclasses__`, …) is refused.
pub fn is_dangerous_global(module: &str, name: &str) -> bool {
    let module = python3_module(module);
    if name
        .split('.')
        .chain(module.split('.'))
        .any(|part| DANGEROUS_ATTRIBUTES.contains(&part))
    {
        return true;
    }
    let full = format!("{module}.{name}");
    // Each prefix ending at a dot, then the whole path: `torch`, `torch.hub`, `torch.hub.load`.
    let ends = full
        .match_indices('.')
        .map(|(i, _)| i)
        .chain(std::iter::once(full.len()));
    for end in ends {
        let prefix = &full[..end];
        if DANGEROUS_MODULES.contains(&prefix) {
            return true;
        }
        if let Some((m, last)) = prefix.rsplit_once('.') {
            if DANGEROUS_NAMES.contains(&(m, last))
                || (m == "builtins" && DANGEROUS_BUILTINS.contains(&last))
            {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::is_dangerous_global;

    #[test]
    fn classifies() {
        for (m, n) in [
            ("os", "system"),
            ("posix", "system"),
            ("nt", "system"),
            ("os.path", "join"),
            ("subprocess", "Popen"),
            ("builtins", "eval"),
            ("__builtin__", "eval"),
            ("builtins", "getattr"),
            ("functools", "partial"),
            ("operator", "attrgetter"),
            ("builtins", "eval.__call__"),
            ("collections", "OrderedDict.__init__.__globals__"),
            ("torch.storage", "_load_from_bytes.__globals__"),
            ("torch", "load"),
            ("torch", "hub.load"),
            ("torch.hub", "load"),
            ("torch.serialization", "load"),
            ("torch", "serialization.load"),
            ("numpy", "load"),
            ("cProfile", "run"),
            ("profile", "run"),
            ("pydoc", "locate"),
            ("torch.jit.unsupported_tensor_ops", "execWrapper"),
            ("_thread", "start_new_thread"),
            ("threading", "Thread"),
            ("urllib.request", "urlopen"),
            ("pip._internal", "main"),
            ("__builtin__", "reduce"),
            ("torch.fx.graph_module", "reduce_graph_module"),
        ] {
            assert!(is_dangerous_global(m, n), "{m}.{n}");
        }
        for (m, n) in [
            ("builtins", "set"),
            ("builtins", "frozenset"),
            ("builtins", "bytearray"),
            ("__builtin__", "set"),
            ("collections", "OrderedDict"),
            ("torch._utils", "_rebuild_tensor_v2"),
            ("torch", "FloatStorage"),
            ("torch._C", "_nn"),
            ("codecs", "encode"),
            ("copyreg", "_reconstructor"),
            ("osmosis", "thing"),
            ("torch.storage", "_load_from_bytes"),
            ("torch", "loader"),
            ("torch.hubris", "x"),
            ("numpy", "loadtxt"),
            ("profiles", "run"),
            ("numpy.core.multiarray", "_reconstruct"),
            ("torch.serialization", "_get_layout"),
        ] {
            assert!(!is_dangerous_global(m, n), "{m}.{n}");
        }
    }
}
