//! StableHLO text emission in the generic op syntax, which the pinned plugin
//! parses for every op: `%r = "stablehlo.add"(%a, %b) : (t, t) -> t`.
//!
//! Every op emits through [`EmitCtx::generic`] (one emit signature); regions
//! (reducers, comparators, loop bodies) are emitted by the same code as the
//! top-level body, into a nested block.

use std::collections::HashMap;

use super::graph::{Node, ValueId};
use super::op::Op;
use crate::dtype::{ElementType, TensorType};
use crate::error::{Error, Result};

/// Writes one function's text; value names are unique across regions.
pub(crate) struct Emitter {
    text: String,
    next: usize,
    indent: usize,
}

impl Emitter {
    pub(crate) fn new() -> Emitter {
        Emitter {
            text: String::new(),
            next: 0,
            indent: 0,
        }
    }

    pub(crate) fn finish(self) -> String {
        self.text
    }

    pub(crate) fn fresh(&mut self) -> String {
        let name = format!("%v{}", self.next);
        self.next += 1;
        name
    }

    pub(crate) fn line(&mut self, line: &str) {
        for _ in 0..self.indent {
            self.text.push_str("  ");
        }
        self.text.push_str(line);
        self.text.push('\n');
    }

    pub(crate) fn indented<T>(&mut self, f: impl FnOnce(&mut Emitter) -> T) -> T {
        self.indent += 1;
        let out = f(self);
        self.indent -= 1;
        out
    }

    /// Emits `nodes` with parameter `i` named `parameters[i]`; returns the
    /// names of `outputs`.
    pub(crate) fn body(&mut self, nodes: &[Node], parameters: &[String], outputs: &[ValueId]) -> Result<Vec<String>> {
        let mut names: HashMap<ValueId, String> = HashMap::new();
        for (index, node) in nodes.iter().enumerate() {
            let rule = match &node.op {
                Op::Parameter(i) => {
                    names.insert(ValueId { node: index, output: 0 }, parameters[*i].clone());
                    continue;
                }
                op => op.rule().expect("non-parameter ops have rules"),
            };
            let operands = node.inputs.iter().map(|id| names[id].clone()).collect();
            let operand_types = node
                .inputs
                .iter()
                .map(|id| nodes[id.node].outputs[id.output].clone())
                .collect();
            let result = self.fresh();
            let mut ctx = EmitCtx {
                e: self,
                operands,
                operand_types,
                results: node.outputs.clone(),
                result: result.clone(),
                aliases: None,
            };
            rule.emit(&mut ctx)?;
            let aliases = ctx.aliases.take();
            for output in 0..node.outputs.len() {
                let name = match (&aliases, node.outputs.len()) {
                    (Some(aliases), _) => aliases[output].clone(),
                    (None, 1) => result.clone(),
                    (None, _) => format!("{result}#{output}"),
                };
                names.insert(ValueId { node: index, output }, name);
            }
        }
        Ok(outputs.iter().map(|id| names[id].clone()).collect())
    }

    /// A region `{ ^bb0(args): body; "stablehlo.return"(outputs) }` as text.
    pub(crate) fn region(&mut self, nodes: &[Node], parameters: &[usize], outputs: &[ValueId]) -> Result<String> {
        let saved = std::mem::take(&mut self.text);
        let saved_indent = std::mem::replace(&mut self.indent, 0);
        let names: Vec<String> = parameters.iter().map(|_| self.fresh()).collect();
        let args: Vec<String> = names
            .iter()
            .zip(parameters)
            .map(|(name, &node)| format!("{name}: {}", nodes[node].outputs[0].mlir()))
            .collect();
        self.line(&format!("^bb0({}):", args.join(", ")));
        let result = self.indented(|e| {
            let returned = e.body(nodes, &names, outputs)?;
            let types: Vec<String> = outputs
                .iter()
                .map(|id| nodes[id.node].outputs[id.output].mlir())
                .collect();
            e.line(&format!(
                "\"stablehlo.return\"({}) : ({}) -> ()",
                returned.join(", "),
                types.join(", ")
            ));
            Ok::<(), Error>(())
        });
        let body = std::mem::replace(&mut self.text, saved);
        self.indent = saved_indent;
        result?;
        Ok(format!("{{\n{body}}}"))
    }

    /// A two-argument scalar region applying `op` (a reducer).
    pub(crate) fn reducer_region(&mut self, op: &str, dtype: ElementType) -> String {
        let scalar = TensorType::new(dtype, []).mlir();
        let (a, b, c) = (self.fresh(), self.fresh(), self.fresh());
        format!(
            "{{\n^bb0({a}: {scalar}, {b}: {scalar}):\n  {c} = \"{op}\"({a}, {b}) : ({scalar}, {scalar}) -> {scalar}\n  \"stablehlo.return\"({c}) : ({scalar}) -> ()\n}}"
        )
    }

    /// A region of two `dtype` scalars returning the second (a scatter that overwrites).
    pub(crate) fn second_argument_region(&mut self, dtype: ElementType) -> String {
        let scalar = TensorType::new(dtype, []).mlir();
        let (a, b) = (self.fresh(), self.fresh());
        format!("{{\n^bb0({a}: {scalar}, {b}: {scalar}):\n  \"stablehlo.return\"({b}) : ({scalar}) -> ()\n}}")
    }
}

/// One node being emitted: its operand names and types, its result types.
pub(crate) struct EmitCtx<'a> {
    /// The function's emitter (for fresh names and regions).
    pub e: &'a mut Emitter,
    /// Operand value names.
    pub operands: Vec<String>,
    /// Operand types.
    pub operand_types: Vec<TensorType>,
    /// Result types.
    pub results: Vec<TensorType>,
    result: String,
    aliases: Option<Vec<String>>,
}

impl EmitCtx<'_> {
    /// Writes `results = "op"(operands) (regions) {attributes} : (types) -> types`.
    pub fn generic(&mut self, op: &str, attributes: &str, regions: &[String]) {
        let results = if self.results.len() == 1 {
            self.result.clone()
        } else {
            format!("{}:{}", self.result, self.results.len())
        };
        let mut line = format!("{results} = \"{op}\"({})", self.operands.join(", "));
        if !regions.is_empty() {
            line.push_str(&format!(" ({})", regions.join(", ")));
        }
        if !attributes.is_empty() {
            line.push_str(&format!(" {{{attributes}}}"));
        }
        let operand_types: Vec<String> = self.operand_types.iter().map(TensorType::mlir).collect();
        let result_types: Vec<String> = self.results.iter().map(TensorType::mlir).collect();
        let result_types = if result_types.len() == 1 {
            result_types[0].clone()
        } else {
            format!("({})", result_types.join(", "))
        };
        line.push_str(&format!(" : ({}) -> {result_types}", operand_types.join(", ")));
        for (i, piece) in line.split('\n').enumerate() {
            if i == 0 {
                self.e.line(piece);
            } else {
                self.e.indented(|e| e.line(piece));
            }
        }
    }

    /// Emits nothing: the node's single result is operand `index` itself.
    pub fn alias_operand(&mut self, index: usize) {
        self.aliases = Some(vec![self.operands[index].clone()]);
    }

    /// Emits `body` inline with the node's operands as its parameters; the
    /// node's results are the body's outputs (a call without a function).
    pub fn inline(&mut self, body: &super::optimize::Body) -> Result<()> {
        let outputs = self.e.body(&body.nodes, &self.operands, &body.outputs)?;
        self.aliases = Some(outputs);
        Ok(())
    }
}

/// `array<i64: 1, 2>`.
pub(crate) fn i64_array(values: &[i64]) -> String {
    let list: Vec<String> = values.iter().map(i64::to_string).collect();
    if list.is_empty() {
        "array<i64>".to_string()
    } else {
        format!("array<i64: {}>", list.join(", "))
    }
}

/// `[1, 2]`.
pub(crate) fn i64_list(values: &[i64]) -> String {
    let list: Vec<String> = values.iter().map(i64::to_string).collect();
    format!("[{}]", list.join(", "))
}
