//! What the engine returns: per step, the new token of each running sample
//! ([`SampleUpdate`]); at the end, each sample's [`Completion`].

/// The engine's handle on a request, unique per engine.
pub type RequestId = u64;

/// Why a sample ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string was generated.
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The request was aborted (by the caller or a weight update).
    Abort,
}

impl FinishReason {
    /// The name OpenAI and vLLM use (`stop`, `length`, `abort`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// What stopped a sample that ended with [`FinishReason::Stop`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// This stop token (the last token of the sample).
    Token(u32),
    /// This stop string (cut from the text unless `include_stop_str_in_output`).
    String(String),
}

/// One generated token.
#[derive(Debug, Clone, PartialEq)]
pub struct Token {
    /// The token id.
    pub id: u32,
    /// Its log-prob under the unmodified policy (log-softmax of the raw logits).
    pub logprob: f32,
    /// The most likely tokens at this step with their raw log-probs, most
    /// likely first, when the request asked for `logprobs`.
    pub top_logprobs: Vec<(u32, f32)>,
    /// The policy version whose weights produced it.
    pub version: u64,
}

/// A finished sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Which of the request's `n` samples this is.
    pub index: usize,
    /// Generated token ids.
    pub tokens: Vec<u32>,
    /// Each token's log-prob under the unmodified policy.
    pub logprobs: Vec<f32>,
    /// Each token's top log-probs (empty lists unless asked for).
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// The policy version each token was sampled under.
    pub versions: Vec<u64>,
    /// The detokenized text, when the engine has a tokenizer.
    pub text: Option<String>,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// What stopped it, for [`FinishReason::Stop`].
    pub stop_reason: Option<StopReason>,
}

/// What one engine step did to one sample: a new token (and the text it
/// completed), and the completion when the sample ended.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleUpdate {
    /// The request.
    pub request: RequestId,
    /// Which of its samples.
    pub index: usize,
    /// The token drawn this step (`None` when the sample was aborted).
    pub token: Option<Token>,
    /// Text that became final this step (may be empty).
    pub text: String,
    /// The whole sample, when this step ended it.
    pub finished: Option<Completion>,
}
