//! Differential test against CPython: every file in tests/corpus was written by CPython 3.11
//! (tests/fixtures/gen/gen_pickle_corpus.py), and expected.json holds what CPython's own
//! unpickler (with recording classes instead of imports) decodes it to. We decode each file,
//! convert the arena to the same JSON form and compare.

use std::collections::HashMap;
use std::fs;
use std::path::PathBuf;

use serde_json::{json, Map, Value as Json};
use torchport_pickle::{
    bigint_to_decimal, is_dangerous_global, parse, parse_prefix, CallKind, ErrorKind, Limits,
    NodeId, Pickle, Value,
};

/// How many cases the generator wrote; the test fails if fewer were checked.
const MIN_CASES: usize = 205;

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("corpus")
}

fn read_case(name: &str) -> Vec<u8> {
    fs::read(corpus_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn permissive() -> Limits {
    Limits {
        refuse_dangerous: false,
        ..Limits::default()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Converts an arena into the generator's JSON form (see the generator's docstring).
struct Encoder<'p> {
    pickle: &'p Pickle,
    seen: HashMap<NodeId, usize>,
}

impl<'p> Encoder<'p> {
    fn encode(&mut self, id: NodeId) -> Json {
        let value: &'p Value = self.pickle.get(id);
        match value {
            Value::None => return Json::Null,
            Value::Bool(b) => return json!(b),
            Value::Str(s) => return json!(s),
            Value::Int(i) if i.unsigned_abs() <= 1 << 53 => return json!(i),
            Value::Int(i) => return json!({ "int": i.to_string() }),
            Value::BigInt(b) => return json!({ "int": bigint_to_decimal(b) }),
            Value::Float(f) => return json!({ "float": format!("{:016x}", f.to_bits()) }),
            Value::Bytes(b) => return json!({ "bytes": hex(b) }),
            Value::Global { module, name } => return json!({ "global": [module, name] }),
            Value::PersistentId(pid) => return json!({ "persid": self.encode(*pid) }),
            Value::Tuple(items) if items.is_empty() => return json!({ "tuple": [] }),
            Value::FrozenSet(items) if items.is_empty() => return json!({ "frozenset": [] }),
            _ => {}
        }
        if let Some(k) = self.seen.get(&id) {
            return json!({ "ref": k });
        }
        self.seen.insert(id, self.seen.len());
        match value {
            Value::ByteArray(b) => json!({ "bytearray": hex(b) }),
            Value::List(items) => json!({ "list": self.encode_all(items) }),
            Value::Tuple(items) => json!({ "tuple": self.encode_all(items) }),
            Value::Set(items) => json!({ "set": self.encode_all(items) }),
            Value::FrozenSet(items) => json!({ "frozenset": self.encode_all(items) }),
            Value::Dict(pairs) => json!({ "dict": self.encode_pairs(pairs) }),
            Value::Object(o) => {
                // Same order as the generator, so pre-order ref numbers agree.
                let mut out = Map::new();
                out.insert("callable".into(), self.encode(o.callable));
                out.insert("args".into(), Json::Array(self.encode_all(&o.args)));
                out.insert("kwargs".into(), Json::Array(self.encode_pairs(&o.kwargs)));
                if let Some(state) = o.state {
                    out.insert("state".into(), self.encode(state));
                }
                out.insert("items".into(), Json::Array(self.encode_all(&o.list_items)));
                out.insert(
                    "dict_items".into(),
                    Json::Array(self.encode_pairs(&o.dict_items)),
                );
                json!({ "object": out })
            }
            other => panic!("unexpected value {other:?}"),
        }
    }

    fn encode_all(&mut self, items: &[NodeId]) -> Vec<Json> {
        items.iter().map(|&i| self.encode(i)).collect()
    }

    fn encode_pairs(&mut self, pairs: &[(NodeId, NodeId)]) -> Vec<Json> {
        pairs
            .iter()
            .map(|&(k, v)| {
                let k = self.encode(k);
                let v = self.encode(v);
                json!([k, v])
            })
            .collect()
    }
}

fn to_json(pickle: &Pickle) -> Json {
    Encoder {
        pickle,
        seen: HashMap::new(),
    }
    .encode(pickle.root())
}

/// Sort set / frozenset items so the comparison ignores their order.
fn canonical(v: Json) -> Json {
    match v {
        Json::Array(items) => Json::Array(items.into_iter().map(canonical).collect()),
        Json::Object(map) => {
            let is_set =
                map.len() == 1 && (map.contains_key("set") || map.contains_key("frozenset"));
            let mut out = Map::new();
            for (k, v) in map {
                let mut v = canonical(v);
                if let (true, Json::Array(items)) = (is_set, &mut v) {
                    items.sort_by_cached_key(|i| i.to_string());
                }
                out.insert(k, v);
            }
            Json::Object(out)
        }
        other => other,
    }
}

fn expected() -> Json {
    let text = fs::read_to_string(corpus_dir().join("expected.json")).expect("expected.json");
    serde_json::from_str(&text).expect("expected.json parses")
}

#[test]
fn corpus_matches_cpython() {
    let doc = expected();
    let values = doc["values"].as_array().expect("values");
    let cases = doc["cases"].as_object().expect("cases");
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for (file, index) in cases {
        let bytes = read_case(file);
        let pickle = match parse(&bytes, &permissive()) {
            Ok(p) => p,
            Err(e) => {
                failures.push(format!("{file}: {e}"));
                continue;
            }
        };
        let want = canonical(values[index.as_u64().expect("index") as usize].clone());
        let got = canonical(to_json(&pickle));
        if got != want {
            failures.push(format!("{file}:\n  got  {got}\n  want {want}"));
        }

        // The protocol is in the file name: PROTO is written from protocol 2 on.
        let proto: u8 = file
            .strip_suffix(".pkl")
            .and_then(|f| f.rsplit_once(".p"))
            .unwrap()
            .1
            .parse()
            .unwrap();
        let want_proto = if proto >= 2 { Some(proto) } else { None };
        assert_eq!(pickle.protocol(), want_proto, "{file}");

        // With default limits a file loads, or it is refused for a dangerous global it uses.
        let dangerous: Vec<_> = pickle
            .globals()
            .iter()
            .filter(|(m, n)| is_dangerous_global(m, n))
            .collect();
        match parse(&bytes, &Limits::default()) {
            Ok(_) => assert!(dangerous.is_empty(), "{file} loaded despite {dangerous:?}"),
            Err(e) => match &e.kind {
                ErrorKind::DangerousGlobal { module, name } => {
                    assert!(
                        dangerous.contains(&&(module.clone(), name.clone())),
                        "{file}: {e}"
                    )
                }
                _ => panic!("{file}: {e}"),
            },
        }
        checked += 1;
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
    println!("checked {checked} corpus cases against CPython");
    assert_eq!(checked as u64, doc["count"].as_u64().unwrap());
    assert!(
        checked >= MIN_CASES,
        "only {checked} cases checked, expected at least {MIN_CASES}"
    );

    // Every .pkl file in the directory is a case.
    let on_disk = fs::read_dir(corpus_dir())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "pkl")
        })
        .count();
    assert_eq!(on_disk, checked);
}

#[test]
fn call_kinds_and_globals_are_recorded() {
    let kind_of = |file: &str| {
        let p = parse(&read_case(file), &permissive()).unwrap();
        let o = p
            .as_object(p.root())
            .unwrap_or_else(|| panic!("{file}: root is not an object"));
        (
            o.kind,
            p.as_global(o.callable).map(|(m, n)| format!("{m}.{n}")),
            o.state.is_some(),
        )
    };
    assert_eq!(
        kind_of("ordered_dict.p2.pkl"),
        (
            CallKind::Reduce,
            Some("collections.OrderedDict".into()),
            false
        )
    );
    assert_eq!(
        kind_of("newobj_build.p2.pkl"),
        (CallKind::NewObj, Some("__main__.WithState".into()), true)
    );
    assert_eq!(
        kind_of("newobj_ex.p4.pkl"),
        (CallKind::NewObjEx, Some("__main__.KwOnly".into()), true)
    );
    assert_eq!(
        kind_of("raw_inst.p0.pkl"),
        (CallKind::Inst, Some("__main__.Old".into()), true)
    );
    assert_eq!(
        kind_of("raw_obj.p1.pkl"),
        (CallKind::Obj, Some("__main__.Old".into()), true)
    );

    let p = parse(&read_case("datetime_decimal.p4.pkl"), &Limits::default()).unwrap();
    let globals: Vec<String> = p
        .globals()
        .iter()
        .map(|(m, n)| format!("{m}.{n}"))
        .collect();
    assert_eq!(
        globals,
        ["datetime.datetime", "decimal.Decimal", "builtins.complex"]
    );

    // Shared references are the same node; the self-referencing list contains itself.
    let p = parse(&read_case("self_ref_list.p2.pkl"), &Limits::default()).unwrap();
    let items = p.as_tuple_or_list(p.root()).unwrap();
    assert_eq!(items[1], p.root());
    let p = parse(&read_case("shared.p3.pkl"), &Limits::default()).unwrap();
    let items = p.as_tuple_or_list(p.root()).unwrap();
    assert_eq!(items[0], items[1]);
}

#[test]
fn parse_prefix_reads_pickles_back_to_back() {
    let a = read_case("ordered_dict.p2.pkl");
    let b = read_case("big_list.p1.pkl");
    let mut stream = a.clone();
    stream.extend_from_slice(&b);
    let (first, used) = parse_prefix(&stream, &Limits::default()).unwrap();
    assert_eq!(used, a.len());
    assert!(first.as_object(first.root()).is_some());
    let (second, used2) = parse_prefix(&stream[used..], &Limits::default()).unwrap();
    assert_eq!(used2, b.len());
    assert_eq!(
        second.as_tuple_or_list(second.root()).map(<[_]>::len),
        Some(1001)
    );
    let err = parse(&stream, &Limits::default()).unwrap_err();
    assert!(matches!(err.kind, ErrorKind::TrailingBytes(n) if n == b.len()));
    assert_eq!(err.offset, a.len() as u64);
}
