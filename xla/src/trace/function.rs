//! A built graph: an optimized function that emits StableHLO and compiles
//! through a client's compile cache.
//!
//! A function may be laid out over several devices ([`Function::sharded`]):
//! its parameters and outputs then carry `mhlo.sharding` annotations, it
//! compiles into one SPMD partition per device, and XLA's partitioner
//! inserts the collectives the layout needs.

use super::emit::Emitter;
use super::graph::{Node, ValueId};
use super::optimize::Body;
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::pjrt::{Client, CompileOptions, Executable};
use crate::sharding::Sharding;

/// A traced function: parameters in, outputs out.
#[derive(Debug, Clone)]
pub struct Function {
    name: String,
    body: Body,
    /// Output index each parameter may donate its buffer to.
    donations: Vec<Option<usize>>,
    /// The layout over devices, when the function is partitioned.
    shardings: Option<Shardings>,
}

/// How a function's parameters and outputs are laid out over its devices.
#[derive(Debug, Clone)]
struct Shardings {
    devices: usize,
    parameters: Vec<Sharding>,
    outputs: Vec<Sharding>,
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
        Function {
            name,
            body,
            donations,
            shardings: None,
        }
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
        self.check_donation_layout(parameter, output)?;
        self.donations[parameter] = Some(output);
        Ok(self)
    }

    /// Lays the function out over `devices` devices for XLA's SPMD
    /// partitioner: parameter `i` as `parameters[i]`, output `j` as
    /// `outputs[j]`. Each device then receives and returns its shards, and
    /// [`Function::compile`] compiles one partition per device.
    pub fn sharded(mut self, devices: usize, parameters: Vec<Sharding>, outputs: Vec<Sharding>) -> Result<Function> {
        let (param_types, output_types) = (self.parameter_types(), self.output_types());
        if devices == 0 || parameters.len() != param_types.len() || outputs.len() != output_types.len() {
            return Err(Error::Trace {
                op: "sharded",
                message: format!(
                    "needs at least one device and a sharding per parameter ({}) and output ({}), got {devices} devices, {} and {}",
                    param_types.len(),
                    output_types.len(),
                    parameters.len(),
                    outputs.len()
                ),
            });
        }
        let check = |kind: &str, shardings: &[Sharding], types: &[TensorType]| -> Result<()> {
            for (i, (sharding, ty)) in shardings.iter().zip(types).enumerate() {
                sharding.shard_type_of(&format!("{kind} {i} of `{}`", self.name), ty, devices)?;
            }
            Ok(())
        };
        check("parameter", &parameters, &param_types)?;
        check("output", &outputs, &output_types)?;
        self.shardings = Some(Shardings {
            devices,
            parameters,
            outputs,
        });
        for (parameter, output) in self.donations.clone().into_iter().enumerate() {
            if let Some(output) = output {
                self.check_donation_layout(parameter, output)?;
            }
        }
        Ok(self)
    }

    /// A donated parameter and its output must be laid out alike, so that
    /// each device's shard can become its output shard.
    fn check_donation_layout(&self, parameter: usize, output: usize) -> Result<()> {
        let Some(layout) = &self.shardings else {
            return Ok(());
        };
        let (p, o) = (&layout.parameters[parameter], &layout.outputs[output]);
        if p == o {
            return Ok(());
        }
        let ty = self.parameter_types().swap_remove(parameter);
        Err(Error::Sharding {
            what: format!("parameter {parameter} of `{}`", self.name),
            sharding: p.to_hlo(ty.dims.len()),
            ty,
            message: format!("it is donated to output {output}, which is {o}: both must be laid out alike"),
        })
    }

    /// Devices the function is partitioned over (1 when it is not sharded).
    pub fn partitions(&self) -> usize {
        self.shardings.as_ref().map_or(1, |s| s.devices)
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
        let layout = self.shardings.as_ref();
        let arguments: Vec<String> = names
            .iter()
            .zip(self.parameter_types())
            .enumerate()
            .map(|(i, (name, ty))| {
                let mut attributes = Vec::new();
                if let Some(output) = self.donations[i] {
                    attributes.push(format!("tf.aliasing_output = {output} : i32"));
                }
                if let Some(layout) = layout {
                    attributes.push(sharding_attribute(&layout.parameters[i], &ty));
                }
                with_attributes(format!("{name}: {}", ty.mlir()), &attributes)
            })
            .collect();
        let output_types = self.output_types();
        let result_types: Vec<String> = output_types.iter().map(TensorType::mlir).collect();
        let results: Vec<String> = match layout {
            None => result_types.clone(),
            Some(layout) => output_types
                .iter()
                .zip(&layout.outputs)
                .map(|(ty, sharding)| with_attributes(ty.mlir(), &[sharding_attribute(sharding, ty)]))
                .collect(),
        };
        e.line(&format!("module @{} {{", self.name));
        let emitted = e.indented(|e| {
            e.line(&format!(
                "func.func public @main({}) -> ({}) {{",
                arguments.join(", "),
                results.join(", ")
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

    /// Compiles for the client's first device, or a sharded function for
    /// its first [`Function::partitions`] devices (cached by program text).
    pub fn compile(&self, client: &Client) -> Result<Executable> {
        let Some(layout) = &self.shardings else {
            return self.compile_with(client, &CompileOptions::default());
        };
        let devices = client.devices().get(..layout.devices).ok_or_else(|| {
            Error::CompileOptions(format!(
                "function `{}` is sharded over {} devices, the client has {}",
                self.name,
                layout.devices,
                client.devices().len()
            ))
        })?;
        self.compile_with(client, &CompileOptions::partitioned(devices))
    }

    /// Compiles with explicit options (devices, replicas); a sharded
    /// function needs one replica of [`Function::partitions`] partitions.
    pub fn compile_with(&self, client: &Client, options: &CompileOptions) -> Result<Executable> {
        let partitions = self.partitions();
        if self.shardings.is_some() && (options.num_replicas, options.num_partitions) != (1, partitions) {
            return Err(Error::CompileOptions(format!(
                "function `{}` is sharded over {partitions} devices: compile it as 1 replica × {partitions} partitions (CompileOptions::partitioned), not {} × {}",
                self.name, options.num_replicas, options.num_partitions
            )));
        }
        client.compile(&self.to_stablehlo()?, options)
    }
}

/// `mhlo.sharding = "{devices=[4,1]<=[4]}"` for a tensor of type `ty`.
fn sharding_attribute(sharding: &Sharding, ty: &TensorType) -> String {
    format!("mhlo.sharding = \"{}\"", sharding.to_hlo(ty.dims.len()))
}

/// `text {a, b}`, or `text` without attributes.
fn with_attributes(text: String, attributes: &[String]) -> String {
    if attributes.is_empty() {
        text
    } else {
        format!("{text} {{{}}}", attributes.join(", "))
    }
}
