//! The op registry: every op kind, and the one place that maps a kind to
//! its rules.
//!
//! Each family lives in one file under `ops/` with, together, its trace
//! entry (methods on [`Tensor`]), its shape/dtype rule (`infer`, pure), its
//! StableHLO emission and its vector-Jacobian product — the [`Rule`] trait.
//! Adding an op is one variant here and one rule in its family file.

use super::emit::EmitCtx;
use super::graph::Tensor;
use super::ops::constant::{Constant, Iota};
use super::ops::control::{OptimizationBarrier, RngBitGenerator, Sort, StopGradient, While};
use super::ops::custom::CustomVjp;
use super::ops::dot::DotGeneral;
use super::ops::elementwise::{Binary, Compare, Convert, Select, Unary};
use super::ops::gather::{Gather, Scatter};
use super::ops::reduce::{CumSum, Reduce};
use super::ops::shape::{
    BroadcastInDim, Concatenate, DynamicSlice, DynamicUpdateSlice, Pad, Reshape, Reverse, Slice, Transpose,
};
use crate::error::Result;

/// What a node computes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    /// The function's parameter at this index (emitted as a block argument).
    Parameter(usize),
    Constant(Constant),
    Iota(Iota),
    Unary(Unary),
    Binary(Binary),
    Compare(Compare),
    Select(Select),
    Convert(Convert),
    BroadcastInDim(BroadcastInDim),
    Reshape(Reshape),
    Transpose(Transpose),
    Slice(Slice),
    DynamicSlice(DynamicSlice),
    DynamicUpdateSlice(DynamicUpdateSlice),
    Concatenate(Concatenate),
    Pad(Pad),
    Reverse(Reverse),
    Reduce(Reduce),
    CumSum(CumSum),
    DotGeneral(DotGeneral),
    Sort(Sort),
    While(While),
    RngBitGenerator(RngBitGenerator),
    StopGradient(StopGradient),
    OptimizationBarrier(OptimizationBarrier),
    CustomVjp(CustomVjp),
    Gather(Gather),
    Scatter(Scatter),
}

/// The inputs, outputs and output cotangents of a node, for its VJP.
pub(crate) struct VjpArgs<'a> {
    /// The node's inputs.
    pub inputs: &'a [Tensor],
    /// The node's outputs (forward values, reusable by nonlinear rules).
    pub outputs: &'a [Tensor],
    /// Cotangent of each output; `None` where nothing depends on it.
    pub cotangents: &'a [Option<Tensor>],
}

impl VjpArgs<'_> {
    /// The cotangent of output `index`, zeros where there is none.
    pub fn cotangent(&self, index: usize) -> Result<Tensor> {
        match &self.cotangents[index] {
            Some(g) => Ok(g.clone()),
            None => self.outputs[index].zeros_like(),
        }
    }
}

/// The rules of one op kind.
pub(crate) trait Rule {
    /// The op's name in errors (`add`, `dot_general`, …).
    fn name(&self) -> &'static str;

    /// Writes the node as StableHLO.
    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()>;

    /// Cotangents of the inputs from those of the outputs (`None`: no
    /// gradient flows to that input). Ops that cannot be differentiated
    /// return [`crate::Error::NoGradient`].
    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>>;
}

impl Op {
    /// The rules of this kind. Parameters have none: they are block arguments.
    pub(crate) fn rule(&self) -> Option<&dyn Rule> {
        Some(match self {
            Op::Parameter(_) => return None,
            Op::Constant(r) => r,
            Op::Iota(r) => r,
            Op::Unary(r) => r,
            Op::Binary(r) => r,
            Op::Compare(r) => r,
            Op::Select(r) => r,
            Op::Convert(r) => r,
            Op::BroadcastInDim(r) => r,
            Op::Reshape(r) => r,
            Op::Transpose(r) => r,
            Op::Slice(r) => r,
            Op::DynamicSlice(r) => r,
            Op::DynamicUpdateSlice(r) => r,
            Op::Concatenate(r) => r,
            Op::Pad(r) => r,
            Op::Reverse(r) => r,
            Op::Reduce(r) => r,
            Op::CumSum(r) => r,
            Op::DotGeneral(r) => r,
            Op::Sort(r) => r,
            Op::While(r) => r,
            Op::RngBitGenerator(r) => r,
            Op::StopGradient(r) => r,
            Op::OptimizationBarrier(r) => r,
            Op::CustomVjp(r) => r,
            Op::Gather(r) => r,
            Op::Scatter(r) => r,
        })
    }

    /// The op's name in errors.
    pub(crate) fn name(&self) -> &'static str {
        self.rule().map_or("parameter", Rule::name)
    }
}
