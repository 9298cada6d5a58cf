//! TorchScript archives (`torch.jit.save`, traced or scripted): a zip holding
//! `<root>/data.pkl` (the module object tree), `<root>/data/<key>` storages like a
//! `torch.save` zip, `<root>/constants.pkl` (tensor constants of the code, storages in
//! `<root>/constants/<key>`) and `<root>/code/**.py` (the compiled code).
//!
//! Nothing in the archive is run. Each module is a `__torch__.*` object whose BUILD state is
//! a flat dict of attributes; which attributes are parameters and which are buffers is
//! declared only in the class's code, as `__parameters__ = [...]` / `__buffers__ = [...]`
//! lines right under `class Name(Module):`. Those two lines are all that is read of the code
//! (a bounded line scan, see [`Limits::max_code_line`]).
//!
//! Names are those of the loaded module's `state_dict()`: each module's parameters (in
//! declared order), then its buffers, then its submodules (in attribute order), joined with
//! `.`. Tensors that are neither parameters nor buffers (plain tensor attributes, and the
//! code's `CONSTANTS.c<i>`) are not in `state_dict()`: they are listed among the values
//! (as `torch.Tensor` objects), never among the tensors.

use std::collections::HashMap;
use std::path::Path;

use torchport_pickle::{NodeId, Pickle, Value as PValue};

use crate::error::{Error, Result};
use crate::format::archive::Archive;
use crate::format::kind::Format;
use crate::format::parts::Found;
use crate::format::parts::Parts;
use crate::format::torch::interpret::{is_tensor, join, tensor_at};
use crate::format::torch::zip::{find_root, parse_record, read_byteorder, ZipResolver};
use crate::limits::Limits;
use crate::script::{Script, ScriptObject, ScriptValue};
use crate::storage::FileBytes;
use crate::tensor::{ByteOrder, TensorInfo};
use crate::value::Value;

/// What a class's code declares.
#[derive(Clone, Debug, Default, PartialEq)]
struct Decl {
    /// `class Name(Module):`.
    is_module: bool,
    parameters: Vec<String>,
    buffers: Vec<String>,
}

pub(crate) fn read(path: &Path, file: &FileBytes, limits: &Limits) -> Result<Parts> {
    let mut ar = Archive::new(path, file, limits)?;
    let names = ar.names();
    let Some(root) = find_root(&names) else {
        // torch 1.0 to 1.2 wrote the module tree as model.json.
        if let Some(root) = super::torchscript_legacy::find_root(&names) {
            return super::torchscript_legacy::read(path, ar, &root, limits);
        }
        return Err(Error::corrupt(
            path,
            "the TorchScript archive has no data.pkl record (nor the model.json of torch 1.0 to 1.2)",
        ));
    };
    let order = read_byteorder(path, &mut ar, &root)?;
    let data = parse_record(path, &mut ar, &format!("{root}data.pkl"), limits)?;
    let constants_record = format!("{root}constants.pkl");
    let constants = match ar.has(&constants_record) {
        true => Some(parse_record(path, &mut ar, &constants_record, limits)?),
        false => None,
    };
    let mut tree = Tree {
        path,
        resolver: ZipResolver::new(ar, root.clone()),
        root: root.clone(),
        p: &data,
        order,
        limits,
        code: HashMap::new(),
        found: Found::default(),
        on_path: Vec::new(),
        visits: 0,
        max_visits: limits.max_visits.max(data.len().saturating_mul(4)),
        extra: Vec::new(),
    };
    let root_object = tree.root_module()?;
    let mut script_constants = Vec::new();
    if let Some(c) = &constants {
        // `constants.pkl` is the tuple the code reads as `CONSTANTS.c0`, `CONSTANTS.c1`, ….
        tree.resolver.set_folder("constants/");
        for (i, &item) in c
            .as_tuple_or_list(c.root())
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let name = format!("CONSTANTS.c{i}");
            if is_tensor(c, item) {
                tree.found
                    .values
                    .push((name.clone(), Value::Object("torch.Tensor".into())));
            }
            script_constants.push(tree.value(c, item, &name, 0)?);
        }
    }
    let code = code_records(&mut tree.resolver.ar, &names, &root, limits)?;
    let version = format_version(&mut tree.resolver.ar, &root);
    let mut globals = data.globals().to_vec();
    for g in constants.iter().flat_map(|c| c.globals()) {
        if !globals.contains(g) {
            globals.push(g.clone());
        }
    }
    let Tree {
        found,
        resolver,
        extra,
        ..
    } = tree;
    let mut parts = Parts::new(
        Format::TorchScript,
        order,
        found,
        globals,
        resolver.storages,
    );
    parts.constants = extra;
    parts.script = Some(std::sync::Arc::new(Script {
        root: root_object,
        code,
        constants: script_constants,
        version,
    }));
    Ok(parts)
}

/// The number in the `<root>/version` record (a few ASCII digits and a newline), if it holds
/// one.
fn format_version(ar: &mut Archive<'_>, root: &str) -> Option<u64> {
    let bytes = ar.record(&format!("{root}version")).ok()?;
    let bytes = bytes.bytes();
    if bytes.len() > 32 {
        return None;
    }
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// Every `code/**.py` record under `root`, as stored (their total size bounded by the
/// archive's decompression budget).
fn code_records(
    ar: &mut Archive<'_>,
    names: &[String],
    root: &str,
    limits: &Limits,
) -> Result<Vec<(String, Vec<u8>)>> {
    let prefix = format!("{root}code/");
    let mut out = Vec::new();
    for name in names {
        if name.starts_with(&prefix) && name.ends_with(".py") {
            if out.len() >= limits.max_tensors {
                break;
            }
            let bytes = ar.record(name)?.bytes().to_vec();
            out.push((name[root.len()..].to_string(), bytes));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The walk over the module tree of `data.pkl`.
struct Tree<'a> {
    path: &'a Path,
    root: String,
    p: &'a Pickle,
    resolver: ZipResolver<'a>,
    order: ByteOrder,
    limits: &'a Limits,
    /// Parsed code records: record name → class name → declarations.
    code: HashMap<String, HashMap<String, Decl>>,
    found: Found,
    on_path: Vec<NodeId>,
    visits: usize,
    max_visits: usize,
    /// Tensors of the tree that are not in `state_dict` (see `Checkpoint::constants`).
    extra: Vec<TensorInfo>,
}

/// `(module, class)` of a `__torch__.*` object, if `node` is one.
fn torch_class(p: &Pickle, node: NodeId) -> Option<(&str, &str)> {
    let (m, c) = p.as_global(p.as_object(node)?.callable)?;
    (m == "__torch__" || m.starts_with("__torch__.")).then_some((m, c))
}

/// The class name without TorchScript's `___torch_mangle_<n>` components.
fn demangle(qual: &str) -> String {
    qual.split('.')
        .filter(|part| {
            !part
                .strip_prefix("___torch_mangle_")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect::<Vec<_>>()
        .join(".")
}

impl Tree<'_> {
    fn root_module(&mut self) -> Result<ScriptObject> {
        let root = self.p.root();
        let Some((m, c)) = torch_class(self.p, root) else {
            return Err(Error::corrupt(
                self.path,
                format!(
                    "{}data.pkl does not hold a TorchScript module (its root is a {})",
                    self.root,
                    self.p.get(root).type_name()
                ),
            ));
        };
        let (m, c) = (m.to_string(), c.to_string());
        if !self.decl(&m, &c)?.is_module {
            return Err(Error::corrupt(
                self.path,
                format!("the root object of data.pkl is a {m}.{c}, which is not a module"),
            ));
        }
        self.module(root, "", 0)
    }

    /// The code record that defines classes of module `m` (`__torch__.a.b` → `code/__torch__/a/b.py`).
    fn decl(&mut self, m: &str, class: &str) -> Result<&Decl> {
        let record = format!("{}code/{}.py", self.root, m.replace('.', "/"));
        if !self.code.contains_key(&record) {
            let text = self.resolver.ar.record(&record).map_err(|e| match e {
                Error::MissingRecord { .. } => Error::corrupt(
                    self.path,
                    format!(
                        "class {m}.{class} has no code record {record}, so its parameters cannot be told from its other attributes"
                    ),
                ),
                other => other,
            })?;
            let parsed = parse_code(self.path, &record, text.bytes(), self.limits)?;
            self.code.insert(record.clone(), parsed);
        }
        self.code
            .get(&record)
            .and_then(|classes| classes.get(class))
            .ok_or_else(|| {
                Error::corrupt(
                    self.path,
                    format!("code record {record} does not define class {class}"),
                )
            })
    }

    fn module(&mut self, node: NodeId, name: &str, depth: usize) -> Result<ScriptObject> {
        let shown = if name.is_empty() { "(root)" } else { name };
        self.visits += 1;
        if self.visits > self.max_visits {
            return Err(Error::Limit {
                path: self.path.to_path_buf(),
                what: "the module tree, counting shared submodules each time they are reached,"
                    .into(),
                limit: self.max_visits as u64,
                field: "max_visits",
            });
        }
        if depth > self.limits.max_depth {
            return Err(Error::Limit {
                path: self.path.to_path_buf(),
                what: "nesting of submodules".into(),
                limit: self.limits.max_depth as u64,
                field: "max_depth",
            });
        }
        if self.on_path.contains(&node) {
            return Err(Error::corrupt(
                self.path,
                format!("module {shown} contains itself"),
            ));
        }
        let p = self.p;
        let (m, c) = torch_class(p, node).unwrap_or_default();
        let qual = format!("{m}.{c}");
        let attrs = p
            .as_object(node)
            .and_then(|o| o.state)
            .and_then(|s| p.as_dict(s))
            .ok_or_else(|| {
                Error::corrupt(
                    self.path,
                    format!("module {shown} ({qual}) has no attribute dict in data.pkl"),
                )
            })?;
        let decl = self.decl(m, c)?.clone();
        let mut object = ScriptObject {
            class: qual.clone(),
            attrs: Vec::with_capacity(attrs.len()),
        };
        self.on_path.push(node);
        self.found.modules.push((name.to_string(), demangle(&qual)));
        let lookup = |attr: &str| {
            attrs
                .iter()
                .find(|(k, _)| p.as_str(*k) == Some(attr))
                .map(|&(_, v)| v)
        };
        for (kind, list) in [("parameter", &decl.parameters), ("buffer", &decl.buffers)] {
            for attr in list {
                let bad = |what: &str| {
                    Error::corrupt(
                        self.path,
                        format!("module {shown} ({qual}) declares {kind} {attr}, but {what}"),
                    )
                };
                let v = lookup(attr).ok_or_else(|| bad("data.pkl gives it no value"))?;
                if matches!(p.get(v), PValue::None) {
                    // An unset optional parameter (`bias=False`): not in state_dict.
                    object.attrs.push((attr.clone(), ScriptValue::None));
                    continue;
                }
                if !is_tensor(p, v) {
                    return Err(bad(&format!("its value is a {}", p.get(v).type_name())));
                }
                let full = join(name, attr);
                let t = tensor_at(
                    self.path,
                    p,
                    &mut self.resolver,
                    self.order,
                    self.limits,
                    v,
                    &full,
                )?;
                if self.found.tensors.len() >= self.limits.max_tensors {
                    return Err(Error::Limit {
                        path: self.path.to_path_buf(),
                        what: "the number of tensors".into(),
                        limit: self.limits.max_tensors as u64,
                        field: "max_tensors",
                    });
                }
                object
                    .attrs
                    .push((attr.clone(), ScriptValue::Tensor(t.name.clone())));
                self.found.tensors.push(t);
            }
        }
        let declared = |k: &str| decl.parameters.iter().chain(&decl.buffers).any(|d| d == k);
        for &(k, v) in attrs {
            let Some(key) = p.as_str(k) else { continue };
            if declared(key) {
                continue;
            }
            let full = join(name, key);
            let value = if let Some((cm, cc)) = torch_class(p, v) {
                if self.decl(cm, cc)?.is_module {
                    ScriptValue::Object(Box::new(self.module(v, &full, depth + 1)?))
                } else {
                    self.value(p, v, &full, depth + 1)?
                }
            } else {
                if is_tensor(p, v) {
                    // A tensor attribute that is neither parameter nor buffer: not in state_dict.
                    self.found
                        .values
                        .push((full.clone(), Value::Object("torch.Tensor".into())));
                }
                self.value(p, v, &full, depth + 1)?
            };
            object.attrs.push((key.to_string(), value));
        }
        self.on_path.pop();
        Ok(object)
    }

    /// A non-module attribute value (or a constant), tensors named `name` (list items
    /// `name.0`, …) and kept among the extra tensors.
    fn value(&mut self, p: &Pickle, v: NodeId, name: &str, depth: usize) -> Result<ScriptValue> {
        self.visits += 1;
        if self.visits > self.max_visits {
            return Err(Error::Limit {
                path: self.path.to_path_buf(),
                what: "the values of the module tree".into(),
                limit: self.max_visits as u64,
                field: "max_visits",
            });
        }
        if depth > self.limits.max_depth {
            return Err(Error::Limit {
                path: self.path.to_path_buf(),
                what: format!("nesting of attribute {name}"),
                limit: self.limits.max_depth as u64,
                field: "max_depth",
            });
        }
        if is_tensor(p, v) {
            if self.extra.len() + self.found.tensors.len() >= self.limits.max_tensors {
                return Err(Error::Limit {
                    path: self.path.to_path_buf(),
                    what: "the number of tensors".into(),
                    limit: self.limits.max_tensors as u64,
                    field: "max_tensors",
                });
            }
            let t = tensor_at(
                self.path,
                p,
                &mut self.resolver,
                self.order,
                self.limits,
                v,
                name,
            )?;
            self.extra.push(t);
            return Ok(ScriptValue::Tensor(name.to_string()));
        }
        let items = |this: &mut Self, ids: &[NodeId]| -> Result<Vec<ScriptValue>> {
            ids.iter()
                .enumerate()
                .map(|(i, &x)| this.value(p, x, &join(name, &i.to_string()), depth + 1))
                .collect()
        };
        Ok(match p.get(v) {
            PValue::None => ScriptValue::None,
            PValue::Bool(b) => ScriptValue::Bool(*b),
            PValue::Int(i) => ScriptValue::Int(*i),
            PValue::Float(f) => ScriptValue::Float(*f),
            PValue::Str(s) => ScriptValue::Str(s.clone()),
            PValue::List(ids) => ScriptValue::List(items(self, ids)?),
            PValue::Tuple(ids) => ScriptValue::Tuple(items(self, ids)?),
            PValue::Dict(pairs) => {
                let mut out = Vec::with_capacity(pairs.len());
                for (i, &(k, x)) in pairs.iter().enumerate() {
                    let key = self.value(p, k, &join(name, &format!("k{i}")), depth + 1)?;
                    let label = match &key {
                        ScriptValue::Str(s) => s.clone(),
                        _ => i.to_string(),
                    };
                    let val = self.value(p, x, &join(name, &label), depth + 1)?;
                    out.push((key, val));
                }
                ScriptValue::Dict(out)
            }
            // `torch.jit._pickle.restore_type_tag(value, "List[str]")`, `build_tensorlist([…])`,
            // `build_intlist`, …: typed containers, recorded as calls on their value.
            PValue::Object(o)
                if p.as_global(o.callable).is_some_and(|(m, f)| {
                    m == "torch.jit._pickle" && (f == "restore_type_tag" || f.starts_with("build_"))
                }) && !o.args.is_empty() =>
            {
                return self.value(p, o.args[0], name, depth + 1);
            }
            // An enum member (`Format('NCHW')`, see the pickle VM's REDUCE): its value.
            PValue::Object(o)
                if torch_class(p, v).is_some()
                    && o.kind == torchport_pickle::CallKind::Reduce
                    && o.args.len() == 1
                    && o.state.is_none() =>
            {
                return self.value(p, o.args[0], name, depth + 1);
            }
            other => match torch_class(p, v) {
                Some((m, c)) => {
                    let qual = format!("{m}.{c}");
                    let mut object = ScriptObject {
                        class: qual,
                        attrs: Vec::new(),
                    };
                    let state = p.as_object(v).and_then(|o| o.state);
                    let pairs = state.and_then(|s| p.as_dict(s)).unwrap_or_default();
                    for &(k, x) in pairs {
                        let Some(key) = p.as_str(k) else { continue };
                        let val = self.value(p, x, &join(name, key), depth + 1)?;
                        object.attrs.push((key.to_string(), val));
                    }
                    ScriptValue::Object(Box::new(object))
                }
                None => ScriptValue::Other(other.type_name().to_string()),
            },
        })
    }
}

/// Read the class declarations of one code record: for each `class Name(Bases):` line, the
/// `__parameters__` / `__buffers__` lists in its body. Only those lines are examined.
fn parse_code(
    path: &Path,
    record: &str,
    text: &[u8],
    limits: &Limits,
) -> Result<HashMap<String, Decl>> {
    let mut classes: HashMap<String, Decl> = HashMap::new();
    let mut current: Option<String> = None;
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        if let Some(rest) = line.strip_prefix(b"class ") {
            let head = String::from_utf8_lossy(rest.get(..rest.len().min(4096)).unwrap_or(rest));
            let name_end = head.find(['(', ':']).unwrap_or(head.len());
            let name = head[..name_end].trim().to_string();
            let bases = head[name_end..]
                .strip_prefix('(')
                .and_then(|b| b.split(')').next())
                .unwrap_or("");
            let decl = Decl {
                is_module: bases.trim() == "Module",
                ..Decl::default()
            };
            classes.insert(name.clone(), decl);
            current = Some(name);
            continue;
        }
        if !line.starts_with(b" ") && !line.is_empty() {
            current = None;
            continue;
        }
        let Some(class) = &current else { continue };
        let (kind, list) = if let Some(l) = line.strip_prefix(b"  __parameters__ =") {
            ("__parameters__", l)
        } else if let Some(l) = line.strip_prefix(b"  __buffers__ =") {
            ("__buffers__", l)
        } else {
            continue;
        };
        if line.len() > limits.max_code_line {
            return Err(Error::Limit {
                path: path.to_path_buf(),
                what: format!(
                    "the {kind} declaration of class {class} (line {} of record {record}, {} bytes)",
                    i + 1,
                    line.len()
                ),
                limit: limits.max_code_line as u64,
                field: "max_code_line",
            });
        }
        let names = std::str::from_utf8(list)
            .ok()
            .and_then(parse_names)
            .ok_or_else(|| {
                Error::corrupt(
                    path,
                    format!(
                        "line {} of record {record}: the {kind} declaration of class {class} is not a list of names",
                        i + 1
                    ),
                )
            })?;
        if let Some(d) = classes.get_mut(class) {
            match kind {
                "__parameters__" => d.parameters = names,
                _ => d.buffers = names,
            }
        }
    }
    Ok(classes)
}

/// Parse `["a", "b", ]` (how TorchScript prints the declarations) into its names.
fn parse_names(list: &str) -> Option<Vec<String>> {
    let inner = list.trim().strip_prefix('[')?.strip_suffix(']')?;
    let mut out = Vec::new();
    let mut rest = inner.trim_start();
    while !rest.is_empty() {
        rest = rest.strip_prefix('"')?;
        let end = rest.find('"')?;
        let name = &rest[..end];
        if name.is_empty() || name.contains('\\') {
            return None;
        }
        out.push(name.to_string());
        rest = rest[end + 1..].trim_start();
        rest = match rest.strip_prefix(',') {
            Some(r) => r.trim_start(),
            None if rest.is_empty() => rest,
            None => return None,
        };
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(
            parse_names(r#" ["weight", "bias", ]"#),
            Some(vec!["weight".into(), "bias".into()])
        );
        assert_eq!(parse_names("[]"), Some(vec![]));
        assert_eq!(parse_names(r#"["0"]"#), Some(vec!["0".into()]));
        assert_eq!(parse_names(r#"["a" "b"]"#), None);
        assert_eq!(parse_names(r#"["a", "#), None);
        assert_eq!(parse_names("weight"), None);
    }

    #[test]
    fn demangles() {
        assert_eq!(
            demangle("__torch__.torch.nn.modules.linear.___torch_mangle_4.Linear"),
            "__torch__.torch.nn.modules.linear.Linear"
        );
        assert_eq!(demangle("__torch__.L"), "__torch__.L");
        assert_eq!(
            demangle("__torch__.___torch_mangle_x.L"),
            "__torch__.___torch_mangle_x.L"
        );
    }

    #[test]
    fn code_declarations() {
        let code = b"class Linear(Module):\n  __parameters__ = [\"weight\", \"bias\", ]\n  __buffers__ = []\n  weight : Tensor\n  def forward(self):\n    __parameters__ = [\"x\"]\nclass P(NamedTuple):\n  data : Tensor\n";
        let got = parse_code(Path::new("f"), "r", code, &Limits::default()).unwrap();
        assert_eq!(
            got["Linear"],
            Decl {
                is_module: true,
                parameters: vec!["weight".into(), "bias".into()],
                buffers: vec![],
            }
        );
        assert!(!got["P"].is_module);
        let small = Limits {
            max_code_line: 10,
            ..Limits::default()
        };
        let err = parse_code(Path::new("f"), "r", code, &small).unwrap_err();
        assert!(err.to_string().contains("max_code_line"), "{err}");
    }
}
