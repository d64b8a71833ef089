//! The tools on offer in an episode and the answers to a turn's calls: each
//! call, well-formed or not, gets one tool turn — the tool's result, or an
//! error the model reads on its next turn (an unknown tool, a malformed
//! call, arguments the tool refuses). A call never fails the episode.

use grpo_model::tools::{ParsedTurn, Tool};
use serde_json::{Map, Value};

/// A tool a model may call.
pub trait ToolFunction: Send + Sync {
    /// Its name, description and argument schema.
    fn spec(&self) -> &Tool;
    /// The text of a call's result, or why the arguments are refused (the
    /// model reads either).
    fn call(&self, arguments: &Map<String, Value>) -> Result<String, String>;
}

/// How one call went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// The tool ran: its result.
    Done(String),
    /// The call could not be run: the message the model reads.
    Failed(String),
}

impl CallOutcome {
    /// The tool turn's text.
    pub fn text(&self) -> &str {
        match self {
            CallOutcome::Done(text) | CallOutcome::Failed(text) => text,
        }
    }

    /// Whether the call failed.
    pub fn failed(&self) -> bool {
        matches!(self, CallOutcome::Failed(_))
    }
}

/// The tools of an episode, by name.
#[derive(Default)]
pub struct Toolbox {
    tools: Vec<Box<dyn ToolFunction>>,
}

impl Toolbox {
    /// An empty toolbox.
    pub fn new() -> Toolbox {
        Toolbox::default()
    }

    /// Adds `tool`; refuses a second tool of the same name.
    pub fn with(mut self, tool: impl ToolFunction + 'static) -> Result<Toolbox, String> {
        let name = &tool.spec().name;
        if self.tools.iter().any(|t| &t.spec().name == name) {
            return Err(format!("two tools are named `{name}`"));
        }
        self.tools.push(Box::new(tool));
        Ok(self)
    }

    /// The tools' specs, in the order added (as chat templates render them).
    pub fn specs(&self) -> Vec<Tool> {
        self.tools.iter().map(|t| t.spec().clone()).collect()
    }

    /// One outcome per call of `turn`, in order: each well-formed call run
    /// by its tool, each malformed one answered with what is wrong.
    pub fn answer(&self, turn: &ParsedTurn) -> Vec<CallOutcome> {
        turn.calls
            .iter()
            .map(|call| match call {
                Err(bad) => CallOutcome::Failed(format!("error: {}", bad.reason)),
                Ok(call) => match self.tools.iter().find(|t| t.spec().name == call.name) {
                    Some(tool) => match tool.call(&call.arguments) {
                        Ok(result) => CallOutcome::Done(result),
                        Err(reason) => CallOutcome::Failed(format!("error: {reason}")),
                    },
                    None => CallOutcome::Failed(format!(
                        "error: there is no tool named `{}`; the tools are: {}",
                        call.name,
                        self.names()
                    )),
                },
            })
            .collect()
    }

    fn names(&self) -> String {
        let names: Vec<&str> = self.tools.iter().map(|t| t.spec().name.as_str()).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    }
}

#[cfg(test)]
mod tests {
    use grpo_model::tools::{ToolCallFormat, parse_tool_calls};
    use serde_json::json;

    use super::*;
    use crate::calculate::Calculate;

    #[test]
    fn every_call_gets_a_result_or_an_error_the_model_reads() {
        let toolbox = Toolbox::new().with(Calculate::new()).unwrap();
        let text = concat!(
            "<tool_call>{\"name\": \"calculate\", \"arguments\": {\"expression\": \"1234*5678\"}}</tool_call>",
            "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": \"x\"}}</tool_call>",
            "<tool_call>{\"name\": \"calculate\", \"arguments\": {\"expression\": \"1/0\"}}</tool_call>",
            "<tool_call>{\"name\": \"calculate\", \"arguments\": {\"expr\": \"1\"}}</tool_call>",
            "<tool_call>{\"name\": \"calculate\", \"arguments\": 7}</tool_call>",
        );
        let outcomes = toolbox.answer(&parse_tool_calls(text, ToolCallFormat::Hermes));
        let texts: Vec<&str> = outcomes.iter().map(CallOutcome::text).collect();
        assert_eq!(texts[0], "7006652");
        assert_eq!(
            texts[1],
            "error: there is no tool named `search`; the tools are: calculate"
        );
        assert_eq!(texts[2], "error: division by zero");
        assert!(
            texts[3].starts_with("error: calculate takes {\"expression\""),
            "{}",
            texts[3]
        );
        assert_eq!(texts[4], "error: the call's \"arguments\" is not a JSON object");
        let failed: Vec<bool> = outcomes.iter().map(CallOutcome::failed).collect();
        assert_eq!(failed, [false, true, true, true, true]);
        assert_eq!(toolbox.specs()[0].to_json()["function"]["name"], json!("calculate"));
        assert!(
            Toolbox::new()
                .with(Calculate::new())
                .unwrap()
                .with(Calculate::new())
                .is_err()
        );
    }
}
