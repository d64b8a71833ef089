//! The text of one running sample: its tokens detokenized as they come,
//! checked for stop strings, and what of it is final enough to stream.

use std::sync::Arc;

use grpo_model::tokenizer::Tokenizer;

use crate::detokenize::IncrementalDetokenizer;
use crate::error::{Error, Result};
use crate::request::SamplingParams;
use crate::stop::StopStrings;

/// A sample's text so far.
pub(crate) struct SampleText {
    detokenizer: IncrementalDetokenizer,
    stops: StopStrings,
    /// Bytes of the text already streamed.
    emitted: usize,
    /// The output's length once a stop string cut it.
    cut: Option<usize>,
}

impl SampleText {
    /// The text of a sample of `prompt` sampled with `params`.
    pub fn new(tokenizer: &Arc<Tokenizer>, prompt: &[u32], params: &SamplingParams) -> Result<SampleText> {
        let stops = StopStrings::new(params.stop.clone())
            .map_err(|e| Error::InvalidRequest { message: e.to_string() })?
            .include_in_output(params.include_stop_str_in_output);
        Ok(SampleText {
            detokenizer: IncrementalDetokenizer::new(tokenizer.clone(), prompt, params.skip_special_tokens)?,
            stops,
            emitted: 0,
            cut: None,
        })
    }

    /// Adds a token; returns the text to stream now and the stop string it
    /// completed, if any (the text then ends).
    pub fn push(&mut self, token: u32) -> Result<(String, Option<String>)> {
        let appended = self.detokenizer.push(token)?.len();
        let text = self.detokenizer.text();
        if let Some(found) = self.stops.find(text, appended) {
            self.cut = Some(found.output_len);
            let delta = text[self.emitted.min(found.output_len)..found.output_len].to_string();
            self.emitted = found.output_len;
            return Ok((delta, Some(self.stops.strings()[found.index].clone())));
        }
        let safe = self.stops.emit_len(text);
        let delta = text[self.emitted..safe].to_string();
        self.emitted = safe;
        Ok((delta, None))
    }

    /// Ends the text without a stop string: returns everything not yet streamed.
    pub fn finish(&mut self) -> Result<String> {
        self.detokenizer.finish()?;
        let text = self.detokenizer.text();
        let delta = text[self.emitted..].to_string();
        self.emitted = text.len();
        Ok(delta)
    }

    /// The whole output text (cut before a matched stop string).
    pub fn text(&self) -> String {
        let text = self.detokenizer.text();
        text[..self.cut.unwrap_or(text.len())].to_string()
    }
}
