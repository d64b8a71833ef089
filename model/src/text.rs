//! Text that arrives in pieces: how much of it a reader must hold back
//! while a tag (a stop string, a tool-call tag) may still be completing.

/// Bytes at the end of `text` that are a proper prefix of one of `tags`
/// (the longest such tail; 0 when there is none). What precedes it is a
/// char boundary.
pub fn partial_tag_len<S: AsRef<str>>(text: &str, tags: &[S]) -> usize {
    let longest = tags.iter().map(|t| t.as_ref().len()).max().unwrap_or(0);
    let from = text.len().saturating_sub(longest.saturating_sub(1));
    (from..text.len())
        .filter(|&at| text.is_char_boundary(at))
        .find(|&at| tags.iter().any(|tag| tag.as_ref().starts_with(&text[at..])))
        .map_or(0, |at| text.len() - at)
}

#[cfg(test)]
mod tests {
    use super::partial_tag_len;

    #[test]
    fn the_longest_tail_that_begins_a_tag_is_held_back() {
        assert_eq!(partial_tag_len("abc <tool", &["<tool_call>"]), 5);
        assert_eq!(partial_tag_len("abc <", &["<tool_call>", "STOP"]), 1);
        assert_eq!(partial_tag_len("abc ST", &["<tool_call>", "STOP"]), 2);
        assert_eq!(partial_tag_len("abc", &["<tool_call>"]), 0);
        assert_eq!(
            partial_tag_len("<tool_call>", &["<tool_call>"]),
            0,
            "a whole tag is not partial"
        );
        assert_eq!(partial_tag_len("é", &["é!"]), 2, "whole characters only");
        assert_eq!(partial_tag_len("x", &[] as &[&str]), 0);
    }
}
