//! Functional optimizers traced into the program: pure
//! `update(params, grads, state, lr) -> (params', state')`, with PyTorch's
//! defaults and formulas, and global gradient-norm clipping.
//!
//! The learning rate is a run-time scalar input, so a schedule never
//! recompiles. State is a flat list of tensors with stable names
//! ([`Optimizer::state_spec`]), so it can be donated, saved and restored.

use super::graph::Tensor;
use crate::dtype::{ElementType, TensorType};
use crate::error::{Error, Result};

/// An optimizer whose step is part of a traced program.
pub trait Optimizer {
    /// Name and type of each state tensor for parameters of `params` types,
    /// in the order [`Optimizer::update`] takes and returns them. All start at zero.
    fn state_spec(&self, params: &[TensorType]) -> Vec<(String, TensorType)>;

    /// One step: new parameters and new state.
    fn update(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        state: &[Tensor],
        lr: &Tensor,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)>;
}

/// AdamW (Loshchilov & Hutter), as `torch.optim.AdamW`:
///
/// ```text
/// p ← p − lr·λ·p
/// m ← β₁m + (1−β₁)g          v ← β₂v + (1−β₂)g²          t ← t + 1
/// p ← p − (lr / (1−β₁ᵗ)) · m / (√v / √(1−β₂ᵗ) + ε)
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamW {
    /// β₁, the decay of the first moment. Default 0.9.
    pub beta1: f64,
    /// β₂, the decay of the second moment. Default 0.999.
    pub beta2: f64,
    /// ε added to the denominator. Default 1e-8.
    pub eps: f64,
    /// λ, the decoupled weight decay. Default 0.01.
    pub weight_decay: f64,
}

impl Default for AdamW {
    fn default() -> Self {
        AdamW {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

/// The state of [`AdamW`]: `[step, m₀ … mₙ₋₁, v₀ … vₙ₋₁]` when flattened.
#[derive(Debug, Clone)]
pub struct AdamWState<T> {
    /// Steps taken, as an f32 scalar.
    pub step: T,
    /// First moments, one per parameter.
    pub m: Vec<T>,
    /// Second moments, one per parameter.
    pub v: Vec<T>,
}

impl<T: Clone> AdamWState<T> {
    /// Splits a flat state list of `2n + 1` tensors.
    pub fn from_flat(state: &[T]) -> Result<AdamWState<T>> {
        if state.len().is_multiple_of(2) {
            return Err(Error::Trace {
                op: "adamw",
                message: format!("a state of {} tensors is not [step, m…, v…]", state.len()),
            });
        }
        let n = (state.len() - 1) / 2;
        Ok(AdamWState {
            step: state[0].clone(),
            m: state[1..=n].to_vec(),
            v: state[n + 1..].to_vec(),
        })
    }

    /// The flat list `[step, m…, v…]`.
    pub fn into_flat(self) -> Vec<T> {
        let mut flat = vec![self.step];
        flat.extend(self.m);
        flat.extend(self.v);
        flat
    }
}

impl Optimizer for AdamW {
    fn state_spec(&self, params: &[TensorType]) -> Vec<(String, TensorType)> {
        let mut spec = vec![("step".to_string(), TensorType::new(ElementType::F32, []))];
        spec.extend(params.iter().enumerate().map(|(i, p)| (format!("m.{i}"), p.clone())));
        spec.extend(params.iter().enumerate().map(|(i, p)| (format!("v.{i}"), p.clone())));
        spec
    }

    fn update(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        state: &[Tensor],
        lr: &Tensor,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        check_lengths("adamw", params, grads)?;
        let state = AdamWState::from_flat(state)?;
        let step = state.step.add_scalar(1.0)?;
        let bias1 = step.scalar_like(self.beta1)?.pow(&step)?.neg()?.add_scalar(1.0)?;
        let bias2 = step.scalar_like(self.beta2)?.pow(&step)?.neg()?.add_scalar(1.0)?;
        let mut new_params = Vec::with_capacity(params.len());
        let mut new_m = Vec::with_capacity(params.len());
        let mut new_v = Vec::with_capacity(params.len());
        for (((p, g), m), v) in params.iter().zip(grads).zip(&state.m).zip(&state.v) {
            let dtype = p.dtype();
            let lr = lr.convert(dtype)?;
            let decayed = p.sub(&p.mul(&lr.mul_scalar(self.weight_decay)?)?)?;
            let m = m.mul_scalar(self.beta1)?.add(&g.mul_scalar(1.0 - self.beta1)?)?;
            let v = v
                .mul_scalar(self.beta2)?
                .add(&g.square()?.mul_scalar(1.0 - self.beta2)?)?;
            let step_size = lr.div(&bias1.convert(dtype)?)?;
            let denom = v.sqrt()?.div(&bias2.convert(dtype)?.sqrt()?)?.add_scalar(self.eps)?;
            new_params.push(decayed.sub(&m.div(&denom)?.mul(&step_size)?)?);
            new_m.push(m);
            new_v.push(v);
        }
        let state = AdamWState {
            step,
            m: new_m,
            v: new_v,
        };
        Ok((new_params, state.into_flat()))
    }
}

/// Stochastic gradient descent, as `torch.optim.SGD`:
/// `b ← μb + (g + λp)` (no buffer when μ = 0), `p ← p − lr·b`.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sgd {
    /// μ, the momentum. Default 0 (plain SGD, no state).
    pub momentum: f64,
    /// λ, L2 weight decay added to the gradient. Default 0.
    pub weight_decay: f64,
}

impl Optimizer for Sgd {
    fn state_spec(&self, params: &[TensorType]) -> Vec<(String, TensorType)> {
        if self.momentum == 0.0 {
            return Vec::new();
        }
        params
            .iter()
            .enumerate()
            .map(|(i, p)| (format!("momentum.{i}"), p.clone()))
            .collect()
    }

    fn update(
        &self,
        params: &[Tensor],
        grads: &[Tensor],
        state: &[Tensor],
        lr: &Tensor,
    ) -> Result<(Vec<Tensor>, Vec<Tensor>)> {
        check_lengths("sgd", params, grads)?;
        let mut new_params = Vec::with_capacity(params.len());
        let mut new_state = Vec::with_capacity(state.len());
        for (i, (p, g)) in params.iter().zip(grads).enumerate() {
            let mut direction = g.add(&p.mul_scalar(self.weight_decay)?)?;
            if self.momentum != 0.0 {
                direction = state[i].mul_scalar(self.momentum)?.add(&direction)?;
                new_state.push(direction.clone());
            }
            new_params.push(p.sub(&direction.mul(&lr.convert(p.dtype())?)?)?);
        }
        Ok((new_params, new_state))
    }
}

fn check_lengths(op: &'static str, params: &[Tensor], grads: &[Tensor]) -> Result<()> {
    if params.len() == grads.len() {
        Ok(())
    } else {
        Err(Error::Trace {
            op,
            message: format!("{} parameters but {} gradients", params.len(), grads.len()),
        })
    }
}

/// Scales `grads` so their global L2 norm is at most `max_norm`, as
/// `torch.nn.utils.clip_grad_norm_` (`coef = min(1, max_norm / (norm + 1e-6))`).
/// Returns the clipped gradients and the norm before clipping.
pub fn clip_by_global_norm(grads: &[Tensor], max_norm: f64) -> Result<(Vec<Tensor>, Tensor)> {
    let norm = global_norm(grads)?;
    let coefficient = norm
        .scalar_like(max_norm)?
        .div(&norm.add_scalar(1e-6)?)?
        .minimum(&norm.scalar_like(1.0)?)?;
    let clipped = grads
        .iter()
        .map(|g| g.mul(&coefficient.convert(g.dtype())?))
        .collect::<Result<_>>()?;
    Ok((clipped, norm))
}

/// `sqrt(Σ‖g‖²)` over all gradients, accumulated in f32 (f64 if any
/// gradient is f64).
pub fn global_norm(grads: &[Tensor]) -> Result<Tensor> {
    let first = grads.first().ok_or_else(|| Error::Trace {
        op: "global_norm",
        message: "needs at least one gradient".to_string(),
    })?;
    let dtype = if grads.iter().any(|g| g.dtype() == ElementType::F64) {
        ElementType::F64
    } else {
        ElementType::F32
    };
    let mut total = first.graph().scalar(0.0, dtype)?;
    for g in grads {
        total = total.add(&g.convert(dtype)?.square()?.sum_all()?)?;
    }
    total.sqrt()
}
