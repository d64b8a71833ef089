//! The built-in `guess` environment: the model guesses a whole number.
//!
//! The row's integer column `secret` is the number, and the optional
//! integer columns `low` and `high` (default 1 and 100) its range. The last
//! number in each model turn (outside tool calls) is its guess; the
//! environment answers with a `user` message — "Higher." or "Lower." — and
//! ends the episode with reward 1.0 when the guess is right. A turn without
//! a whole number in the range is answered "Say a whole number between
//! {low} and {high}.". An episode that runs out of turns ends without an
//! environment reward. No tools are offered.
//!
//! A row without a usable `secret` (missing, not an integer, outside the
//! range) is an [`EnvironmentError`] naming the column.

use grpo_model::chat::ChatMessage;
use grpo_model::tools::Tool;
use grpo_reward::BoxFuture;
use serde_json::{Map, Value};

use crate::environment::{Environment, EnvironmentError, EpisodeView, Reply};

/// The `guess` environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct GuessEnvironment;

impl GuessEnvironment {
    /// The environment.
    pub fn new() -> GuessEnvironment {
        GuessEnvironment
    }
}

impl Environment for GuessEnvironment {
    fn name(&self) -> &str {
        "guess"
    }

    fn tools(&self) -> Vec<Tool> {
        Vec::new()
    }

    fn step<'a>(&'a self, episode: EpisodeView<'a>) -> BoxFuture<'a, Result<Reply, EnvironmentError>> {
        Box::pin(std::future::ready(answer(episode.row, &episode.turn.content)))
    }
}

/// The answer to a turn saying `text` for `row`.
fn answer(row: &Map<String, Value>, text: &str) -> Result<Reply, EnvironmentError> {
    let secret = column(row, "secret", None)?;
    let low = column(row, "low", Some(1))?;
    let high = column(row, "high", Some(100))?;
    if !(low..=high).contains(&secret) {
        return Err(EnvironmentError(format!(
            "column `secret` is {secret}, outside the range {low} to {high} (columns `low` and `high`)"
        )));
    }
    let say = |text: &str| {
        Ok(Reply::Continue {
            messages: vec![ChatMessage::new("user", text)],
            failed_calls: 0,
            guide: None,
        })
    };
    match last_number(text) {
        Some(Guess::Whole(guess)) if (low..=high).contains(&guess) => match guess.cmp(&secret) {
            std::cmp::Ordering::Less => say("Higher."),
            std::cmp::Ordering::Greater => say("Lower."),
            std::cmp::Ordering::Equal => Ok(Reply::Done { reward: Some(1.0) }),
        },
        _ => say(&format!("Say a whole number between {low} and {high}.")),
    }
}

/// The integer column `name` of `row`, or `default` when it is absent.
fn column(row: &Map<String, Value>, name: &str, default: Option<i64>) -> Result<i64, EnvironmentError> {
    let value = match (row.get(name), default) {
        (Some(value), _) => value,
        (None, Some(default)) => return Ok(default),
        (None, None) => {
            return Err(EnvironmentError(format!(
                "the row has no column `{name}` (the number to guess)"
            )));
        }
    };
    let whole = match value {
        Value::Number(n) => n.as_i64().or_else(|| {
            n.as_f64()
                .filter(|v| v.fract() == 0.0 && v.abs() < 9e15)
                .map(|v| v as i64)
        }),
        _ => None,
    };
    whole.ok_or_else(|| {
        let shown: String = value.to_string().chars().take(100).collect();
        EnvironmentError(format!("column `{name}` must be an integer, not {shown}"))
    })
}

/// The last number of a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Guess {
    /// A whole number that fits an `i64`.
    Whole(i64),
    /// A decimal, or an integer too long to be a guess.
    Other,
}

/// The last number written in `text` (`-` just before it, not after a
/// letter or digit, makes it negative); `None` when there is none.
fn last_number(text: &str) -> Option<Guess> {
    let bytes = text.as_bytes();
    let end = bytes.iter().rposition(u8::is_ascii_digit)? + 1;
    let mut start = end;
    while start > 0 && bytes[start - 1].is_ascii_digit() {
        start -= 1;
    }
    let digits = &text[start..end];
    let before = |i: usize| i.checked_sub(1).map(|i| bytes[i]);
    if before(start) == Some(b'.') && before(start - 1).is_some_and(|b| b.is_ascii_digit()) {
        return Some(Guess::Other);
    }
    let negative = before(start) == Some(b'-') && !before(start - 1).is_some_and(|b| b.is_ascii_alphanumeric());
    let magnitude: Option<i64> = digits.parse().ok();
    Some(magnitude.map_or(Guess::Other, |m| Guess::Whole(if negative { -m } else { m })))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn row(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn say(text: &str) -> Result<Reply, EnvironmentError> {
        Ok(Reply::Continue {
            messages: vec![ChatMessage::new("user", text)],
            failed_calls: 0,
            guide: None,
        })
    }

    #[test]
    fn answers_higher_lower_and_ends_on_the_secret() {
        let secret = row(json!({"secret": 42}));
        assert_eq!(answer(&secret, "Is it 50?"), say("Lower."));
        assert_eq!(answer(&secret, "Maybe 7, no: 20"), say("Higher."));
        assert_eq!(answer(&secret, "It is 42."), Ok(Reply::Done { reward: Some(1.0) }));
        let ask = say("Say a whole number between 1 and 100.");
        for text in ["I don't know", "42.5", "101", "-3", "99999999999999999999999"] {
            assert_eq!(answer(&secret, text), ask, "{text}");
        }
        let ranged = row(json!({"secret": -5, "low": -10, "high": 10.0}));
        assert_eq!(answer(&ranged, "-11"), say("Say a whole number between -10 and 10."));
        assert_eq!(
            answer(&ranged, "x-7"),
            say("Lower."),
            "a hyphen after a letter is no sign"
        );
        assert_eq!(answer(&ranged, "say -7"), say("Higher."));
        assert_eq!(answer(&ranged, "-5"), Ok(Reply::Done { reward: Some(1.0) }));
    }

    #[test]
    fn a_row_without_a_usable_secret_names_the_column() {
        for (columns, want) in [
            (json!({}), "no column `secret`"),
            (
                json!({"secret": "42"}),
                "column `secret` must be an integer, not \"42\"",
            ),
            (json!({"secret": 4.5}), "column `secret` must be an integer"),
            (json!({"secret": 4, "low": "a"}), "column `low` must be an integer"),
            (
                json!({"secret": 400}),
                "column `secret` is 400, outside the range 1 to 100",
            ),
        ] {
            let error = answer(&row(columns.clone()), "50").unwrap_err().0;
            assert!(error.contains(want), "{columns}: {error}");
        }
    }

    #[test]
    fn the_last_number_is_the_guess() {
        assert_eq!(last_number("no digits"), None);
        assert_eq!(last_number("first 3 then 17."), Some(Guess::Whole(17)));
        assert_eq!(last_number("3.14"), Some(Guess::Other));
        assert_eq!(last_number("-8"), Some(Guess::Whole(-8)));
        assert_eq!(last_number("5-8"), Some(Guess::Whole(8)));
    }
}
