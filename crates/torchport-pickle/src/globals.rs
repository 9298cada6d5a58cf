//! Owns the classification of globals: which `module.name` references could only mean code
//! execution or system access, and so make a pickle refused.

/// Modules whose every global is refused (the module itself and its submodules).
const DANGEROUS_MODULES: &[&str] = &[
    "os",
    "posix",
    "nt",
    "subprocess",
    "sys",
    "runpy",
    "importlib",
    "imp",
    "zipimport",
    "pickle",
    "_pickle",
    "shutil",
    "socket",
    "_socket",
    "ctypes",
    "_ctypes",
    "marshal",
    "code",
    "codeop",
    "pty",
    "webbrowser",
    "timeit",
    "asyncio",
    "multiprocessing",
    "pdb",
    "bdb",
    "commands",
    "popen2",
    "_posixsubprocess",
    "signal",
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
    "exit",
    "quit",
    "help",
    "print",
];

/// Single globals outside the modules above.
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

/// True when `module.name` could only mean code execution or system access when loaded:
/// `os.*`, `posix.*`, `subprocess.*`, `sys.*`, `builtins.eval`, `builtins.getattr`,
/// `functools.partial`, `operator.attrgetter`, … . Inert constructors (`builtins.set`,
/// `collections.OrderedDict`, `torch._utils._rebuild_tensor_v2`, …) are not dangerous.
/// `name` may be dotted (protocol 4 qualified names); its first part is what is checked,
/// and any part naming interpreter internals (`__globals__`, `__subclasses__`, …) is refused.
pub fn is_dangerous_global(module: &str, name: &str) -> bool {
    let top_module = module.split('.').next().unwrap_or(module);
    if DANGEROUS_MODULES.contains(&top_module) {
        return true;
    }
    let first = name.split('.').next().unwrap_or(name);
    if (module == "builtins" || module == "__builtin__") && DANGEROUS_BUILTINS.contains(&first) {
        return true;
    }
    if DANGEROUS_NAMES.contains(&(module, first)) {
        return true;
    }
    name.split('.')
        .any(|part| DANGEROUS_ATTRIBUTES.contains(&part))
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
        ] {
            assert!(!is_dangerous_global(m, n), "{m}.{n}");
        }
    }
}
