//! Functions with a hand-written gradient (JAX's `custom_vjp`): the forward
//! is traced into a sub-graph and emitted inline; autodiff does not look
//! inside it but calls the given VJP instead. This is how computations whose
//! forward uses loops (which have no gradient rule) get a gradient, and how
//! a backward pass can recompute instead of keep large intermediates —
//! [`rematerialized`] does that for any function (activation checkpointing).

use std::fmt;
use std::hash::{Hash, Hasher};
use std::rc::Rc;

use super::control::{optimization_barrier, trace_body};
use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::trace::emit::EmitCtx;
use crate::trace::graph::Tensor;
use crate::trace::op::{Op, Rule, VjpArgs};
use crate::trace::optimize::Body;

/// Cotangents of the inputs from (inputs, outputs, output cotangents).
pub type VjpFn = dyn Fn(&[Tensor], &[Tensor], &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>>;

/// A traced forward body and its gradient rule. Equal only to itself, so
/// two calls are never merged.
#[derive(Clone)]
pub(crate) struct CustomVjp {
    name: &'static str,
    body: Rc<Body>,
    vjp: Rc<VjpFn>,
}

impl fmt::Debug for CustomVjp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CustomVjp({})", self.name)
    }
}

impl PartialEq for CustomVjp {
    fn eq(&self, other: &Self) -> bool {
        Rc::ptr_eq(&self.body, &other.body)
    }
}

impl Eq for CustomVjp {}

impl Hash for CustomVjp {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Rc::as_ptr(&self.body).hash(state);
    }
}

/// Applies `forward` to `inputs` as one node whose gradient is `vjp`.
///
/// `forward` is traced once into a fresh graph whose parameters have the
/// inputs' types (tensors of the enclosing graph cannot be used inside);
/// `vjp(inputs, outputs, cotangents)` runs when differentiating, in the
/// enclosing graph, and returns one cotangent (or `None`) per input, of the
/// input's type.
pub fn custom_vjp(
    name: &'static str,
    inputs: &[&Tensor],
    forward: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
    vjp: impl Fn(&[Tensor], &[Tensor], &[Option<Tensor>]) -> Result<Vec<Option<Tensor>>> + 'static,
) -> Result<Vec<Tensor>> {
    let first = inputs
        .first()
        .ok_or_else(|| Error::trace(name, "a custom-gradient function needs at least one input"))?;
    let types: Vec<TensorType> = inputs.iter().map(|t| t.tensor_type().clone()).collect();
    let body = trace_body(name, format!("{}/{name}", first.graph().name()), &types, None, forward)?;
    let outputs: Vec<TensorType> = body
        .outputs
        .iter()
        .map(|id| body.nodes[id.node].outputs[id.output].clone())
        .collect();
    let op = Op::CustomVjp(CustomVjp {
        name,
        body: Rc::new(body),
        vjp: Rc::new(vjp),
    });
    first.graph().apply_multi(op, inputs, outputs)
}

impl Rule for CustomVjp {
    fn name(&self) -> &'static str {
        self.name
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.inline(&self.body)
    }

    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let cotangents = (self.vjp)(args.inputs, args.outputs, args.cotangents)?;
        if cotangents.len() != args.inputs.len() {
            return Err(Error::trace(
                self.name,
                format!(
                    "its gradient function returned {} cotangents for {} inputs",
                    cotangents.len(),
                    args.inputs.len()
                ),
            ));
        }
        Ok(cotangents)
    }
}

/// `f(inputs)`, whose intermediates are not kept for the backward pass but
/// computed again there from `inputs` (activation checkpointing, JAX's
/// `jax.checkpoint`): the backward keeps `inputs` alone.
///
/// The recomputation starts from the inputs and the output cotangents
/// passed through one [`optimization_barrier`], so the compiler neither
/// merges it with the forward's copy (which would keep every intermediate
/// again) nor runs it before the backward reaches it. Its gradient is the
/// autodiff of the recomputed `f` with respect to those fresh values alone:
/// the cotangents, which depend on the same inputs through what follows,
/// are constants to it. Inputs that are not floats get no gradient.
pub fn rematerialized(
    name: &'static str,
    inputs: &[&Tensor],
    f: impl Fn(&[Tensor]) -> Result<Vec<Tensor>> + 'static,
) -> Result<Vec<Tensor>> {
    let f = Rc::new(f);
    let again = Rc::clone(&f);
    custom_vjp(
        name,
        inputs,
        |p| f(p),
        move |inputs, _, cotangents| {
            let mut held: Vec<&Tensor> = inputs.iter().collect();
            held.extend(cotangents.iter().flatten());
            let held = optimization_barrier(&held)?;
            let (inputs, mut arrived) = (&held[..inputs.len()], held[inputs.len()..].iter());
            let outputs = again(inputs)?;
            // The vector-Jacobian product as the gradient of Σ sum(output · cotangent).
            let mut total: Option<Tensor> = None;
            for (output, cotangent) in outputs.iter().zip(cotangents) {
                if cotangent.is_none() {
                    continue;
                }
                let cotangent = arrived.next().expect("one held value per cotangent");
                let term = output
                    .mul(cotangent)?
                    .convert(crate::dtype::ElementType::F32)?
                    .sum_all()?;
                total = Some(match total {
                    Some(sum) => sum.add(&term)?,
                    None => term,
                });
            }
            let floats: Vec<&Tensor> = inputs.iter().filter(|t| t.dtype().is_float()).collect();
            let Some(total) = total else {
                return Ok(vec![None; inputs.len()]);
            };
            let mut gradients = super::super::autodiff::grad(&total, &floats)?.into_iter();
            Ok(inputs
                .iter()
                .map(|t| t.dtype().is_float().then(|| gradients.next().expect("one per float")))
                .collect())
        },
    )
}
