//! Tokenizers: a Hugging Face `tokenizer.json` (with its `tokenizer_config.json`),
//! or a byte-level BPE rebuilt from a GGUF file's `tokenizer.ggml.*` metadata,
//! so that a GGUF alone is a complete model.
//!
//! Encoding matches transformers' `tokenizer(text)["input_ids"]`: special tokens
//! are matched whole in the text, and a BOS is added only where the tokenizer's
//! post-processor (or the GGUF's `add_bos_token`) says so — SmolLM2 adds none.

use std::path::Path;

use serde::{Deserialize, Serialize};
use tokenizers::SplitDelimiterBehavior;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, Tokenizer as HfTokenizer};

use crate::gguf::GgufFile;
use crate::{Error, Result};

/// File name of the tokenizer pipeline in a Hugging Face model folder.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// File name of the special tokens and chat template in a Hugging Face model folder.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// The chat template file transformers writes beside the tokenizer.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// GGUF `tokenizer.ggml.token_type` of a control token (`<|im_start|>`): a special token.
const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF `tokenizer.ggml.token_type` of a user-defined token: matched whole, not special.
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The ids of the tokens with a role; `None` where the tokenizer has none.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    /// Beginning of sequence.
    pub bos: Option<u32>,
    /// End of sequence (of a turn, for chat models).
    pub eos: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
}

/// A tokenizer with its special tokens and chat template.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: HfTokenizer,
    special: SpecialTokens,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Loads a Hugging Face `tokenizer.json`; the special tokens and chat
    /// template come from the `tokenizer_config.json` beside it, when there
    /// is one, the template from a `chat_template.jinja` beside it first (as
    /// transformers reads them).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
        let inner: HfTokenizer = text
            .parse()
            .map_err(|e| Error::format(path, format!("not a tokenizer.json: {e}")))?;
        let config_path = path.with_file_name(TOKENIZER_CONFIG_FILE);
        let config = if config_path.is_file() {
            TokenizerConfig::load(&config_path)?
        } else {
            TokenizerConfig::default()
        };
        let id = |token: &Option<String>| -> Result<Option<u32>> {
            token
                .as_deref()
                .map(|token| {
                    inner
                        .token_to_id(token)
                        .ok_or_else(|| Error::format(&config_path, format!("token `{token}` is not in {path:?}")))
                })
                .transpose()
        };
        let special = SpecialTokens {
            bos: id(&config.bos_token)?,
            eos: id(&config.eos_token)?,
            pad: id(&config.pad_token)?,
        };
        let template_path = path.with_file_name(CHAT_TEMPLATE_FILE);
        let chat_template = match template_path.is_file() {
            true => Some(std::fs::read_to_string(&template_path).map_err(|e| Error::io("reading", &template_path, e))?),
            false => config.chat_template,
        };
        Ok(Tokenizer {
            inner,
            special,
            chat_template,
        })
    }

    /// Builds the tokenizer a GGUF file describes (see [`GgufTokenizerSpec`]).
    ///
    /// Supported: `tokenizer.ggml.model` `gpt2` (byte-level BPE) with
    /// `tokenizer.ggml.pre` `smollm` (every digit apart, then GPT-2's split)
    /// or `gpt2` / none (GPT-2's split). Control tokens (type 3) become special
    /// tokens, user-defined ones (type 4) tokens matched whole.
    pub fn from_gguf_spec(spec: &GgufTokenizerSpec) -> Result<Self> {
        if spec.model != "gpt2" {
            return Err(Error::Tokenizer(format!(
                "GGUF tokenizer model `{}` is not supported (supported: gpt2)",
                spec.model
            )));
        }
        if !spec.token_types.is_empty() && spec.token_types.len() != spec.tokens.len() {
            return Err(Error::Tokenizer(format!(
                "GGUF has {} token types for {} tokens",
                spec.token_types.len(),
                spec.tokens.len()
            )));
        }
        let mut inner = HfTokenizer::new(gguf_bpe(spec)?);
        inner
            .with_pre_tokenizer(Some(gguf_pre_tokenizer(spec.pre.as_deref())?))
            .with_decoder(Some(ByteLevelDecoder::default()));

        let special = SpecialTokens {
            bos: spec.token_id("bos", spec.bos_id)?,
            eos: spec.token_id("eos", spec.eos_id)?,
            pad: spec.token_id("pad", spec.pad_id)?,
        };
        if spec.add_bos {
            let bos = special
                .bos
                .ok_or_else(|| Error::Tokenizer("GGUF add_bos_token is set but there is no bos_token_id".into()))?;
            inner.with_post_processor(Some(bos_processor(&spec.tokens[bos as usize], bos)?));
        }
        let added = |token_type: i32, special: bool| -> Vec<AddedToken> {
            spec.tokens
                .iter()
                .zip(&spec.token_types)
                .filter(|&(_, &t)| t == token_type)
                .map(|(token, _)| AddedToken::from(token.as_str(), special).normalized(false))
                .collect()
        };
        inner.add_special_tokens(&added(TOKEN_TYPE_CONTROL, true));
        inner.add_tokens(&added(TOKEN_TYPE_USER_DEFINED, false));
        Ok(Tokenizer {
            inner,
            special,
            chat_template: spec.chat_template.clone(),
        })
    }

    /// The ids of `text`, as transformers' `tokenizer(text)["input_ids"]`;
    /// `add_special_tokens` runs the post-processor (which may add a BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("encoding {text:?}: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`, leaving special tokens out if `skip_special_tokens`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| Error::Tokenizer(format!("decoding {} ids: {e}", ids.len())))
    }

    /// The id of `token` (spelled as in the vocabulary), if it has one.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token of `id`, spelled as in the vocabulary (`Ġhas`), if any.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The pipeline as the text of a `tokenizer.json`.
    pub fn to_json(&self) -> Result<String> {
        self.inner
            .to_string(false)
            .map_err(|e| Error::Tokenizer(format!("serializing the tokenizer: {e}")))
    }

    /// The number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The ids of the BOS, EOS and PAD tokens.
    pub fn special_tokens(&self) -> SpecialTokens {
        self.special
    }

    /// The BOS id, if any.
    pub fn bos_id(&self) -> Option<u32> {
        self.special.bos
    }

    /// The EOS id, if any.
    pub fn eos_id(&self) -> Option<u32> {
        self.special.eos
    }

    /// The PAD id, if any.
    pub fn pad_id(&self) -> Option<u32> {
        self.special.pad
    }

    /// The Jinja chat template's source, if the tokenizer came with one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The same tokenizer with `source` as its chat template (saved with it).
    pub fn with_chat_template(mut self, source: String) -> Tokenizer {
        self.chat_template = Some(source);
        self
    }

    /// Writes `tokenizer.json` and `tokenizer_config.json` into `dir` (created
    /// if missing), a folder transformers' `AutoTokenizer.from_pretrained` loads.
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
        let tokenizer_path = dir.join(TOKENIZER_FILE);
        self.inner
            .save(&tokenizer_path, false)
            .map_err(|e| Error::Tokenizer(format!("writing {tokenizer_path:?}: {e}")))?;
        let token = |id: Option<u32>| id.and_then(|id| self.id_to_token(id));
        TokenizerConfig {
            tokenizer_class: Some("PreTrainedTokenizerFast".into()),
            bos_token: token(self.special.bos),
            eos_token: token(self.special.eos),
            pad_token: token(self.special.pad),
            chat_template: self.chat_template.clone(),
        }
        .save(&dir.join(TOKENIZER_CONFIG_FILE))?;
        // Where transformers 4.49 and later save it (and read it first).
        if let Some(template) = &self.chat_template {
            let path = dir.join(CHAT_TEMPLATE_FILE);
            std::fs::write(&path, template).map_err(|e| Error::io("writing", &path, e))?;
        }
        Ok(())
    }
}

/// The split of Qwen2's pre-tokenizer (its tokenizer.json's `Split` pattern).
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The pre-tokenizer GGUF's `tokenizer.ggml.pre` names.
fn gguf_pre_tokenizer(pre: Option<&str>) -> Result<PreTokenizerWrapper> {
    let byte_level = ByteLevel::new(false, true, true);
    match pre {
        // SmolLM2's tokenizer.json and llama.cpp's `smollm`: every digit apart, then GPT-2's split.
        Some("smollm") => Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
            Digits::new(true).into(),
            byte_level.into(),
        ]))),
        None | Some("gpt2") => Ok(byte_level.into()),
        // Qwen2's, Qwen2.5's and Qwen3's tokenizer.json: its own split, then bytes without GPT-2's regex.
        Some("qwen2") => {
            let split = Split::new(
                SplitPattern::Regex(QWEN2_SPLIT.into()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| Error::Tokenizer(format!("the qwen2 pre-tokenizer: {e}")))?;
            Ok(PreTokenizerWrapper::Sequence(Sequence::new(vec![
                split.into(),
                ByteLevel::new(false, false, false).into(),
            ])))
        }
        Some(other) => Err(Error::Tokenizer(format!(
            "GGUF pre-tokenizer `{other}` is not supported (supported: smollm, gpt2, qwen2)"
        ))),
    }
}

/// The byte-level BPE model of a GGUF's tokens (id = index) and merges.
fn gguf_bpe(spec: &GgufTokenizerSpec) -> Result<BPE> {
    let vocab = spec
        .tokens
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), id as u32))
        .collect::<Vocab>();
    if vocab.len() != spec.tokens.len() {
        return Err(Error::Tokenizer(
            "GGUF tokenizer.ggml.tokens holds a token twice".into(),
        ));
    }
    let merges = spec
        .merges
        .iter()
        .map(|merge| {
            merge
                .split_once(' ')
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .ok_or_else(|| Error::Tokenizer(format!("GGUF merge `{merge}` is not `a b`")))
        })
        .collect::<Result<Vec<_>>>()?;
    BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| Error::Tokenizer(format!("GGUF vocabulary: {e}")))
}

/// A post-processor putting `bos` before every sequence.
fn bos_processor(bos: &str, id: u32) -> Result<TemplateProcessing> {
    TemplateProcessing::builder()
        .try_single(format!("{bos} $A"))
        .and_then(|b| b.try_pair(format!("{bos} $A {bos} $B:1")))
        .map_err(|e| Error::Tokenizer(format!("BOS template: {e}")))?
        .special_tokens(vec![(bos.to_string(), id)])
        .build()
        .map_err(|e| Error::Tokenizer(format!("BOS template: {e}")))
}

/// The tokenizer a GGUF file describes, as its `tokenizer.ggml.*` metadata says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GgufTokenizerSpec {
    /// `tokenizer.ggml.model`: the tokenizer kind (`gpt2` is byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer (`smollm`), if named.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: every token, the index being its id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.merges`: BPE merges `"a b"`, best first.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.token_type`: per token, 1 normal, 3 control, 4 user-defined, ...
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `tokenizer.ggml.add_bos_token` (false when absent).
    pub add_bos: bool,
}

impl GgufTokenizerSpec {
    /// Reads the `tokenizer.ggml.*` keys and `tokenizer.chat_template` of `gguf`.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let optional = |key: &str| gguf.get(key).is_some();
        let strings = |key: &str| -> Result<Vec<String>> {
            Ok(gguf.get_string_array(key)?.into_iter().map(str::to_string).collect())
        };
        let id = |key: &str| optional(key).then(|| gguf.get_u32(key)).transpose();
        let text = |key: &str| optional(key).then(|| gguf.get_str(key).map(str::to_string)).transpose();
        Ok(GgufTokenizerSpec {
            model: gguf.get_str("tokenizer.ggml.model")?.to_string(),
            pre: text("tokenizer.ggml.pre")?,
            tokens: strings("tokenizer.ggml.tokens")?,
            merges: if optional("tokenizer.ggml.merges") {
                strings("tokenizer.ggml.merges")?
            } else {
                Vec::new()
            },
            token_types: if optional("tokenizer.ggml.token_type") {
                gguf.get_i32_array("tokenizer.ggml.token_type")?
            } else {
                Vec::new()
            },
            bos_id: id("tokenizer.ggml.bos_token_id")?,
            eos_id: id("tokenizer.ggml.eos_token_id")?,
            pad_id: id("tokenizer.ggml.padding_token_id")?,
            chat_template: text("tokenizer.chat_template")?,
            add_bos: optional("tokenizer.ggml.add_bos_token") && gguf.get_bool("tokenizer.ggml.add_bos_token")?,
        })
    }

    /// `id` checked to be a token of the vocabulary; `role` names it in the error.
    fn token_id(&self, role: &str, id: Option<u32>) -> Result<Option<u32>> {
        match id {
            Some(id) if id as usize >= self.tokens.len() => Err(Error::Tokenizer(format!(
                "GGUF {role} token id {id} is outside the vocabulary of {}",
                self.tokens.len()
            ))),
            id => Ok(id),
        }
    }
}

/// The parts of a Hugging Face `tokenizer_config.json` that grpo reads and writes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenizerConfig {
    /// `tokenizer_class` (written as `PreTrainedTokenizerFast`).
    pub tokenizer_class: Option<String>,
    /// `bos_token`'s text.
    pub bos_token: Option<String>,
    /// `eos_token`'s text.
    pub eos_token: Option<String>,
    /// `pad_token`'s text.
    pub pad_token: Option<String>,
    /// `chat_template`: the template, or of a list of named ones the `default`.
    pub chat_template: Option<String>,
}

impl TokenizerConfig {
    /// Reads a `tokenizer_config.json`.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
        let file: ConfigFile = serde_json::from_str(&text)
            .map_err(|e| Error::format(path, format!("not a tokenizer_config.json: {e}")))?;
        let chat_template = match file.chat_template {
            None => None,
            Some(TemplateField::One(source)) => Some(source),
            Some(TemplateField::Named(named)) => Some(
                named
                    .into_iter()
                    .find(|t| t.name == "default")
                    .ok_or_else(|| Error::format(path, "chat_template lists named templates but no `default`"))?
                    .template,
            ),
        };
        Ok(TokenizerConfig {
            tokenizer_class: file.tokenizer_class,
            bos_token: file.bos_token.map(TokenField::into_content),
            eos_token: file.eos_token.map(TokenField::into_content),
            pad_token: file.pad_token.map(TokenField::into_content),
            chat_template,
        })
    }

    /// Writes this as a `tokenizer_config.json`, leaving out what is `None`.
    pub fn save(&self, path: &Path) -> Result<()> {
        let file = ConfigFile {
            tokenizer_class: self.tokenizer_class.clone(),
            bos_token: self.bos_token.clone().map(TokenField::Text),
            eos_token: self.eos_token.clone().map(TokenField::Text),
            pad_token: self.pad_token.clone().map(TokenField::Text),
            chat_template: self.chat_template.clone().map(TemplateField::One),
        };
        let mut text =
            serde_json::to_string_pretty(&file).map_err(|e| Error::format(path, format!("serializing: {e}")))?;
        text.push('\n');
        std::fs::write(path, text).map_err(|e| Error::io("writing", path, e))
    }
}

/// `tokenizer_config.json` as stored; other keys are ignored.
#[derive(Deserialize, Serialize)]
struct ConfigFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokenizer_class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bos_token: Option<TokenField>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    eos_token: Option<TokenField>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pad_token: Option<TokenField>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    chat_template: Option<TemplateField>,
}

/// A special token: its text, or an `AddedToken` object with a `content`.
#[derive(Deserialize, Serialize)]
#[serde(untagged)]
enum TokenField {
    Text(String),
    Added { content: String },
}

impl TokenField {
    fn into_content(self) -> String {
        match self {
            TokenField::Text(content) | TokenField::Added { content } => content,
        }
    }
}

/// `chat_template`: one template, or a list of named ones.
#[derive(Deserialize, Serialize)]
#[serde(untagged)]
enum TemplateField {
    One(String),
    Named(Vec<NamedTemplate>),
}

/// One entry of a list of named chat templates.
#[derive(Deserialize, Serialize)]
struct NamedTemplate {
    name: String,
    template: String,
}
