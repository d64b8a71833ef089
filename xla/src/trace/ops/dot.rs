//! `dot_general`: batched matrix products over any contracting dimensions,
//! and `matmul` on top of it.
//!
//! Result dimensions are the batch dimensions, then the lhs free dimensions,
//! then the rhs free dimensions (each in operand order). The VJP of each
//! operand is another `dot_general` of the cotangent with the other operand,
//! transposed back into the operand's dimension order.

use crate::dtype::TensorType;
use crate::error::{Error, Result};
use crate::trace::emit::{EmitCtx, i64_list};
use crate::trace::graph::Tensor;
use crate::trace::op::{Op, Rule, VjpArgs};

/// Dimension numbers of a `dot_general`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct DotGeneral {
    pub lhs_batch: Vec<usize>,
    pub rhs_batch: Vec<usize>,
    pub lhs_contracting: Vec<usize>,
    pub rhs_contracting: Vec<usize>,
}

/// Dimensions of `rank` in neither list, in order.
fn free_dimensions(rank: usize, batch: &[usize], contracting: &[usize]) -> Vec<usize> {
    (0..rank)
        .filter(|d| !batch.contains(d) && !contracting.contains(d))
        .collect()
}

impl DotGeneral {
    /// The result type, or an error naming the mismatched dimensions.
    fn infer(&self, lhs: &TensorType, rhs: &TensorType) -> Result<TensorType> {
        let fail = |why: String| Error::Trace {
            op: "dot_general",
            message: format!("{why} (lhs {lhs}, rhs {rhs}, dimension numbers {self:?})"),
        };
        if lhs.dtype != rhs.dtype {
            return Err(fail("operands have different dtypes".to_string()));
        }
        if self.lhs_batch.len() != self.rhs_batch.len() || self.lhs_contracting.len() != self.rhs_contracting.len() {
            return Err(fail("batch and contracting lists must pair up".to_string()));
        }
        let in_range = |dims: &[usize], rank: usize| dims.iter().all(|&d| d < rank);
        let mut lhs_all: Vec<usize> = self.lhs_batch.iter().chain(&self.lhs_contracting).copied().collect();
        let mut rhs_all: Vec<usize> = self.rhs_batch.iter().chain(&self.rhs_contracting).copied().collect();
        if !in_range(&lhs_all, lhs.dims.len()) || !in_range(&rhs_all, rhs.dims.len()) {
            return Err(fail("a dimension is out of range".to_string()));
        }
        lhs_all.sort_unstable();
        rhs_all.sort_unstable();
        if lhs_all.windows(2).any(|w| w[0] == w[1]) || rhs_all.windows(2).any(|w| w[0] == w[1]) {
            return Err(fail("a dimension is listed twice".to_string()));
        }
        let pairs = self
            .lhs_batch
            .iter()
            .zip(&self.rhs_batch)
            .chain(self.lhs_contracting.iter().zip(&self.rhs_contracting));
        for (&l, &r) in pairs {
            if lhs.dims[l] != rhs.dims[r] {
                return Err(fail(format!(
                    "lhs dimension {l} has size {}, rhs dimension {r} has size {}",
                    lhs.dims[l], rhs.dims[r]
                )));
            }
        }
        let mut dims: Vec<i64> = self.lhs_batch.iter().map(|&d| lhs.dims[d]).collect();
        dims.extend(
            free_dimensions(lhs.dims.len(), &self.lhs_batch, &self.lhs_contracting)
                .iter()
                .map(|&d| lhs.dims[d]),
        );
        dims.extend(
            free_dimensions(rhs.dims.len(), &self.rhs_batch, &self.rhs_contracting)
                .iter()
                .map(|&d| rhs.dims[d]),
        );
        Ok(TensorType::new(lhs.dtype, dims))
    }
}

impl Tensor {
    /// A general dot product: pairs of batch and contracting dimensions.
    pub fn dot_general(
        &self,
        rhs: &Tensor,
        lhs_batch: &[usize],
        rhs_batch: &[usize],
        lhs_contracting: &[usize],
        rhs_contracting: &[usize],
    ) -> Result<Tensor> {
        self.same_graph(rhs, "dot_general")?;
        let dot = DotGeneral {
            lhs_batch: lhs_batch.to_vec(),
            rhs_batch: rhs_batch.to_vec(),
            lhs_contracting: lhs_contracting.to_vec(),
            rhs_contracting: rhs_contracting.to_vec(),
        };
        let ty = dot.infer(&self.ty, &rhs.ty)?;
        if let Some((lhs, rhs, merged)) = merge_contracting_run(self, rhs, &dot)? {
            return self.graph.apply(Op::DotGeneral(merged), &[&lhs, &rhs], ty);
        }
        self.graph.apply(Op::DotGeneral(dot), &[self, rhs], ty)
    }

    /// Matrix product over the last dimension of `self` and the
    /// second-to-last of `rhs` (or the only one), with leading dimensions
    /// as batch when both have them: `[.., m, k] · [.., k, n]`, `[.., m, k] · [k, n]`.
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let (lr, rr) = (self.rank(), rhs.rank());
        if lr == 0 || rr == 0 {
            return Err(Error::Trace {
                op: "matmul",
                message: format!("needs operands of rank ≥ 1, got {} and {}", self.ty, rhs.ty),
            });
        }
        let rhs_k = if rr == 1 { 0 } else { rr - 2 };
        if rr <= 2 {
            return self.dot_general(rhs, &[], &[], &[lr - 1], &[rhs_k]);
        }
        let batch = rr - 2;
        if lr != rr {
            return Err(Error::Trace {
                op: "matmul",
                message: format!("batched operands need equal ranks, got {} and {}", self.ty, rhs.ty),
            });
        }
        let batch_dims: Vec<usize> = (0..batch).collect();
        self.dot_general(rhs, &batch_dims, &batch_dims, &[lr - 1], &[rhs_k])
    }
}

impl Rule for DotGeneral {
    fn name(&self) -> &'static str {
        "dot_general"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let list = |d: &[usize]| i64_list(&d.iter().map(|&x| x as i64).collect::<Vec<_>>());
        ctx.generic(
            "stablehlo.dot_general",
            &format!(
                "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = {}, rhs_batching_dimensions = {}, lhs_contracting_dimensions = {}, rhs_contracting_dimensions = {}>",
                list(&self.lhs_batch),
                list(&self.rhs_batch),
                list(&self.lhs_contracting),
                list(&self.rhs_contracting)
            ),
            &[],
        );
        Ok(())
    }

    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (lhs, rhs, g) = (&args.inputs[0], &args.inputs[1], args.cotangent(0)?);
        let nb = self.lhs_batch.len();
        let lhs_free = free_dimensions(lhs.rank(), &self.lhs_batch, &self.lhs_contracting);
        let rhs_free = free_dimensions(rhs.rank(), &self.rhs_batch, &self.rhs_contracting);
        let g_batch: Vec<usize> = (0..nb).collect();
        let g_lhs_free: Vec<usize> = (nb..nb + lhs_free.len()).collect();
        let g_rhs_free: Vec<usize> = (nb + lhs_free.len()..g.rank()).collect();

        // d lhs = g · rhs over rhs's free dimensions: [batch, lhs_free, rhs_contracting (sorted)].
        let d_lhs = g.dot_general(rhs, &g_batch, &self.rhs_batch, &g_rhs_free, &rhs_free)?;
        let d_lhs = d_lhs.transpose(&back_to_operand(
            lhs.rank(),
            &self.lhs_batch,
            &lhs_free,
            &self.lhs_contracting,
            &self.rhs_contracting,
            GradLayout::FreeFirst,
        ))?;
        // d rhs contracts lhs and g over lhs's free dimensions. As g · lhs it
        // comes out [batch, rhs_free, lhs_contracting (sorted)], as lhs · g
        // [batch, lhs_contracting (sorted), rhs_free]: take the order that is
        // already the rhs's own (a weight `[out, in]` of `x · wᵀ` gets g · x),
        // so that no transpose of the product is left for XLA to fold into it.
        let order = |layout| {
            back_to_operand(
                rhs.rank(),
                &self.rhs_batch,
                &rhs_free,
                &self.rhs_contracting,
                &self.lhs_contracting,
                layout,
            )
        };
        let free_first = order(GradLayout::FreeFirst);
        let d_rhs = if free_first.iter().enumerate().all(|(i, &d)| i == d) {
            g.dot_general(lhs, &g_batch, &self.lhs_batch, &g_lhs_free, &lhs_free)?
        } else {
            let d_rhs = lhs.dot_general(&g, &self.lhs_batch, &g_batch, &lhs_free, &g_lhs_free)?;
            d_rhs.transpose(&order(GradLayout::ContractingFirst))?
        };
        Ok(vec![Some(d_lhs), Some(d_rhs)])
    }
}

/// Several contracting dimensions that are consecutive (and in the same
/// order) in both operands become one, by reshaping both operands: the
/// result is the same, and XLA's CPU backend runs one-dimension
/// contractions as plain GEMMs (bf16 weight gradients of `[B, T, H]`
/// activations were an order of magnitude slower otherwise). When the lhs
/// run is not trailing (a weight gradient contracts the leading `[B, T]` of
/// both operands), the lhs is first transposed to put it last: the CPU
/// backend runs a bf16 dot natively only when its lhs contracts its last
/// dimension in row-major order (others are widened to f32, 4× slower
/// measured), and the merging reshape after the transpose makes XLA
/// materialize that order instead of folding the transpose into the dot.
/// `None` when there is nothing to merge.
fn merge_contracting_run(lhs: &Tensor, rhs: &Tensor, dot: &DotGeneral) -> Result<Option<(Tensor, Tensor, DotGeneral)>> {
    let run = |dims: &[usize]| dims.len() >= 2 && dims.windows(2).all(|w| w[1] == w[0] + 1);
    if !run(&dot.lhs_contracting) || !run(&dot.rhs_contracting) {
        return Ok(None);
    }
    let k = dot.lhs_contracting.len();
    let (lhs, lhs_batch) = contracting_run_last(lhs, &dot.lhs_batch, dot.lhs_contracting[0], k)?;
    let merge = |x: &Tensor, first: usize| -> Result<Tensor> {
        let mut dims = x.dims()[..first].to_vec();
        dims.push(x.dims()[first..first + k].iter().product());
        dims.extend_from_slice(&x.dims()[first + k..]);
        x.reshape(&dims)
    };
    let shift = |batch: &[usize], first: usize| -> Vec<usize> {
        batch.iter().map(|&b| if b > first { b - (k - 1) } else { b }).collect()
    };
    let (lf, rf) = (lhs.rank() - k, dot.rhs_contracting[0]);
    let merged = DotGeneral {
        lhs_batch: shift(&lhs_batch, lf),
        rhs_batch: shift(&dot.rhs_batch, rf),
        lhs_contracting: vec![lf],
        rhs_contracting: vec![rf],
    };
    Ok(Some((merge(&lhs, lf)?, merge(rhs, rf)?, merged)))
}

/// `x` with its `k` contracting dimensions from `first` moved to the end
/// (free and batch dimensions keep their order, so the dot's result is
/// unchanged), and where its batch dimensions went.
fn contracting_run_last(x: &Tensor, batch: &[usize], first: usize, k: usize) -> Result<(Tensor, Vec<usize>)> {
    let rank = x.rank();
    if first + k == rank {
        return Ok((x.clone(), batch.to_vec()));
    }
    let permutation: Vec<usize> = (0..first).chain(first + k..rank).chain(first..first + k).collect();
    let moved = batch.iter().map(|&b| if b < first { b } else { b - k }).collect();
    Ok((x.transpose(&permutation)?, moved))
}

/// Layout of an operand's gradient as the VJP's `dot_general` leaves it.
#[derive(Clone, Copy)]
enum GradLayout {
    /// `[batch, free, contracting]` (the lhs gradient).
    FreeFirst,
    /// `[batch, contracting, free]` (the rhs gradient).
    ContractingFirst,
}

/// Permutation taking a gradient in `layout` back to the operand's own
/// dimension order. Its contracting dimensions come in the order of the
/// other operand's matching dimensions, sorted.
fn back_to_operand(
    rank: usize,
    batch: &[usize],
    free: &[usize],
    contracting: &[usize],
    other_contracting: &[usize],
    layout: GradLayout,
) -> Vec<usize> {
    let mut sorted_other: Vec<usize> = other_contracting.to_vec();
    sorted_other.sort_unstable();
    let (free_start, contracting_start) = match layout {
        GradLayout::FreeFirst => (batch.len(), batch.len() + free.len()),
        GradLayout::ContractingFirst => (batch.len() + contracting.len(), batch.len()),
    };
    (0..rank)
        .map(|d| {
            if let Some(i) = batch.iter().position(|&b| b == d) {
                i
            } else if let Some(j) = free.iter().position(|&f| f == d) {
                free_start + j
            } else {
                let k = contracting
                    .iter()
                    .position(|&c| c == d)
                    .expect("every dimension is classified");
                contracting_start
                    + sorted_other
                        .iter()
                        .position(|&o| o == other_contracting[k])
                        .expect("present")
            }
        })
        .collect()
}
