//! A built graph: an optimized function that emits StableHLO and compiles
//! through a client's compile cache.

use super::emit::Emitter;
use super::graph::{Node, ValueId};
use super::optimize::Body;
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::pjrt::{Client, CompileOptions, Executable};

/// A traced function: parameters in, outputs out.
#[derive(Debug, Clone)]
pub struct Function {
    name: String,
    body: Body,
    /// Output index each parameter may donate its buffer to.
    donations: Vec<Option<usize>>,
}

impl Function {
    pub(crate) fn new(name: String, nodes: Vec<Node>, parameters: Vec<usize>, outputs: Vec<ValueId>) -> Function {
        let donations = vec![None; parameters.len()];
        let body = Body {
            nodes,
            parameters,
            outputs,
        }
        .optimized();
        Function { name, body, donations }
    }

    /// Lets parameter `parameter` give its buffer to output `output`
    /// (`tf.aliasing_output`): the update then happens in place.
    pub fn donate(mut self, parameter: usize, output: usize) -> Result<Function> {
        let params = self.parameter_types();
        let outputs = self.output_types();
        let fail = |message: String| Err(Error::Trace { op: "donate", message });
        let (Some(p), Some(o)) = (params.get(parameter), outputs.get(output)) else {
            return fail(format!(
                "parameter {parameter} or output {output} does not exist ({} parameters, {} outputs)",
                params.len(),
                outputs.len()
            ));
        };
        if p != o {
            return fail(format!(
                "parameter {parameter} is {p}, output {output} is {o}: types must match"
            ));
        }
        if self.donations.contains(&Some(output)) {
            return fail(format!("output {output} already receives a donated parameter"));
        }
        self.donations[parameter] = Some(output);
        Ok(self)
    }

    /// Donates parameter `i` to output `i` for every `i` in `range`.
    pub fn donate_range(self, range: std::ops::Range<usize>) -> Result<Function> {
        range.into_iter().try_fold(self, |f, i| f.donate(i, i))
    }

    /// Donates parameters `first_parameter + i` to outputs `outputs.start + i`
    /// for every output in `outputs` (state that comes in and goes out as a run).
    pub fn donate_range_from(self, first_parameter: usize, outputs: std::ops::Range<usize>) -> Result<Function> {
        let first_output = outputs.start;
        outputs
            .into_iter()
            .try_fold(self, |f, o| f.donate(first_parameter + o - first_output, o))
    }

    /// The module name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Parameter types in order.
    pub fn parameter_types(&self) -> Vec<TensorType> {
        self.body
            .parameters
            .iter()
            .map(|&p| self.body.nodes[p].outputs[0].clone())
            .collect()
    }

    /// Output types in order.
    pub fn output_types(&self) -> Vec<TensorType> {
        self.body
            .outputs
            .iter()
            .map(|id| self.body.nodes[id.node].outputs[id.output].clone())
            .collect()
    }

    /// Nodes after optimization, parameters included (for size checks).
    pub fn node_count(&self) -> usize {
        self.body.nodes.len()
    }

    /// The StableHLO module text.
    pub fn to_stablehlo(&self) -> Result<String> {
        let mut e = Emitter::new();
        let names: Vec<String> = self.body.parameters.iter().map(|_| e.fresh()).collect();
        let arguments: Vec<String> = names
            .iter()
            .zip(self.parameter_types())
            .zip(&self.donations)
            .map(|((name, ty), donation)| match donation {
                Some(output) => format!("{name}: {} {{tf.aliasing_output = {output} : i32}}", ty.mlir()),
                None => format!("{name}: {}", ty.mlir()),
            })
            .collect();
        let result_types: Vec<String> = self.output_types().iter().map(TensorType::mlir).collect();
        e.line(&format!("module @{} {{", self.name));
        let emitted = e.indented(|e| {
            e.line(&format!(
                "func.func public @main({}) -> ({}) {{",
                arguments.join(", "),
                result_types.join(", ")
            ));
            let returned = e.indented(|e| e.body(&self.body.nodes, &names, &self.body.outputs))?;
            e.indented(|e| {
                if returned.is_empty() {
                    e.line("func.return");
                } else {
                    e.line(&format!(
                        "func.return {} : {}",
                        returned.join(", "),
                        result_types.join(", ")
                    ));
                }
            });
            e.line("}");
            Ok::<(), Error>(())
        });
        emitted?;
        e.line("}");
        Ok(e.finish())
    }

    /// Compiles for the client's first device (cached by program text).
    pub fn compile(&self, client: &Client) -> Result<Executable> {
        self.compile_with(client, &CompileOptions::default())
    }

    /// Compiles with explicit options (devices, replicas).
    pub fn compile_with(&self, client: &Client, options: &CompileOptions) -> Result<Executable> {
        client.compile(&self.to_stablehlo()?, options)
    }
}
