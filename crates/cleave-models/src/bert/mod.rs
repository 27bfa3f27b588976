//! BERT encoders (`BertModel`): word + position + token-type embeddings,
//! then post-LayerNorm blocks of bidirectional attention and a GELU MLP.

mod model;

pub use model::{Bert, BertConfig};
