//! Graph clean-up before emission: common-subexpression merging, then
//! dead-code elimination, so the program is no bigger than it needs to be.

use std::collections::HashMap;

use super::graph::{Node, ValueId};
use super::op::Op;
use crate::dtype::TensorType;

/// A function body: nodes in topological order, parameter nodes, outputs.
#[derive(Debug, Clone)]
pub(crate) struct Body {
    pub nodes: Vec<Node>,
    pub parameters: Vec<usize>,
    pub outputs: Vec<ValueId>,
}

impl Body {
    /// Merges nodes with the same op and inputs, drops nodes no output needs
    /// (parameters always stay: they are the signature), and renumbers.
    pub(crate) fn optimized(self) -> Body {
        merge_common(self).without_dead_code()
    }

    fn without_dead_code(self) -> Body {
        let mut live = vec![false; self.nodes.len()];
        for &p in &self.parameters {
            live[p] = true;
        }
        for output in &self.outputs {
            live[output.node] = true;
        }
        for index in (0..self.nodes.len()).rev() {
            if live[index] {
                for input in &self.nodes[index].inputs {
                    live[input.node] = true;
                }
            }
        }
        let mut renumber = vec![usize::MAX; self.nodes.len()];
        let mut nodes = Vec::new();
        for (index, node) in self.nodes.into_iter().enumerate() {
            if live[index] {
                renumber[index] = nodes.len();
                nodes.push(node);
            }
        }
        let remap = |id: &ValueId| ValueId {
            node: renumber[id.node],
            output: id.output,
        };
        for node in &mut nodes {
            node.inputs = node.inputs.iter().map(remap).collect();
        }
        Body {
            nodes,
            parameters: self.parameters.iter().map(|&p| renumber[p]).collect(),
            outputs: self.outputs.iter().map(remap).collect(),
        }
    }
}

/// Replaces every node equal to an earlier one (same op, same inputs after
/// replacement, same output types) by that earlier node. The later copy
/// becomes dead code.
fn merge_common(mut body: Body) -> Body {
    let mut first: HashMap<(Op, Vec<ValueId>, Vec<TensorType>), usize> = HashMap::new();
    let mut replacement: Vec<usize> = (0..body.nodes.len()).collect();
    for index in 0..body.nodes.len() {
        let inputs: Vec<ValueId> = body.nodes[index]
            .inputs
            .iter()
            .map(|id| ValueId {
                node: replacement[id.node],
                output: id.output,
            })
            .collect();
        body.nodes[index].inputs = inputs.clone();
        let node = &body.nodes[index];
        let key = (node.op.clone(), inputs, node.outputs.clone());
        match first.get(&key) {
            Some(&earlier) => replacement[index] = earlier,
            None => {
                first.insert(key, index);
            }
        }
    }
    body.outputs = body
        .outputs
        .iter()
        .map(|id| ValueId {
            node: replacement[id.node],
            output: id.output,
        })
        .collect();
    body
}
