//! tokenizer.json through the `tokenizers` crate, plus what
//! tokenizer_config.json and generation_config.json say about special tokens.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::OneOrMany;
use crate::error::{read_json, ReadError, Result};
use crate::token_bytes::TokenBytes;

/// A special token as tokenizer_config.json writes it: a string, or an
/// AddedToken object with a `content` field.
#[derive(Deserialize)]
#[serde(untagged)]
enum SpecialToken {
    Text(String),
    Added { content: String },
}

impl SpecialToken {
    fn text(&self) -> &str {
        match self {
            SpecialToken::Text(t) | SpecialToken::Added { content: t } => t,
        }
    }
}

/// `chat_template` is a string, or a list of named templates.
#[derive(Deserialize)]
#[serde(untagged)]
enum ChatTemplate {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

#[derive(Deserialize, Default)]
struct TokenizerConfig {
    bos_token: Option<SpecialToken>,
    eos_token: Option<SpecialToken>,
    add_bos_token: Option<bool>,
    chat_template: Option<ChatTemplate>,
}

#[derive(Deserialize, Default)]
struct GenerationConfig {
    eos_token_id: Option<OneOrMany>,
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The file it was read from, for errors.
    source: PathBuf,
    bos: Option<u32>,
    add_bos: bool,
    eos: Vec<u32>,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Loads the tokenizer of `dir`; `config_eos` are config.json's EOS ids,
    /// which count as stop tokens too.
    pub fn from_dir(dir: &Path, config_eos: &[u32]) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let bytes = crate::file::read_regular(&path).map_err(|e| ReadError::in_file(path.clone(), e))?;
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| ReadError::Tokenizer {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if inner.get_vocab_size(true) == 0 {
            return Err(ReadError::Tokenizer {
                path,
                reason: "it has no tokens".into(),
            });
        }
        let optional_json = |name: &str| {
            let p = dir.join(name);
            p.exists().then_some(p)
        };
        let config: TokenizerConfig = match optional_json("tokenizer_config.json") {
            Some(p) => read_json(&p)?,
            None => TokenizerConfig::default(),
        };
        let generation: GenerationConfig = match optional_json("generation_config.json") {
            Some(p) => read_json(&p)?,
            None => GenerationConfig::default(),
        };
        let id_of = |t: &Option<SpecialToken>| t.as_ref().and_then(|t| inner.token_to_id(t.text()));
        let mut eos: Vec<u32> = config_eos.to_vec();
        eos.extend(generation.eos_token_id.map(|e| e.ids()).unwrap_or_default());
        eos.extend(id_of(&config.eos_token));
        let chat_template = config.chat_template.and_then(|t| match t {
            ChatTemplate::One(t) => Some(t),
            ChatTemplate::Named(list) => list.into_iter().find(|t| t.name == "default").map(|t| t.template),
        });
        let bos = id_of(&config.bos_token);
        let add_bos = config.add_bos_token.unwrap_or(false);
        if let (Some(token), None, true) = (&config.bos_token, bos, add_bos) {
            return Err(ReadError::Config {
                path: dir.join("tokenizer_config.json"),
                field: "bos_token",
                reason: format!(
                    "'{}' is not a token of tokenizer.json, so the BOS that add_bos_token asks for cannot be added",
                    token.text()
                ),
            });
        }
        Self::from_parts(&path, inner, bos, add_bos, eos, chat_template)
    }

    /// A tokenizer built elsewhere (from a GGUF file's metadata, say) with
    /// what its configuration says about special tokens: BOS, whether to
    /// put it first, the ids that end a sequence and the chat template.
    /// `source` names the file in errors.
    pub fn from_parts(
        source: &Path,
        mut inner: tokenizers::Tokenizer,
        bos: Option<u32>,
        add_bos: bool,
        mut eos: Vec<u32>,
        chat_template: Option<String>,
    ) -> Result<Self> {
        // Some tokenizers pad to a fixed length or truncate for training:
        // cleave wants every sequence as it is.
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| ReadError::Tokenizer {
            path: source.to_path_buf(),
            reason: e.to_string(),
        })?;
        eos.sort_unstable();
        eos.dedup();
        Ok(Tokenizer {
            inner,
            source: source.to_path_buf(),
            bos,
            add_bos,
            eos,
            chat_template,
        })
    }

    /// Cuts encodings to `max_len` ids (special tokens included), as
    /// sentence-transformers does with its `max_seq_length`.
    pub fn truncate_to(&mut self, max_len: usize) -> Result<()> {
        let params = tokenizers::TruncationParams {
            max_length: max_len,
            ..Default::default()
        };
        self.inner
            .with_truncation(Some(params))
            .map(|_| ())
            .map_err(|e| ReadError::Encode(e.to_string()))
    }

    /// The ids of `text` as the model expects a prompt: the tokenizer's own
    /// special tokens, and BOS first where tokenizer_config.json asks for it
    /// and the tokenizer's post-processor has not already added it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, true)
            .map_err(|e| ReadError::Encode(e.to_string()))?;
        let mut ids = encoding.get_ids().to_vec();
        if let (true, Some(bos)) = (self.add_bos, self.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// The ids of a prompt a chat template rendered, as transformers'
    /// `apply_chat_template` tokenizes it: the special tokens the template
    /// wrote (its BOS among them) parsed, nothing added.
    pub fn encode_rendered(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| ReadError::Encode(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`, special tokens left out.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| ReadError::Encode(e.to_string()))
    }

    /// Text of `ids`, special tokens written as their text: for answers
    /// whose syntax a special token marks (Mistral's `[TOOL_CALLS]`).
    pub fn decode_with_special(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| ReadError::Encode(e.to_string()))
    }

    /// The id of the special token whose text is `text`, where the
    /// tokenizer has one.
    pub fn special_id(&self, text: &str) -> Option<u32> {
        let id = self.inner.token_to_id(text)?;
        self.inner
            .get_added_tokens_decoder()
            .get(&id)
            .is_some_and(|token| token.special)
            .then_some(id)
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.eos.contains(&id)
    }

    /// Every id that ends a sequence.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    /// The text of a token: how a chat template writes `bos_token`.
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// What each id stands for in text (see [`TokenBytes`]), ids from 0
    /// to the vocabulary's size; an error where the tokenizer's decoder
    /// spells tokens in no byte form cleave reads.
    pub fn token_bytes(&self) -> Result<Vec<TokenBytes>> {
        crate::token_bytes::token_bytes(&self.inner, &self.source)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The longest token's text, in bytes: a text of `n` bytes encodes to
    /// at least about `n / longest_token_bytes()` ids, so a text far too
    /// long for a context can be refused without encoding it. (A token's
    /// vocabulary text is at least as long as the bytes it stands for:
    /// byte-level and `▁` spellings only grow them.)
    pub fn longest_token_bytes(&self) -> usize {
        self.inner
            .get_vocab(true)
            .keys()
            .map(String::len)
            .max()
            .unwrap_or(1)
            .max(1)
    }
}
