//! The output head of a language model as one chunked, custom-gradient
//! step: log-probabilities (and entropies) of target tokens under
//! `hidden · weightᵀ`, computed `chunk` rows at a time so the full
//! `[tokens, vocab]` logits never exist — not in the forward pass and not
//! kept for the backward pass, which recomputes each chunk's logits.

use super::graph::Tensor;
use super::ops::control::fori_loop;
use super::ops::custom::custom_vjp;
use crate::dtype::ElementType;
use crate::error::{Error, Result};

/// How the head's raw logits `z` become the scored distribution's:
/// soft-capped to `cap · tanh(z / cap)` when `softcap` is given (Gemma 2),
/// then divided by `temperature`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeadScale {
    /// Divides the (capped) logits; 1 is the model's own distribution.
    pub temperature: f64,
    /// The soft cap of the logits, if any.
    pub softcap: Option<f64>,
}

/// Log-probs and entropies (f32, `[N]`) of integer `targets` `[N]` under
/// the logits `hidden [N, H] · weight [V, H]ᵀ`, scaled by `scale`, `chunk`
/// rows at a time (`chunk` must divide `N`). Gradients flow to `hidden` and
/// `weight`.
pub fn linear_log_probs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    chunk: i64,
    scale: HeadScale,
) -> Result<(Tensor, Tensor)> {
    let temperature = scale.temperature;
    let (n, width) = match hidden.dims() {
        &[n, h] => (n, h),
        _ => {
            return Err(Error::trace(
                "linear_log_probs",
                format!("hidden must be [N, H], got {}", hidden.tensor_type()),
            ));
        }
    };
    let ok = weight.rank() == 2
        && weight.dims()[1] == width
        && targets.dims() == [n]
        && targets.dtype().is_integer()
        && chunk > 0
        && n % chunk == 0
        && temperature > 0.0
        && temperature.is_finite()
        && scale.softcap.is_none_or(|c| c > 0.0 && c.is_finite());
    if !ok {
        return Err(Error::trace(
            "linear_log_probs",
            format!(
                "needs hidden [N, H], weight [V, H], integer targets [N], a chunk dividing N, a temperature > 0 and a soft cap > 0; got {}, {}, {}, chunk {chunk}, {scale:?}",
                hidden.tensor_type(),
                weight.tensor_type(),
                targets.tensor_type()
            ),
        ));
    }
    let steps = n / chunk;
    let mut out = custom_vjp(
        "linear_log_probs",
        &[hidden, weight, targets],
        move |p| {
            let graph = p[0].graph();
            let zeros = graph.full(0.0, ElementType::F32, &[n])?;
            let done = fori_loop(steps, &[&p[0], &p[1], &p[2], &zeros, &zeros], |i, c| {
                let piece = Chunk::of(&c[0], &c[1], &c[2], i, chunk, scale)?;
                let start = piece.start.clone();
                Ok(vec![
                    c[0].clone(),
                    c[1].clone(),
                    c[2].clone(),
                    c[3].dynamic_update_slice(&piece.log_prob()?, &[&start])?,
                    c[4].dynamic_update_slice(&piece.entropy()?, &[&start])?,
                ])
            })?;
            Ok(vec![done[3].clone(), done[4].clone()])
        },
        move |inputs, outputs, cotangents| {
            let (hidden, weight, targets) = (&inputs[0], &inputs[1], &inputs[2]);
            let zeros = || outputs[0].zeros_like();
            let g_lp = cotangents[0].clone().map_or_else(zeros, Ok)?;
            let g_ent = cotangents[1].clone().map_or_else(zeros, Ok)?;
            let graph = hidden.graph();
            let dh = hidden.zeros_like()?;
            let dw = graph.full(0.0, ElementType::F32, weight.dims())?;
            let carried = [hidden, weight, targets, &g_lp, &g_ent, &outputs[1], &dh, &dw];
            let done = fori_loop(steps, &carried, |i, c| {
                let piece = Chunk::of(&c[0], &c[1], &c[2], i, chunk, scale)?;
                let rows = |x: &Tensor| x.dynamic_slice(&[&piece.start], &[chunk])?.reshape(&[chunk, 1]);
                let (g_lp, g_ent, ent) = (rows(&c[3])?, rows(&c[4])?, rows(&c[5])?);
                // d log p[t] / dz = onehot(t) − p;  d H / dz = −p (log p + H),
                // for z the tempered logits; d z / d logits = 1 / temperature,
                // times 1 − tanh² through a soft cap.
                let p = piece.log_p.exp()?;
                let classes = piece.log_p.graph().iota(ElementType::S32, piece.log_p.dims(), 1)?;
                let onehot = classes.eq(&piece.targets.convert(ElementType::S32)?.reshape(&[chunk, 1])?)?;
                let onehot = onehot.select(&p.ones_like()?, &p.zeros_like()?)?;
                // In the weight's dtype for both products (bf16 GEMMs under mixed precision).
                let d_tempered = g_lp
                    .mul(&onehot.sub(&p)?)?
                    .sub(&g_ent.mul(&p.mul(&piece.log_p.add(&ent)?)?)?)?;
                let mut d_logits = tempered(d_tempered, temperature)?;
                if let Some(slope) = &piece.cap_slope {
                    d_logits = d_logits.mul(slope)?;
                }
                let d_logits = d_logits.convert(c[1].dtype())?;
                let d_hidden = d_logits.dot_general(&c[1], &[], &[], &[1], &[0])?;
                let d_weight = weight_gradient(&d_logits, &piece.hidden)?.convert(ElementType::F32)?;
                let zero = piece.start.zeros_like()?;
                let mut next: Vec<Tensor> = c[..6].to_vec();
                next.push(c[6].dynamic_update_slice(&d_hidden, &[&piece.start, &zero])?);
                next.push(c[7].add(&d_weight)?);
                Ok(next)
            })?;
            Ok(vec![
                Some(done[6].clone()),
                Some(done[7].convert(weight.dtype())?),
                None,
            ])
        },
    )?;
    let entropy = out.pop().expect("two outputs");
    Ok((out.pop().expect("two outputs"), entropy))
}

/// `d_logitsᵀ · hidden` `[V, H]` for one chunk, in the weight's dtype. The
/// chunk's rows are split in two dimensions first, so that `dot_general`
/// contracts a run of two and materializes `d_logitsᵀ` for a native GEMM
/// (see its merging of contracting runs) instead of widening a bf16 dot
/// whose lhs contracts its leading dimension to f32.
fn weight_gradient(d_logits: &Tensor, hidden: &Tensor) -> Result<Tensor> {
    let (rows, vocab, width) = (hidden.dims()[0], d_logits.dims()[1], hidden.dims()[1]);
    let split = (2..rows).find(|d| rows % d == 0).unwrap_or(1);
    let d_logits = d_logits.reshape(&[split, rows / split, vocab])?;
    let hidden = hidden.reshape(&[split, rows / split, width])?;
    d_logits.dot_general(&hidden, &[], &[], &[0, 1], &[0, 1])
}

/// `x / temperature` (`x` itself at temperature 1).
fn tempered(x: Tensor, temperature: f64) -> Result<Tensor> {
    if temperature == 1.0 {
        Ok(x)
    } else {
        x.div(&x.scalar_like(temperature)?)
    }
}

/// One chunk of rows: its start, hidden rows, targets and log-softmax.
struct Chunk {
    start: Tensor,
    hidden: Tensor,
    targets: Tensor,
    /// `log softmax(scaled hidden · weightᵀ)` in f32, `[chunk, V]`.
    log_p: Tensor,
    /// Through a soft cap, the capped logits' slope `1 − tanh²(z / cap)`.
    cap_slope: Option<Tensor>,
}

impl Chunk {
    /// Chunk `i`, its logits scaled by `scale`.
    fn of(
        hidden: &Tensor,
        weight: &Tensor,
        targets: &Tensor,
        i: &Tensor,
        chunk: i64,
        scale: HeadScale,
    ) -> Result<Chunk> {
        let start = i.mul_scalar(chunk as f64)?;
        let zero = start.zeros_like()?;
        let rows = hidden.dynamic_slice(&[&start, &zero], &[chunk, hidden.dims()[1]])?;
        let targets = targets.dynamic_slice(&[&start], &[chunk])?;
        let mut logits = rows
            .dot_general(weight, &[], &[], &[1], &[1])?
            .convert(ElementType::F32)?;
        let mut cap_slope = None;
        if let Some(cap) = scale.softcap {
            let squashed = logits.mul_scalar(1.0 / cap)?.tanh()?;
            cap_slope = Some(squashed.square()?.neg()?.add_scalar(1.0)?);
            logits = squashed.mul_scalar(cap)?;
        }
        let log_p = tempered(logits, scale.temperature)?.log_softmax(1)?;
        Ok(Chunk {
            start,
            hidden: rows,
            targets,
            log_p,
            cap_slope,
        })
    }

    fn log_prob(&self) -> Result<Tensor> {
        let chunk = self.targets.dims()[0];
        self.log_p
            .take_along_axis(&self.targets.reshape(&[chunk, 1])?, 1)?
            .reshape(&[chunk])
    }

    fn entropy(&self) -> Result<Tensor> {
        self.log_p.exp()?.mul(&self.log_p)?.sum(&[1])?.neg()
    }
}
