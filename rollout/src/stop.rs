//! Stop strings over streamed text, with vLLM's semantics: a sequence ends at
//! the first stop string its text contains, the output is cut before it
//! (after it with [`StopStrings::include_in_output`]), and while streaming, a
//! tail of the text that may still grow into a stop string is held back.
//!
//! The text grows by a few bytes a token, so [`StopStrings::find`] searches
//! only the appended bytes and, before them, one byte less than each stop
//! string's length: a stop string spanning tokens is found, in O(appended)
//! per step.
//!
//! "First" is the match that is complete first (the earliest end; at equal
//! ends, the earliest start), which is what streaming the text byte by byte
//! would find: the result does not depend on how the text was cut into tokens.

use grpo_model::text::partial_tag_len;
use thiserror::Error;

/// The stop strings of a request (none by default).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopStrings {
    strings: Vec<String>,
    include_in_output: bool,
}

/// A stop string was empty; it would match before the first token.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("stop string {index} is empty: a stop string needs at least one character")]
pub struct EmptyStopString {
    /// Its index in the list given to [`StopStrings::new`].
    pub index: usize,
}

/// Where a stop string occurs in the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopMatch {
    /// Which stop string: its index in [`StopStrings::strings`].
    pub index: usize,
    /// Byte offset of the match's start in the text.
    pub start: usize,
    /// Byte offset just past the match's end.
    pub end: usize,
    /// How many bytes of the text the output keeps: `start`, or `end` when the
    /// stop string is included in the output.
    pub output_len: usize,
}

impl StopStrings {
    /// Stops on any of `strings`, cut from the output (vLLM's default).
    pub fn new(strings: Vec<String>) -> Result<Self, EmptyStopString> {
        if let Some(index) = strings.iter().position(String::is_empty) {
            return Err(EmptyStopString { index });
        }
        Ok(StopStrings {
            strings,
            include_in_output: false,
        })
    }

    /// Keeps the matched stop string in the output if `include` (vLLM's
    /// `include_stop_str_in_output`); then nothing needs holding back.
    pub fn include_in_output(self, include: bool) -> Self {
        StopStrings {
            include_in_output: include,
            ..self
        }
    }

    /// The stop strings, in the order given.
    pub fn strings(&self) -> &[String] {
        &self.strings
    }

    /// Whether there are no stop strings.
    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }

    /// The first stop string in `text` that may end in its last `appended`
    /// bytes, if any: call it after each append, and stop at the first match
    /// (matches ending before the appended bytes may be missed).
    pub fn find(&self, text: &str, appended: usize) -> Option<StopMatch> {
        let appended_start = text.len().saturating_sub(appended);
        self.strings
            .iter()
            .enumerate()
            .filter_map(|(index, stop)| {
                let from = text.ceil_char_boundary(appended_start.saturating_sub(stop.len() - 1));
                let start = from + text[from..].find(stop.as_str())?;
                Some((index, start, start + stop.len()))
            })
            .min_by_key(|&(_, start, end)| (end, start))
            .map(|(index, start, end)| StopMatch {
                index,
                start,
                end,
                output_len: if self.include_in_output { end } else { start },
            })
    }

    /// How many leading bytes of `text` (with no stop string in it) are safe
    /// to stream: all but its longest tail that begins a stop string, since
    /// that tail would be cut if the stop string completes. Always a char
    /// boundary; all of `text` when stop strings are included in the output.
    pub fn emit_len(&self, text: &str) -> usize {
        if self.include_in_output {
            return text.len();
        }
        text.len() - partial_tag_len(text, &self.strings)
    }
}
