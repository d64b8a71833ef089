//! The tracing graph: a [`Graph`] records ops applied to symbolic
//! [`Tensor`]s; [`Graph::build`] freezes it into a [`Function`].
//!
//! Nodes are appended in order, so node ids are a topological order. Every
//! op checks shapes and dtypes when it is added (see each op family's
//! `infer`), so a wrong program is an error naming the op before any text
//! exists. A tensor may only be used in the graph that made it, and a built
//! graph takes no more ops.

use std::cell::RefCell;
use std::rc::Rc;

use super::function::Function;
use super::op::Op;
use crate::dtype::{ElementType, TensorType};
use crate::error::{Error, Result};

/// One value of the graph: output `output` of node `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ValueId {
    pub node: usize,
    pub output: usize,
}

/// An op applied to inputs, with its output types.
#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<TensorType>,
}

#[derive(Debug)]
pub(crate) struct GraphData {
    pub name: String,
    pub nodes: Vec<Node>,
    /// Parameter node ids, in parameter order.
    pub parameters: Vec<usize>,
    pub finished: bool,
}

/// A graph under construction. Cheap to clone (shared handle).
#[derive(Debug, Clone)]
pub struct Graph {
    pub(crate) data: Rc<RefCell<GraphData>>,
}

/// A symbolic value of a [`Graph`]: its type is known, its data is not.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub(crate) graph: Graph,
    pub(crate) id: ValueId,
    pub(crate) ty: TensorType,
}

impl Graph {
    /// An empty graph; `name` becomes the module name.
    pub fn new(name: &str) -> Graph {
        Graph {
            data: Rc::new(RefCell::new(GraphData {
                name: name.to_string(),
                nodes: Vec::new(),
                parameters: Vec::new(),
                finished: false,
            })),
        }
    }

    /// Adds the next parameter of the function.
    pub fn parameter(&self, dtype: ElementType, dims: &[i64]) -> Result<Tensor> {
        if let Some(&bad) = dims.iter().find(|&&d| d < 0) {
            return Err(Error::Trace {
                op: "parameter",
                message: format!("dimension {bad} in {dims:?} is negative"),
            });
        }
        let index = self.data.borrow().parameters.len();
        let tensor = self
            .push(Op::Parameter(index), Vec::new(), vec![TensorType::new(dtype, dims)])?
            .0
            .remove(0);
        self.data.borrow_mut().parameters.push(tensor.id.node);
        Ok(tensor)
    }

    /// Parameters added so far.
    pub fn parameter_count(&self) -> usize {
        self.data.borrow().parameters.len()
    }

    /// The module name.
    pub fn name(&self) -> String {
        self.data.borrow().name.clone()
    }

    /// Freezes the graph into a function returning `outputs`.
    pub fn build(&self, outputs: &[&Tensor]) -> Result<Function> {
        for output in outputs {
            self.check_own(output, "return")?;
        }
        let mut data = self.data.borrow_mut();
        if data.finished {
            return Err(finished_error("return"));
        }
        data.finished = true;
        Ok(Function::new(
            data.name.clone(),
            data.nodes.clone(),
            data.parameters.clone(),
            outputs.iter().map(|t| t.id).collect(),
        ))
    }

    /// Appends a node whose inputs were checked to belong to this graph;
    /// returns one tensor per output.
    pub(crate) fn push(&self, op: Op, inputs: Vec<ValueId>, outputs: Vec<TensorType>) -> Result<Multi> {
        let mut data = self.data.borrow_mut();
        if data.finished {
            return Err(finished_error(op.name()));
        }
        let node = data.nodes.len();
        data.nodes.push(Node {
            op,
            inputs,
            outputs: outputs.clone(),
        });
        Ok(Multi(
            outputs
                .into_iter()
                .enumerate()
                .map(|(output, ty)| Tensor {
                    graph: self.clone(),
                    id: ValueId { node, output },
                    ty,
                })
                .collect(),
        ))
    }

    /// Adds a single-output op over `inputs` (all from this graph).
    pub(crate) fn apply(&self, op: Op, inputs: &[&Tensor], output: TensorType) -> Result<Tensor> {
        for input in inputs {
            self.check_own(input, op.name())?;
        }
        let ids = inputs.iter().map(|t| t.id).collect();
        Ok(self.push(op, ids, vec![output])?.0.remove(0))
    }

    /// Adds a multi-output op over `inputs` (all from this graph).
    pub(crate) fn apply_multi(&self, op: Op, inputs: &[&Tensor], outputs: Vec<TensorType>) -> Result<Vec<Tensor>> {
        for input in inputs {
            self.check_own(input, op.name())?;
        }
        let ids = inputs.iter().map(|t| t.id).collect();
        Ok(self.push(op, ids, outputs)?.0)
    }

    pub(crate) fn check_own(&self, tensor: &Tensor, op: &'static str) -> Result<()> {
        if Rc::ptr_eq(&self.data, &tensor.graph.data) {
            Ok(())
        } else {
            Err(Error::Trace {
                op,
                message: format!(
                    "a tensor of graph `{}` was used in graph `{}`; pass it in as a parameter instead",
                    tensor.graph.name(),
                    self.name()
                ),
            })
        }
    }

    /// The tensor for a value id of this graph.
    pub(crate) fn tensor(&self, id: ValueId) -> Tensor {
        let ty = self.data.borrow().nodes[id.node].outputs[id.output].clone();
        Tensor {
            graph: self.clone(),
            id,
            ty,
        }
    }
}

/// The outputs of one node.
pub(crate) struct Multi(pub Vec<Tensor>);

impl IntoIterator for Multi {
    type Item = Tensor;
    type IntoIter = std::vec::IntoIter<Tensor>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

fn finished_error(op: &'static str) -> Error {
    Error::Trace {
        op,
        message: "the graph was already built; start a new Graph".to_string(),
    }
}

impl Tensor {
    /// The element type and dimensions.
    pub fn tensor_type(&self) -> &TensorType {
        &self.ty
    }

    /// The element type.
    pub fn dtype(&self) -> ElementType {
        self.ty.dtype
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[i64] {
        &self.ty.dims
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.ty.dims.len()
    }

    /// The graph this tensor belongs to.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// Checks that `other` belongs to the same graph (for ops over several tensors).
    pub(crate) fn same_graph(&self, other: &Tensor, op: &'static str) -> Result<()> {
        self.graph.check_own(other, op)
    }
}
