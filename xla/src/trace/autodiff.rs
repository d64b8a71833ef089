//! Reverse-mode differentiation: the backward pass is traced into the same
//! graph, from each op's vector-Jacobian product.
//!
//! Walks the nodes between the chosen inputs and the loss in reverse
//! (node ids are a topological order), sums the cotangents reaching each
//! value, and asks each node's rule for its inputs' cotangents.

use std::collections::HashMap;

use super::graph::{Tensor, ValueId};
use super::op::{Op, VjpArgs};
use crate::error::{Error, Result};

/// Gradients of the scalar float `loss` with respect to each of `wrt`.
pub fn grad(loss: &Tensor, wrt: &[&Tensor]) -> Result<Vec<Tensor>> {
    if loss.rank() != 0 || !loss.dtype().is_float() {
        return Err(Error::Trace {
            op: "grad",
            message: format!("the loss must be a float scalar, got {}", loss.tensor_type()),
        });
    }
    for x in wrt {
        loss.same_graph(x, "grad")?;
    }
    let graph = loss.graph().clone();
    let nodes = graph.data.borrow().nodes[..=loss.id.node].to_vec();

    // Which nodes lie on a path from some `wrt` value.
    let mut depends = vec![false; nodes.len()];
    let sources: Vec<ValueId> = wrt.iter().map(|t| t.id).filter(|id| id.node <= loss.id.node).collect();
    for id in &sources {
        depends[id.node] = true;
    }
    // `stop_gradient` cuts the path, so ops beyond it need no gradient rule.
    for (index, node) in nodes.iter().enumerate() {
        if !matches!(node.op, Op::StopGradient(_)) && node.inputs.iter().any(|input| depends[input.node]) {
            depends[index] = true;
        }
    }

    let mut cotangents: HashMap<ValueId, Tensor> = HashMap::new();
    cotangents.insert(loss.id, loss.ones_like()?);
    for index in (0..nodes.len()).rev() {
        let node = &nodes[index];
        if !depends[index] || node.op.rule().is_none() {
            continue;
        }
        let output_cotangents: Vec<Option<Tensor>> = (0..node.outputs.len())
            .map(|output| cotangents.remove(&ValueId { node: index, output }))
            .collect();
        if output_cotangents.iter().all(Option::is_none) {
            continue;
        }
        let inputs: Vec<Tensor> = node.inputs.iter().map(|&id| graph.tensor(id)).collect();
        let outputs: Vec<Tensor> = (0..node.outputs.len())
            .map(|output| graph.tensor(ValueId { node: index, output }))
            .collect();
        let rule = node.op.rule().expect("checked above");
        let input_cotangents = rule.vjp(&VjpArgs {
            inputs: &inputs,
            outputs: &outputs,
            cotangents: &output_cotangents,
        })?;
        for ((id, input), cotangent) in node.inputs.iter().zip(&inputs).zip(input_cotangents) {
            let Some(cotangent) = cotangent else { continue };
            if !depends[id.node] {
                continue;
            }
            if cotangent.tensor_type() != input.tensor_type() {
                return Err(Error::Trace {
                    op: rule.name(),
                    message: format!(
                        "its gradient rule gave {} for an input of {}",
                        cotangent.tensor_type(),
                        input.tensor_type()
                    ),
                });
            }
            let sum = match cotangents.remove(id) {
                Some(earlier) => earlier.add(&cotangent)?,
                None => cotangent,
            };
            cotangents.insert(*id, sum);
        }
        // Outputs that are themselves sources keep their cotangent for the result.
        for (output, cotangent) in output_cotangents.into_iter().enumerate() {
            let id = ValueId { node: index, output };
            if let (Some(cotangent), true) = (cotangent, sources.contains(&id)) {
                cotangents.entry(id).or_insert(cotangent);
            }
        }
    }
    wrt.iter()
        .map(|x| match cotangents.get(&x.id) {
            Some(g) => Ok(g.clone()),
            None => x.zeros_like(),
        })
        .collect()
}

/// The loss and its gradients with respect to `wrt`.
pub fn value_and_grad(loss: &Tensor, wrt: &[&Tensor]) -> Result<(Tensor, Vec<Tensor>)> {
    Ok((loss.clone(), grad(loss, wrt)?))
}
