//! Target-aware adapters: for one Burn parameter, which PyTorch tensor holds its values and
//! how to reshape them. The adapter is chosen by the Burn module the parameter lands in, not
//! by the name in the file, so a `Linear` weight is transposed while an `Embedding` weight of
//! the same shape is not, and an LSTM's packed gate matrix is split into Burn's per-gate
//! `Linear`s wherever the `Lstm` sits in the model.
//!
//! | Burn module (holder)           | PyTorch counterpart                | what happens                  |
//! |--------------------------------|------------------------------------|-------------------------------|
//! | `Linear.weight`                | `weight` `[out, in]`               | transposed to `[in, out]`; taken as is for `LinearLayout::Col` (see [`Target::load_mapped`]) |
//! | `BatchNorm`, `LayerNorm`, `GroupNorm`, `InstanceNorm`, `RmsNorm` `gamma`/`beta` | `weight`/`bias` | renamed; running stats as is |
//! | `PRelu.alpha`                  | `weight`                           | renamed                       |
//! | `Lstm.{input,forget,cell,output}_gate.{input,hidden}_transform` | `weight_{ih,hh}_l{k}[_reverse]`, `bias_…` | gate rows `i,f,g,o` split out, weights transposed |
//! | `Gru.{reset,update,new}_gate.…` | same names, gates `r,z,n`         | split, transposed             |
//! | `BiLstm`/`BiGru` `forward`/`reverse` | one `nn.LSTM(bidirectional=True)` | `_reverse` suffix for `reverse` |
//! | `Vec<Lstm>` / `Vec<BiLstm>` item `k` | layer `k` of one multi-layer `nn.LSTM`, or item `k` of a `ModuleList` | whichever the file has |
//! | `MultiHeadAttention`/`CrossAttention` `.{query,key,value}` | `in_proj_weight`/`in_proj_bias` `[3E, …]` (or `{q,k,v}_proj_weight`, as `kdim`/`vdim` ≠ `E` saves them) | split in three, transposed |
//! | `MultiHeadAttention`/`CrossAttention` `.output` | `out_proj`                | renamed, transposed           |
//! | `TransformerEncoderLayer` / `TransformerDecoderLayer` | `nn.TransformerEncoderLayer` / `DecoderLayer` | `mha`→`self_attn`, `cross_attn`→`multihead_attn`, `pwff.linear_inner`→`linear1`, `pwff.linear_outer`→`linear2`, `norm_k`→`normk` (post-norm order) |
//! | anything else (`Conv*d`, `ConvTranspose*d`, `Embedding`, your own structs) | same path | as is |
//!
//! Enum variant segments (`Enum:…` holders) are left out of the PyTorch name, as PyTorch has no
//! such level.

use crate::target::Target;

/// How to build one Burn parameter from one checkpoint tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipe {
    /// Name of the checkpoint tensor (after the user's renames).
    pub source: String,
    /// Take block `index` of `count` equal blocks along the first dimension (packed gates,
    /// fused query/key/value).
    pub part: Option<Part>,
    /// Transpose the 2-D result (PyTorch `[out, in]` to Burn `[in, out]`).
    pub transpose: bool,
    /// What the adapter did, for the report (empty when the tensor is taken as is).
    pub note: String,
}

/// One of `count` equal blocks along the first dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    /// Which block, from 0.
    pub index: usize,
    /// How many blocks the dimension holds.
    pub count: usize,
}

impl Recipe {
    pub(crate) fn plain(source: String) -> Recipe {
        Recipe {
            source,
            part: None,
            transpose: false,
            note: String::new(),
        }
    }
}

fn join(prefix: &[String], last: &str) -> String {
    if prefix.is_empty() {
        last.to_string()
    } else {
        format!("{}.{}", prefix.join("."), last)
    }
}

const NORMS: [&str; 5] = [
    "Struct:BatchNorm",
    "Struct:LayerNorm",
    "Struct:GroupNorm",
    "Struct:InstanceNorm",
    "Struct:RmsNorm",
];

/// The checkpoint tensors that could hold `target`, most likely first. Every recipe names a
/// PyTorch-side tensor; the caller takes the first one the checkpoint has.
pub fn candidates(t: &Target) -> Vec<Recipe> {
    let n = t.segments.len();
    if t.types.len() != n {
        return vec![Recipe::plain(t.path())];
    }
    // PyTorch-side path so far, and for each of its segments the Burn type holding it.
    let mut out: Vec<String> = Vec::with_capacity(n);
    let mut out_types: Vec<&str> = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        let ty = t.types[i].as_str();
        let seg = t.segments[i].as_str();
        if ty.starts_with("Enum:") && i + 1 < n {
            i += 1;
            continue;
        }
        match ty {
            "Struct:Lstm" | "Struct:Gru" => {
                if let Some(r) = rnn(t, i, &out, &out_types) {
                    return r;
                }
            }
            "Struct:MultiHeadAttention" | "Struct:CrossAttention" => {
                if let Some(r) = attention(t, i, &out) {
                    return r;
                }
                if seg == "output" {
                    out.push("out_proj".into());
                    out_types.push(ty);
                    i += 1;
                    continue;
                }
            }
            "Struct:TransformerEncoderLayer" | "Struct:TransformerDecoderLayer" => {
                let renamed = match seg {
                    "mha" => "self_attn",
                    "cross_attn" => "multihead_attn",
                    "norm_1" => "norm1",
                    "norm_2" => "norm2",
                    "norm_3" => "norm3",
                    other => other,
                };
                out.push(renamed.into());
                out_types.push(ty);
                i += 1;
                continue;
            }
            "Struct:PositionWiseFeedForward"
                if i >= 1
                    && matches!(
                        t.types[i - 1].as_str(),
                        "Struct:TransformerEncoderLayer" | "Struct:TransformerDecoderLayer"
                    )
                    && matches!(seg, "linear_inner" | "linear_outer") =>
            {
                // `pwff.linear_inner` is the layer's own `linear1`.
                out.pop();
                out_types.pop();
                out.push(
                    if seg == "linear_inner" {
                        "linear1"
                    } else {
                        "linear2"
                    }
                    .into(),
                );
                out_types.push(ty);
                i += 1;
                continue;
            }
            _ => {}
        }
        if i + 1 == n {
            return vec![leaf(t, ty, seg, &out)];
        }
        out.push(seg.to_string());
        out_types.push(ty);
        i += 1;
    }
    Vec::new()
}

/// The parameter itself, held by a module of type `ty`.
fn leaf(t: &Target, ty: &str, seg: &str, out: &[String]) -> Recipe {
    if NORMS.contains(&ty) {
        let renamed = match seg {
            "gamma" => Some("weight"),
            "beta" => Some("bias"),
            _ => None,
        };
        if let Some(r) = renamed {
            let mut rec = Recipe::plain(join(out, r));
            rec.note = format!("{}: {r} -> {seg}", short(ty));
            return rec;
        }
    }
    if ty == "Struct:PRelu" && seg == "alpha" {
        let mut rec = Recipe::plain(join(out, "weight"));
        rec.note = "PRelu: weight -> alpha".into();
        return rec;
    }
    if ty == "Struct:Linear" && seg == "weight" && t.shape.len() == 2 {
        let mut rec = Recipe::plain(join(out, seg));
        if t.load_mapped {
            // `LinearLayout::Col`: Burn loads PyTorch's [out, in] and transposes it itself.
            rec.note = "Linear (Col layout): [out, in] as is".into();
        } else {
            rec.transpose = true;
            rec.note = "Linear: transposed [out, in] -> [in, out]".into();
        }
        return rec;
    }
    Recipe::plain(join(out, seg))
}

fn short(ty: &str) -> &str {
    ty.split_once(':').map(|(_, s)| s).unwrap_or(ty)
}

/// A parameter inside an `Lstm` or `Gru` at `segments[..i]`:
/// `<gate>.<input|hidden>_transform.<weight|bias>`.
fn rnn(t: &Target, i: usize, out: &[String], out_types: &[&str]) -> Option<Vec<Recipe>> {
    let n = t.segments.len();
    if i + 3 != n || t.types[i + 1] != "Struct:GateController" || t.types[i + 2] != "Struct:Linear"
    {
        return None;
    }
    let lstm = t.types[i] == "Struct:Lstm";
    let (gate, count) = match (lstm, t.segments[i].as_str()) {
        // PyTorch packs LSTM gates as i, f, g, o and GRU gates as r, z, n.
        (true, "input_gate") => (0, 4),
        (true, "forget_gate") => (1, 4),
        (true, "cell_gate") => (2, 4),
        (true, "output_gate") => (3, 4),
        (false, "reset_gate") => (0, 3),
        (false, "update_gate") => (1, 3),
        (false, "new_gate") => (2, 3),
        _ => return None,
    };
    let ih = match t.segments[i + 1].as_str() {
        "input_transform" => "ih",
        "hidden_transform" => "hh",
        _ => return None,
    };
    let param = t.segments[i + 2].as_str();
    if param != "weight" && param != "bias" {
        return None;
    }
    let mut base = out.to_vec();
    let mut base_types = out_types.to_vec();
    let mut suffix = "";
    // `BiLstm { forward, reverse }` is one bidirectional PyTorch module.
    if i >= 1
        && matches!(t.types[i - 1].as_str(), "Struct:BiLstm" | "Struct:BiGru")
        && matches!(t.segments[i - 1].as_str(), "forward" | "reverse")
    {
        if t.segments[i - 1] == "reverse" {
            suffix = "_reverse";
        }
        base.pop();
        base_types.pop();
    }
    let transpose = param == "weight";
    let kind = if lstm { "Lstm" } else { "Gru" };
    // Burn's gate Linear is [in, hidden] (weight) or [hidden] (bias).
    let h = t.shape.last().copied().unwrap_or(0);
    let recipe = |prefix: &[String], layer: usize| Recipe {
        source: join(prefix, &format!("{param}_{ih}_l{layer}{suffix}")),
        part: Some(Part { index: gate, count }),
        transpose,
        note: format!(
            "{kind}: {} gate, rows {}..{} of {}{}",
            t.segments[i].trim_end_matches("_gate"),
            gate * h,
            (gate + 1) * h,
            count * h,
            if transpose { ", transposed" } else { "" }
        ),
    };
    let mut recipes = vec![recipe(&base, 0)];
    // Item k of a `Vec<Lstm>` may be layer k of one multi-layer PyTorch LSTM.
    if let (Some(last), Some(&ty)) = (base.last(), base_types.last()) {
        if let (Ok(k), true) = (last.parse::<usize>(), matches!(ty, "Vec" | "Array")) {
            recipes.push(recipe(&base[..base.len() - 1], k));
        }
    }
    Some(recipes)
}

/// `query`/`key`/`value` of a `MultiHeadAttention` or `CrossAttention` at `segments[..i]`.
fn attention(t: &Target, i: usize, out: &[String]) -> Option<Vec<Recipe>> {
    if i + 2 != t.segments.len() || t.types[i + 1] != "Struct:Linear" {
        return None;
    }
    let (index, short) = match t.segments[i].as_str() {
        "query" => (0, "q"),
        "key" => (1, "k"),
        "value" => (2, "v"),
        _ => return None,
    };
    let param = t.segments[i + 1].as_str();
    let part = Some(Part { index, count: 3 });
    match param {
        "weight" => Some(vec![
            Recipe {
                source: join(out, "in_proj_weight"),
                part,
                transpose: true,
                note: format!("MultiHeadAttention: {} rows, transposed", t.segments[i]),
            },
            Recipe {
                source: join(out, &format!("{short}_proj_weight")),
                part: None,
                transpose: true,
                note: "MultiHeadAttention: transposed".into(),
            },
        ]),
        "bias" => Some(vec![Recipe {
            source: join(out, "in_proj_bias"),
            part,
            transpose: false,
            note: format!("MultiHeadAttention: {} rows", t.segments[i]),
        }]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Kind;

    fn target(path: &str, types: &[&str], shape: &[usize]) -> Target {
        Target {
            segments: path.split('.').map(String::from).collect(),
            types: types.iter().map(|s| s.to_string()).collect(),
            shape: shape.to_vec(),
            kind: Kind::Float,
            load_mapped: false,
        }
    }

    fn sources(t: &Target) -> Vec<String> {
        candidates(t).into_iter().map(|r| r.source).collect()
    }

    #[test]
    fn linear_is_transposed_embedding_is_not() {
        let lin = target("fc.weight", &["Struct:M", "Struct:Linear"], &[4, 3]);
        let r = &candidates(&lin)[0];
        assert_eq!((r.source.as_str(), r.transpose), ("fc.weight", true));
        let emb = target("emb.weight", &["Struct:M", "Struct:Embedding"], &[4, 3]);
        let r = &candidates(&emb)[0];
        assert_eq!((r.source.as_str(), r.transpose), ("emb.weight", false));
        let mut col = target("fc.weight", &["Struct:M", "Struct:Linear"], &[4, 4]);
        col.load_mapped = true;
        let r = &candidates(&col)[0];
        assert_eq!((r.source.as_str(), r.transpose), ("fc.weight", false));
    }

    #[test]
    fn norms_are_renamed() {
        let t = target("bn.gamma", &["Struct:M", "Struct:BatchNorm"], &[4]);
        assert_eq!(sources(&t), ["bn.weight"]);
        let t = target("bn.running_var", &["Struct:M", "Struct:BatchNorm"], &[4]);
        assert_eq!(sources(&t), ["bn.running_var"]);
        let t = target("beta", &["Struct:LayerNorm"], &[4]);
        assert_eq!(sources(&t), ["bias"]);
    }

    #[test]
    fn lstm_gates_every_layer_and_direction() {
        let types = [
            "Struct:M",
            "Vec",
            "Struct:BiLstm",
            "Struct:Lstm",
            "Struct:GateController",
            "Struct:Linear",
        ];
        let t = target(
            "rnn.1.reverse.cell_gate.hidden_transform.weight",
            &types,
            &[6, 6],
        );
        let c = candidates(&t);
        assert_eq!(
            c.iter().map(|r| r.source.as_str()).collect::<Vec<_>>(),
            ["rnn.1.weight_hh_l0_reverse", "rnn.weight_hh_l1_reverse"]
        );
        assert_eq!(c[0].part, Some(Part { index: 2, count: 4 }));
        assert!(c[0].transpose);
        let t = target(
            "gru.update_gate.input_transform.bias",
            &[
                "Struct:M",
                "Struct:Gru",
                "Struct:GateController",
                "Struct:Linear",
            ],
            &[5],
        );
        let c = candidates(&t);
        assert_eq!(c[0].source, "gru.bias_ih_l0");
        assert_eq!(c[0].part, Some(Part { index: 1, count: 3 }));
        assert!(!c[0].transpose);
    }

    #[test]
    fn attention_and_transformer_names() {
        let types = [
            "Struct:TransformerEncoder",
            "Vec",
            "Struct:TransformerEncoderLayer",
            "Struct:MultiHeadAttention",
            "Struct:Linear",
        ];
        let t = target("layers.0.mha.key.weight", &types, &[16, 16]);
        let c = candidates(&t);
        assert_eq!(c[0].source, "layers.0.self_attn.in_proj_weight");
        assert_eq!(c[0].part, Some(Part { index: 1, count: 3 }));
        assert_eq!(c[1].source, "layers.0.self_attn.k_proj_weight");
        let t = target("layers.0.mha.output.bias", &types, &[16]);
        assert_eq!(sources(&t), ["layers.0.self_attn.out_proj.bias"]);
        let t = target(
            "layers.0.pwff.linear_outer.weight",
            &[
                "Struct:TransformerEncoder",
                "Vec",
                "Struct:TransformerEncoderLayer",
                "Struct:PositionWiseFeedForward",
                "Struct:Linear",
            ],
            &[32, 16],
        );
        assert_eq!(sources(&t), ["layers.0.linear2.weight"]);
        let t = target(
            "layers.0.norm_2.gamma",
            &[
                "Struct:TransformerEncoder",
                "Vec",
                "Struct:TransformerEncoderLayer",
                "Struct:LayerNorm",
            ],
            &[16],
        );
        assert_eq!(sources(&t), ["layers.0.norm2.weight"]);
    }

    #[test]
    fn cross_attention_takes_separate_projections() {
        let types = ["Struct:M", "Struct:CrossAttention", "Struct:Linear"];
        let t = target("xattn.key.weight", &types, &[12, 16]);
        let c = candidates(&t);
        assert_eq!(c[1].source, "xattn.k_proj_weight");
        assert!(c[1].transpose);
        let t = target("xattn.value.bias", &types, &[16]);
        let c = candidates(&t);
        assert_eq!(c[0].source, "xattn.in_proj_bias");
        assert_eq!(c[0].part, Some(Part { index: 2, count: 3 }));
        let t = target("xattn.output.weight", &types, &[16, 16]);
        assert_eq!(sources(&t), ["xattn.out_proj.weight"]);
    }

    #[test]
    fn enum_variants_are_skipped() {
        let t = target(
            "block.Conv.weight",
            &["Struct:M", "Enum:Block", "Struct:Conv2d"],
            &[1, 1, 1, 1],
        );
        assert_eq!(sources(&t), ["block.weight"]);
    }
}
