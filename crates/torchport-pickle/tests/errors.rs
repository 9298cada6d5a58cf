//! One failing input per [`ErrorKind`] variant, each checking the offset and opcode name the
//! error carries, plus the limit and safety cases (memo bombs, nesting bombs, huge declared
//! lengths, dangerous globals).

use std::fs;
use std::path::PathBuf;

use torchport_pickle::{parse, parse_prefix, Error, ErrorKind, Limits};

fn err(bytes: &[u8]) -> Error {
    err_with(bytes, &Limits::default())
}

fn err_with(bytes: &[u8], limits: &Limits) -> Error {
    match parse(bytes, limits) {
        Ok(_) => panic!("{bytes:?} parsed, expected an error"),
        Err(e) => e,
    }
}

/// Asserts where the error points: its offset and opcode name.
fn at(e: &Error, offset: u64, opcode: Option<&str>) {
    assert_eq!((e.offset, e.opcode), (offset, opcode), "{e}");
}

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("corpus")
}

#[test]
fn unexpected_eof_at_every_truncation() {
    let mut files = 0;
    let mut prefixes = 0;
    for entry in fs::read_dir(corpus_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|x| x != "pkl") {
            continue;
        }
        let bytes = fs::read(&path).unwrap();
        if bytes.len() > 700 {
            continue;
        }
        files += 1;
        for cut in 0..bytes.len() {
            let e = match parse(
                &bytes[..cut],
                &Limits {
                    refuse_dangerous: false,
                    ..Limits::default()
                },
            ) {
                Ok(_) => panic!("{}: prefix of {cut} bytes parsed", path.display()),
                Err(e) => e,
            };
            assert!(
                matches!(e.kind, ErrorKind::UnexpectedEof | ErrorKind::NoStop),
                "{} cut at {cut}: {e}",
                path.display()
            );
            assert!(e.offset <= cut as u64);
            prefixes += 1;
        }
    }
    assert!(files >= 150, "only {files} corpus files were truncated");
    println!("{prefixes} truncated prefixes of {files} files all failed cleanly");

    let e = err(b"\x80\x02J\x01\x02");
    at(&e, 2, Some("BININT"));
    assert!(matches!(e.kind, ErrorKind::UnexpectedEof));
    let e = err(b"I12");
    at(&e, 0, Some("INT"));
    assert!(matches!(e.kind, ErrorKind::UnexpectedEof));
}

#[test]
fn huge_declared_lengths_fail_before_allocating() {
    let cases: [(&[u8], &str); 7] = [
        (b"\x80\x04X\xff\xff\xff\xffabc", "BINUNICODE"),
        (
            b"\x80\x04\x8d\xff\xff\xff\xff\xff\xff\xff\xffabc",
            "BINUNICODE8",
        ),
        (
            b"\x80\x04\x8e\x00\x00\x00\x00\x00\x00\x00\x80abc",
            "BINBYTES8",
        ),
        (
            b"\x80\x05\x96\xff\xff\xff\xff\x0f\x00\x00\x00abc",
            "BYTEARRAY8",
        ),
        (b"\x80\x04B\x00\x00\x00\x40abc", "BINBYTES"),
        (b"\x80\x02\x8b\xff\xff\xff\x7fabc", "LONG4"),
        (b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff.", "FRAME"),
    ];
    // The declared length is compared with the bytes that remain before anything is
    // allocated, so none of these reserves gigabytes.
    for (bytes, opcode) in cases {
        let e = err(bytes);
        assert!(matches!(e.kind, ErrorKind::UnexpectedEof), "{e}");
        at(&e, 2, Some(opcode));
    }
    let e = err(b"\x80\x04X\xff\xff\xff\xffabc");
    assert_eq!(
        e.to_string(),
        "pickle byte 2 (BINUNICODE): the input ends inside this opcode's argument, so the file is truncated or corrupt"
    );
}

#[test]
fn unknown_opcode() {
    let e = err(b"\xff");
    at(&e, 0, None);
    assert!(matches!(e.kind, ErrorKind::UnknownOpcode(0xff)));
    let e = err(b"\x80\x02K\x01\x00.");
    at(&e, 4, None);
    assert!(matches!(e.kind, ErrorKind::UnknownOpcode(0)));
    assert_eq!(
        e.to_string(),
        "pickle byte 4: byte 0x00 is not a pickle opcode, so this is not a pickle or it is corrupt"
    );
}

#[test]
fn stack_underflow() {
    for (bytes, offset, op) in [
        (&b"."[..], 0, "STOP"),
        (b"K\x01a.", 2, "APPEND"),
        (b"](K\x01a.", 4, "APPEND"), // the list is below the mark, out of reach
        (b"K\x01\x86.", 2, "TUPLE2"),
        (b"0", 0, "POP"),
        (b"2", 0, "DUP"),
        (b"(o.", 1, "OBJ"),
        (b"NR.", 1, "REDUCE"),
    ] {
        let e = err(bytes);
        assert!(
            matches!(e.kind, ErrorKind::StackUnderflow),
            "{bytes:?}: {e}"
        );
        at(&e, offset, Some(op));
    }
}

#[test]
fn no_mark() {
    for (bytes, offset, op) in [
        (&b"l."[..], 0, "LIST"),
        (b"]e.", 1, "APPENDS"),
        (b"1", 0, "POP_MARK"),
        (b"t", 0, "TUPLE"),
    ] {
        let e = err(bytes);
        assert!(matches!(e.kind, ErrorKind::NoMark), "{bytes:?}: {e}");
        at(&e, offset, Some(op));
    }
}

#[test]
fn bad_memo_key() {
    let e = err(b"Nq\x01h\x05.");
    assert!(matches!(e.kind, ErrorKind::BadMemoKey(5)));
    at(&e, 3, Some("BINGET"));
    let e = err(b"g7\n.");
    assert!(matches!(e.kind, ErrorKind::BadMemoKey(7)));
    at(&e, 0, Some("GET"));
    let e = err(b"j\x00\x00\x00\x01.");
    assert!(matches!(e.kind, ErrorKind::BadMemoKey(0x0100_0000)));
}

#[test]
fn invalid_utf8() {
    let e = err(b"\x80\x03X\x02\x00\x00\x00\xff\xfe.");
    assert!(matches!(e.kind, ErrorKind::InvalidUtf8));
    at(&e, 2, Some("BINUNICODE"));
    let e = err(b"c\xffos\nsystem\n.");
    assert!(matches!(e.kind, ErrorKind::InvalidUtf8));
    at(&e, 0, Some("GLOBAL"));
    // Python 2 str is not required to be UTF-8: it becomes bytes.
    let p = parse(b"U\x02\xff\xfe.", &Limits::default()).unwrap();
    assert_eq!(p.as_bytes(p.root()), Some(&b"\xff\xfe"[..]));
}

#[test]
fn bad_text() {
    for (bytes, op) in [
        (&b"Iabc\n."[..], "INT"),
        (b"L12x\n.", "LONG"),
        (b"F1.2.3\n.", "FLOAT"),
        (b"S'abc\n.", "STRING"),
        (b"S'\\x4'\n.", "STRING"),
        (b"V\\u12\n.", "UNICODE"),
        (b"V\\ud800\n.", "UNICODE"),
        (b"Np-1\n.", "PUT"),
        (b"g99999999999999999999999\n.", "GET"),
        (&[b"I", "9".repeat(5000).as_bytes(), b"\n."].concat(), "INT"),
    ] {
        let e = err(bytes);
        assert!(matches!(e.kind, ErrorKind::BadText(_)), "{e}");
        assert_eq!(e.opcode, Some(op), "{e}");
    }
    let e = err(b"Iabc\n.");
    assert_eq!(
        e.to_string(),
        "pickle byte 0 (INT): integer text \"abc\" is not a Python integer literal"
    );
}

#[test]
fn wrong_type() {
    for (bytes, offset, op, expected, found) in [
        (&b"K\x01K\x02a."[..], 4, "APPEND", "list", "int"),
        (b"\x80\x04K\x01K\x02\x93.", 6, "STACK_GLOBAL", "str", "int"),
        (b"\x80\x04\x8c\x01a]\x93.", 6, "STACK_GLOBAL", "str", "list"),
        (b"cmod\nf\nNR.", 8, "REDUCE", "tuple", "None"),
        (b"]}b.", 2, "BUILD", "object", "list"),
        (b"]K\x01K\x02s.", 5, "SETITEM", "dict", "list"),
        (b"\x80\x04\x8f(K\x01e.", 6, "APPENDS", "list", "set"),
        (b"cmod\nC\n)]\x92.", 9, "NEWOBJ_EX", "dict", "list"),
    ] {
        let e = err(bytes);
        match e.kind {
            ErrorKind::WrongType {
                expected: x,
                found: f,
            } => assert_eq!((x, f), (expected, found), "{bytes:?}"),
            _ => panic!("{bytes:?}: {e}"),
        }
        at(&e, offset, Some(op));
    }
}

fn limit_of(e: &Error) -> &'static str {
    match e.kind {
        ErrorKind::Limit { what, .. } => what,
        _ => panic!("expected a limit error, got {e}"),
    }
}

#[test]
fn limits() {
    // Nesting bomb: 100k x (EMPTY_LIST, MARK).
    let bomb = b"](".repeat(100_000);
    let e = err(&bomb);
    assert_eq!(limit_of(&e), "max_nesting");
    at(&e, 2 * 1000 + 1, Some("MARK"));

    // Stack bomb: 100k NONE with no marks.
    let e = err(&b"N".repeat(100_001));
    assert_eq!(limit_of(&e), "max_stack_depth");

    let small = |f: fn(&mut Limits)| {
        let mut l = Limits::default();
        f(&mut l);
        l
    };
    let e = err_with(b"(NNNNNNNNNNl.", &small(|l| l.max_nodes = 5));
    assert_eq!(limit_of(&e), "max_nodes");
    at(&e, 6, Some("NONE"));

    let e = err_with(b"Nq\x00q\x01q\x02q\x03.", &small(|l| l.max_memo = 3));
    assert_eq!(limit_of(&e), "max_memo");
    at(&e, 7, Some("BINPUT"));

    let e = err_with(
        b"\x80\x03X\x05\x00\x00\x00hello.",
        &small(|l| l.max_string_len = 4),
    );
    assert_eq!(limit_of(&e), "max_string_len");
    assert_eq!(
        e.to_string(),
        "pickle byte 2 (BINUNICODE): the pickle exceeds the limit of 4 (max_string_len); \
         raise Limits::max_string_len if the file is trusted"
    );

    let e = err_with(
        b"(C\x03abcC\x03defC\x03ghil.",
        &small(|l| l.max_total_bytes = 8),
    );
    assert_eq!(limit_of(&e), "max_total_bytes");
    at(&e, 11, Some("SHORT_BINBYTES"));
}

#[test]
fn memo_bombs_stay_linear() {
    // A list of 10k items, then 40 x (MARK, GET it 5000 times, APPENDS) and 100k x (GET it,
    // APPEND) into an outer list: the arena holds references, never copies, so it stays as
    // small as the input.
    let mut p = b"\x80\x02]q\x00(".to_vec();
    p.extend(b"K\x01".repeat(10_000));
    p.extend(b"e]q\x01");
    for _ in 0..40 {
        p.push(b'(');
        p.extend(b"h\x00".repeat(5_000));
        p.push(b'e');
    }
    p.extend(b"h\x00a".repeat(100_000));
    p.push(b'.');
    let pickle = parse(&p, &Limits::default()).unwrap();
    assert_eq!(pickle.len(), 10_002);
    let outer = pickle.as_tuple_or_list(pickle.root()).unwrap();
    assert_eq!(outer.len(), 300_000);
    assert_eq!(
        pickle.as_tuple_or_list(outer[299_999]).map(<[_]>::len),
        Some(10_000)
    );

    // A tuple of 10k items used as the argument of 200k calls: copying its items into every
    // recorded call is charged to max_nodes, so this stops at the limit instead of allocating
    // billions of ids.
    let mut p = b"\x80\x02cmod\nf\nq\x00(".to_vec();
    p.extend(b"K\x01".repeat(10_000));
    p.extend(b"tq\x01]q\x02");
    p.extend(b"h\x00h\x01Ra".repeat(200_000));
    p.push(b'.');
    let e = err(&p);
    assert_eq!(limit_of(&e), "max_nodes");
    assert_eq!(e.opcode, Some("REDUCE"));

    // A 64 KiB str used as a STACK_GLOBAL name 5000 times: each global copies the name, so
    // the copies are charged to max_total_bytes and the 127th global hits an 8 MiB limit.
    let mut p = b"\x80\x04\x8c\x01m\x94\x8d\x00\x00\x01\x00\x00\x00\x00\x00".to_vec();
    p.extend(vec![b'n'; 1 << 16]);
    p.extend(b"\x94]\x94");
    p.extend(b"h\x00h\x01\x93a".repeat(5_000));
    p.push(b'.');
    let limits = Limits {
        max_total_bytes: 8 << 20,
        ..Limits::default()
    };
    let e = err_with(&p, &limits);
    assert_eq!(limit_of(&e), "max_total_bytes");
    assert_eq!(e.opcode, Some("STACK_GLOBAL"));
    assert_eq!(e.offset, 15 + (1 << 16) + 3 + 126 * 6 + 4);
}

#[test]
fn dangerous_globals() {
    let refused = |bytes: &[u8], module: &str, name: &str, offset: u64, op: &str| {
        let e = err(bytes);
        match &e.kind {
            ErrorKind::DangerousGlobal { module: m, name: n } => {
                assert_eq!((m.as_str(), n.as_str()), (module, name))
            }
            _ => panic!("{bytes:?}: {e}"),
        }
        at(&e, offset, Some(op));
        e
    };
    let e = refused(
        b"cos\nsystem\n(S'echo hi'\ntR.",
        "os",
        "system",
        0,
        "GLOBAL",
    );
    assert_eq!(
        e.to_string(),
        "pickle byte 0 (GLOBAL): refusing global os.system because loading it could run code or touch the system"
    );
    refused(b"cbuiltins\neval\n.", "builtins", "eval", 0, "GLOBAL");
    refused(b"c__builtin__\neval\n.", "__builtin__", "eval", 0, "GLOBAL");
    refused(b"cposix\nsystem\n.", "posix", "system", 0, "GLOBAL");
    refused(
        b"\x80\x04\x8c\x02os\x8c\x06system\x93.",
        "os",
        "system",
        14,
        "STACK_GLOBAL",
    );
    refused(
        b"\x80\x04\x8c\x08builtins\x8c\x04eval\x93.",
        "builtins",
        "eval",
        18,
        "STACK_GLOBAL",
    );
    refused(
        b"\x80\x04\x8c\x05posix\x8c\x06system\x93.",
        "posix",
        "system",
        17,
        "STACK_GLOBAL",
    );
    refused(b"(S'ls'\nios\nsystem\n.", "os", "system", 7, "INST");

    // With refuse_dangerous off the call is recorded (never made) and listed.
    let permissive = Limits {
        refuse_dangerous: false,
        ..Limits::default()
    };
    let p = parse(b"cos\nsystem\n(S'echo hi'\ntR.", &permissive).unwrap();
    assert_eq!(p.globals(), [("os".to_string(), "system".to_string())]);
    let call = p.as_object(p.root()).unwrap();
    assert_eq!(p.as_global(call.callable), Some(("os", "system")));
    assert_eq!(p.as_str(call.args[0]), Some("echo hi"));
}

#[test]
fn trailing_bytes() {
    let e = err(b"N.N");
    assert!(matches!(e.kind, ErrorKind::TrailingBytes(1)));
    at(&e, 2, None);
    let (p, used) = parse_prefix(b"N.N", &Limits::default()).unwrap();
    assert_eq!((used, p.len()), (2, 1));
}

#[test]
fn no_stop() {
    let e = err(b"");
    assert!(matches!(e.kind, ErrorKind::NoStop));
    at(&e, 0, None);
    let e = err(b"\x80\x02N");
    assert!(matches!(e.kind, ErrorKind::NoStop));
    at(&e, 3, None);
}

#[test]
fn unsupported_protocol() {
    let e = err(b"\x80\x06N.");
    assert!(matches!(e.kind, ErrorKind::UnsupportedProtocol(6)));
    at(&e, 0, Some("PROTO"));
}

/// The extension registry is empty (as in a Python that never called
/// `copyreg.add_extension`, where `pickle.loads` fails with "unregistered extension code"):
/// each EXT opcode fails naming its code, read at its width.
#[test]
fn extension_codes_are_unregistered() {
    for (bytes, op, code) in [
        (&b"\x80\x02\x82\x07."[..], "EXT1", 7),
        (b"\x80\x02\x83\x01\x02.", "EXT2", 0x0201),
        (b"\x80\x02\x84\x01\x00\x00\x01.", "EXT4", 0x0100_0001),
    ] {
        let e = err(bytes);
        assert!(
            matches!(e.kind, ErrorKind::UnregisteredExtension(c) if c == code),
            "{e}"
        );
        assert_eq!(e.opcode, Some(op));
        assert!(e
            .to_string()
            .contains(&format!("extension code {code} is not registered")));
    }
    // A code cut off by the end of the input is a truncation, not a lookup.
    assert!(!matches!(
        err(b"\x80\x02\x84\x01\x00").kind,
        ErrorKind::UnregisteredExtension(_)
    ));
}

#[test]
fn unsupported_features() {
    for (bytes, op) in [
        (&b"\x80\x05\x97."[..], "NEXT_BUFFER"),
        (b"\x80\x05C\x01a\x98.", "READONLY_BUFFER"),
    ] {
        let e = err(bytes);
        assert!(matches!(e.kind, ErrorKind::Unsupported(_)), "{e}");
        assert_eq!(e.opcode, Some(op));
    }
    assert_eq!(
        err(b"\x80\x05\x97.").to_string(),
        "pickle byte 2 (NEXT_BUFFER): out-of-band buffers (protocol 5 NEXT_BUFFER / READONLY_BUFFER) are not supported"
    );
}

#[test]
fn malformed() {
    let e = err(b"(K\x01d.");
    assert!(matches!(e.kind, ErrorKind::Malformed(_)), "{e}");
    at(&e, 3, Some("DICT"));
    let e = err(b"}(K\x01u.");
    assert!(matches!(e.kind, ErrorKind::Malformed(_)), "{e}");
    let e = err(b"T\xff\xff\xff\xffabc.");
    assert!(matches!(e.kind, ErrorKind::Malformed(_)), "{e}");
    at(&e, 0, Some("BINSTRING"));
    let e = err(b"\x80\x02\x8b\xfe\xff\xff\xff.");
    assert!(matches!(e.kind, ErrorKind::Malformed(_)), "{e}");
}

/// TorchScript's pickler writes an enum member as `GLOBAL __torch__.…Enum`, its value,
/// REDUCE (no argument tuple): recorded as a call with that one argument. Any other callable
/// still needs a tuple.
#[test]
fn torchscript_enum_member_reduce() {
    let enum_member = b"\x80\x02c__torch__.timm.layers.format\nFormat\nX\x04\x00\x00\x00NCHWR.";
    let p = parse(enum_member, &Limits::default()).unwrap();
    let o = p.as_object(p.root()).unwrap();
    assert_eq!(
        p.as_global(o.callable),
        Some(("__torch__.timm.layers.format", "Format"))
    );
    assert_eq!(o.args.len(), 1);
    assert_eq!(p.as_str(o.args[0]), Some("NCHW"));
    let other = b"\x80\x02ccollections\nOrderedDict\nX\x04\x00\x00\x00NCHWR.";
    let e = parse(other, &Limits::default()).unwrap_err();
    assert!(e.to_string().contains("expects a tuple"), "{e}");
}
