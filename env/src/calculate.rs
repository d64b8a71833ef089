//! The built-in `calculate` tool: `{"expression": "12*(3+4)/5"}` evaluated
//! exactly by the reward crate's parser (numbers, `+ - * / ^`, parentheses;
//! no code runs). The result is an integer, a terminating decimal, or a
//! reduced fraction (`2/3`); a bad expression is an error the model reads.

use grpo_model::tools::Tool;
use grpo_reward::expr::evaluate;
use serde_json::{Map, Value, json};

use crate::toolbox::ToolFunction;

/// The `calculate` tool.
pub struct Calculate {
    spec: Tool,
}

impl Calculate {
    /// The tool, as models are offered it.
    pub fn new() -> Calculate {
        Calculate {
            spec: Tool {
                name: "calculate".to_string(),
                description: "Evaluates an arithmetic expression exactly: numbers, + - * / ^ and parentheses."
                    .to_string(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "expression": {"type": "string", "description": "for example 12*(3+4)/5"}
                    },
                    "required": ["expression"],
                }),
            },
        }
    }
}

impl Default for Calculate {
    fn default() -> Self {
        Calculate::new()
    }
}

impl ToolFunction for Calculate {
    fn spec(&self) -> &Tool {
        &self.spec
    }

    fn call(&self, arguments: &Map<String, Value>) -> Result<String, String> {
        let expression = match (arguments.get("expression"), arguments.len()) {
            (Some(Value::String(expression)), 1) => expression,
            _ => return Err("calculate takes {\"expression\": \"<arithmetic>\"} and nothing else".to_string()),
        };
        evaluate(expression)
            .map(|evaluated| evaluated.value.to_string())
            .map_err(|e| match e {
                grpo_reward::Error::Arithmetic(reason) => reason.to_string(),
                other => other.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn calculate(expression: &str) -> Result<String, String> {
        let arguments = json!({"expression": expression});
        Calculate::new().call(arguments.as_object().unwrap())
    }

    #[test]
    fn results_are_exact() {
        for (expression, want) in [
            ("1234 * 5678", "7006652"),
            ("7/8", "0.875"),
            ("-1/3", "-1/3"),
            ("2^10 - 24", "1000"),
            ("(3 + 4) * 12 / 5", "16.8"),
            ("1/3 + 2/3", "1"),
            ("0.1 + 0.2", "0.3"),
            ("-0.05", "-0.05"),
        ] {
            assert_eq!(calculate(expression).as_deref(), Ok(want), "{expression}");
        }
        assert_eq!(calculate("1/0"), Err("division by zero".to_string()));
        assert!(calculate("2 +").is_err());
        assert!(calculate("import os").is_err());
    }
}
