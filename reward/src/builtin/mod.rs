//! The built-in rewards, each with its config (a `[[reward]]` table's own
//! keys, unknown keys refused) and a `build()`.
//!
//! - [`math`]: final-answer extraction and numeric comparison with a ground truth.
//! - [`matching`]: `exact`, `contains`, `regex` and `format`.
//! - [`length`]: length penalty with DAPO overlong shaping.
//! - [`countdown`]: `countdown` and `arithmetic`, exact evaluation of expression answers.

pub mod countdown;
pub mod length;
pub mod matching;
pub mod math;

fn default_answer_column() -> String {
    "answer".into()
}
