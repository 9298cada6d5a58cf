//! transformers' `BertModel` (without its pooler) in Burn: an embeddings module written for the
//! port (word + position + token type embeddings, then LayerNorm) and Burn's own
//! `TransformerEncoder`, which is BERT's encoder when built post-norm with exact GELU and
//! BERT's LayerNorm epsilon. `rules.toml` maps the Hugging Face names onto it.

use burn::module::Module;
use burn::nn::activation::ActivationConfig;
use burn::nn::transformer::{
    TransformerEncoder, TransformerEncoderConfig, TransformerEncoderInput,
};
use burn::nn::{Embedding, EmbeddingConfig, LayerNorm, LayerNormConfig};
use burn::tensor::{Device, Int, Tensor};
use torchport::remap::RuleSet;

/// The rules that map transformers' BERT names onto this model (`rules.toml`).
pub fn rules() -> RuleSet {
    RuleSet::from_toml_str("rules.toml", include_str!("rules.toml")).expect("valid rules")
}

/// The fields of transformers' `BertConfig` (config.json) the model needs.
#[derive(Clone, Debug, PartialEq)]
pub struct BertConfig {
    /// `vocab_size`.
    pub vocab_size: usize,
    /// `hidden_size`.
    pub hidden_size: usize,
    /// `num_hidden_layers`.
    pub num_hidden_layers: usize,
    /// `num_attention_heads`.
    pub num_attention_heads: usize,
    /// `intermediate_size`.
    pub intermediate_size: usize,
    /// `max_position_embeddings`.
    pub max_position_embeddings: usize,
    /// `type_vocab_size`.
    pub type_vocab_size: usize,
    /// `layer_norm_eps` (1e-12 for BERT; Burn's LayerNorm default is 1e-5).
    pub layer_norm_eps: f64,
}

impl BertConfig {
    /// Read the fields from a transformers `config.json`. Only BERT's defaults are supported:
    /// `hidden_act` "gelu" (exact, erf) and absolute position embeddings.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let json: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let int = |key: &str| {
            json[key]
                .as_u64()
                .map(|v| v as usize)
                .ok_or_else(|| format!("config.json: `{key}` is missing or not an integer"))
        };
        let act = json["hidden_act"].as_str().unwrap_or("gelu");
        if act != "gelu" {
            return Err(format!(
                "config.json: hidden_act `{act}`, only `gelu` is ported"
            ));
        }
        let positions = json["position_embedding_type"]
            .as_str()
            .unwrap_or("absolute");
        if positions != "absolute" {
            return Err(format!(
                "config.json: position_embedding_type `{positions}`"
            ));
        }
        Ok(BertConfig {
            vocab_size: int("vocab_size")?,
            hidden_size: int("hidden_size")?,
            num_hidden_layers: int("num_hidden_layers")?,
            num_attention_heads: int("num_attention_heads")?,
            intermediate_size: int("intermediate_size")?,
            max_position_embeddings: int("max_position_embeddings")?,
            type_vocab_size: int("type_vocab_size")?,
            layer_norm_eps: json["layer_norm_eps"].as_f64().unwrap_or(1e-12),
        })
    }

    /// Build the model (parameters initialised lazily, replaced by loading).
    pub fn init(&self, device: &Device) -> Bert {
        let h = self.hidden_size;
        let encoder = TransformerEncoderConfig::new(
            h,
            self.intermediate_size,
            self.num_attention_heads,
            self.num_hidden_layers,
        )
        // BERT: post-norm, exact GELU, its own LayerNorm epsilon, no dropout at inference.
        .with_norm_first(false)
        .with_activation(ActivationConfig::Gelu)
        .with_layer_norm_eps(self.layer_norm_eps)
        .with_dropout(0.0)
        .init(device);
        Bert {
            embeddings: BertEmbeddings {
                word_embeddings: EmbeddingConfig::new(self.vocab_size, h).init(device),
                position_embeddings: EmbeddingConfig::new(self.max_position_embeddings, h)
                    .init(device),
                token_type_embeddings: EmbeddingConfig::new(self.type_vocab_size, h).init(device),
                layer_norm: LayerNormConfig::new(h)
                    .with_epsilon(self.layer_norm_eps)
                    .init(device),
            },
            encoder,
        }
    }
}

/// BERT's embeddings: the sum of word, position and token type embeddings, normalised.
#[derive(Module, Debug)]
pub struct BertEmbeddings {
    word_embeddings: Embedding,
    position_embeddings: Embedding,
    token_type_embeddings: Embedding,
    layer_norm: LayerNorm,
}

impl BertEmbeddings {
    fn forward(&self, input_ids: Tensor<2, Int>, token_type_ids: Tensor<2, Int>) -> Tensor<3> {
        let [batch, seq] = input_ids.dims();
        let positions = Tensor::<1, Int>::arange(0..seq as i64, &input_ids.device())
            .reshape([1, seq])
            .repeat_dim(0, batch);
        let x = self.word_embeddings.forward(input_ids)
            + self.position_embeddings.forward(positions)
            + self.token_type_embeddings.forward(token_type_ids);
        self.layer_norm.forward(x)
    }
}

/// transformers' `BertModel` up to `last_hidden_state`.
#[derive(Module, Debug)]
pub struct Bert {
    embeddings: BertEmbeddings,
    encoder: TransformerEncoder,
}

impl Bert {
    /// `input_ids`, `token_type_ids` and `attention_mask` (1 = token, 0 = padding), each
    /// `[batch, seq]`, to `last_hidden_state` `[batch, seq, hidden]`.
    pub fn forward(
        &self,
        input_ids: Tensor<2, Int>,
        token_type_ids: Tensor<2, Int>,
        attention_mask: Tensor<2, Int>,
    ) -> Tensor<3> {
        let x = self.embeddings.forward(input_ids, token_type_ids);
        // Burn's padding mask is true where a key is padding.
        let pad = attention_mask.equal_elem(0);
        self.encoder
            .forward(TransformerEncoderInput::new(x).mask_pad(pad))
    }
}
