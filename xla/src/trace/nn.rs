//! Composed helpers for models and losses, written with the primitive ops
//! (so their gradients come from the primitives' rules).

use super::graph::Tensor;
use crate::error::{Error, Result};

impl Tensor {
    /// `x · logistic(x)` (SiLU, the activation of Llama's MLP).
    pub fn silu(&self) -> Result<Tensor> {
        self.mul(&self.logistic()?)
    }

    /// `max(x, 0)`.
    pub fn relu(&self) -> Result<Tensor> {
        self.maximum(&self.scalar_like(0.0)?)
    }

    /// `log Σ exp(x)` over `axis` (removed), computed as `m + log Σ exp(x - m)`
    /// with `m` the maximum, so large logits do not overflow. The shift `m`
    /// cancels in the gradient, so it is a constant for autodiff (as in JAX),
    /// which spares the backward pass a max-reduction's mask.
    pub fn logsumexp(&self, axis: usize) -> Result<Tensor> {
        let m = self.max_keepdims(&[axis])?.stop_gradient()?;
        let shifted = self.sub(&m)?.exp()?.sum(&[axis])?.log()?;
        shifted.add(&m.reshape(&without(self.dims(), axis))?)
    }

    /// `x - logsumexp(x)` over `axis` (kept); the max shift is constant for autodiff.
    pub fn log_softmax(&self, axis: usize) -> Result<Tensor> {
        let m = self.max_keepdims(&[axis])?.stop_gradient()?;
        let shifted = self.sub(&m)?;
        shifted.sub(&shifted.exp()?.sum_keepdims(&[axis])?.log()?)
    }

    /// `exp(x) / Σ exp(x)` over `axis`, stable for large logits; the max
    /// shift is constant for autodiff.
    pub fn softmax(&self, axis: usize) -> Result<Tensor> {
        let e = self.sub(&self.max_keepdims(&[axis])?.stop_gradient()?)?.exp()?;
        e.div(&e.sum_keepdims(&[axis])?)
    }

    /// RMS normalization over the last axis, scaled by `weight` (shape of
    /// that axis): `x / sqrt(mean(x²) + eps) · weight`, as in Llama.
    pub fn rms_norm(&self, weight: &Tensor, eps: f64) -> Result<Tensor> {
        let last = self.rank().checked_sub(1).ok_or_else(|| Error::Trace {
            op: "rms_norm",
            message: "needs a tensor of rank ≥ 1".to_string(),
        })?;
        if weight.dims() != [self.dims()[last]] {
            return Err(Error::Trace {
                op: "rms_norm",
                message: format!(
                    "weight {} does not match the last axis of {}",
                    weight.tensor_type(),
                    self.tensor_type()
                ),
            });
        }
        let mean_square = self
            .square()?
            .sum_keepdims(&[last])?
            .mul_scalar(1.0 / self.dims()[last] as f64)?;
        self.mul(&mean_square.add_scalar(eps)?.rsqrt()?)?.mul(weight)
    }

    /// Log-probabilities of integer `ids` under these logits over the last
    /// axis (the vocabulary): logits `[.., V]`, ids `[..]` → `[..]`, computed
    /// as `logit[id] − logsumexp(logits)` without a full log-softmax.
    pub fn gathered_log_probs(&self, ids: &Tensor) -> Result<Tensor> {
        let last = self.rank().checked_sub(1).filter(|&l| ids.dims() == &self.dims()[..l]);
        let Some(last) = last else {
            return Err(Error::Trace {
                op: "gathered_log_probs",
                message: format!(
                    "ids {} must have the logits' shape {} without its last axis",
                    ids.tensor_type(),
                    self.tensor_type()
                ),
            });
        };
        let mut column = ids.dims().to_vec();
        column.push(1);
        let picked = self
            .take_along_axis(&ids.reshape(&column)?, last)?
            .reshape(ids.dims())?;
        picked.sub(&self.logsumexp(last)?)
    }

    /// Mean cross-entropy of integer `labels` under these logits (last axis
    /// the classes), as a scalar.
    pub fn cross_entropy(&self, labels: &Tensor) -> Result<Tensor> {
        let log_probs = self.gathered_log_probs(labels)?;
        let count = log_probs.tensor_type().element_count().max(1) as f64;
        log_probs.sum_all()?.mul_scalar(-1.0 / count)
    }

    /// Mean squared error against `target` of the same shape, as a scalar.
    pub fn mse(&self, target: &Tensor) -> Result<Tensor> {
        let count = self.tensor_type().element_count().max(1) as f64;
        self.sub(target)?.square()?.sum_all()?.mul_scalar(1.0 / count)
    }
}

fn without(dims: &[i64], axis: usize) -> Vec<i64> {
    dims.iter()
        .enumerate()
        .filter(|(i, _)| *i != axis)
        .map(|(_, &d)| d)
        .collect()
}
