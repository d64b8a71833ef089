//! Reductions over dimensions: sum, max, min (and their means and
//! keep-dims forms); argmax and argmin along one axis; cumulative sums.

use crate::dtype::{ElementType, TensorType};
use crate::error::{Error, Result};
use crate::trace::emit::{EmitCtx, i64_array, i64_list};
use crate::trace::graph::Tensor;
use crate::trace::op::{Op, Rule, VjpArgs};

/// How elements are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ReduceKind {
    Sum,
    Max,
    Min,
}

/// A reduction of operand 0 over `dimensions`, starting from operand 1 (a scalar).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Reduce {
    pub kind: ReduceKind,
    pub dimensions: Vec<usize>,
}

impl ReduceKind {
    fn name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "reduce_sum",
            ReduceKind::Max => "reduce_max",
            ReduceKind::Min => "reduce_min",
        }
    }

    fn combiner(self) -> &'static str {
        match self {
            ReduceKind::Sum => "stablehlo.add",
            ReduceKind::Max => "stablehlo.maximum",
            ReduceKind::Min => "stablehlo.minimum",
        }
    }

    /// The identity of the combiner for `dtype`.
    fn identity(self, dtype: ElementType) -> f64 {
        match (self, dtype) {
            (ReduceKind::Sum, _) => 0.0,
            (ReduceKind::Max, ElementType::S8) => f64::from(i8::MIN),
            (ReduceKind::Max, ElementType::S32) => f64::from(i32::MIN),
            (ReduceKind::Max, ElementType::S64) => i64::MIN as f64,
            (ReduceKind::Max, ElementType::U8 | ElementType::U32 | ElementType::U64 | ElementType::Pred) => 0.0,
            (ReduceKind::Max, _) => f64::NEG_INFINITY,
            (ReduceKind::Min, ElementType::S8) => f64::from(i8::MAX),
            (ReduceKind::Min, ElementType::S32) => f64::from(i32::MAX),
            (ReduceKind::Min, ElementType::S64) => i64::MAX as f64,
            (ReduceKind::Min, ElementType::U8) => f64::from(u8::MAX),
            (ReduceKind::Min, ElementType::U32) => f64::from(u32::MAX),
            (ReduceKind::Min, ElementType::U64) => u64::MAX as f64,
            (ReduceKind::Min, ElementType::Pred) => 1.0,
            (ReduceKind::Min, _) => f64::INFINITY,
        }
    }
}

/// The shape left after reducing `dimensions` of `x` (distinct and in range).
pub(crate) fn reduced_type(x: &TensorType, dimensions: &[usize], op: &'static str) -> Result<TensorType> {
    let mut seen = vec![false; x.dims.len()];
    for &d in dimensions {
        if d >= x.dims.len() || std::mem::replace(&mut seen[d], true) {
            return Err(Error::Trace {
                op,
                message: format!("dimensions {dimensions:?} must be distinct dimensions of {x}"),
            });
        }
    }
    let dims = x
        .dims
        .iter()
        .enumerate()
        .filter(|(i, _)| !seen[*i])
        .map(|(_, &d)| d)
        .collect::<Vec<_>>();
    Ok(TensorType::new(x.dtype, dims))
}

/// The dimensions of `rank` not in `reduced`, in order.
pub(crate) fn kept_dimensions(rank: usize, reduced: &[usize]) -> Vec<usize> {
    (0..rank).filter(|d| !reduced.contains(d)).collect()
}

impl Tensor {
    fn reduce(&self, kind: ReduceKind, dimensions: &[usize]) -> Result<Tensor> {
        let ty = reduced_type(&self.ty, dimensions, kind.name())?;
        if dimensions.is_empty() {
            return Ok(self.clone());
        }
        let init = self.scalar_like(kind.identity(self.dtype()))?;
        let op = Op::Reduce(Reduce {
            kind,
            dimensions: dimensions.to_vec(),
        });
        self.graph.apply(op, &[self, &init], ty)
    }

    /// Sum over `dimensions` (removed from the shape).
    pub fn sum(&self, dimensions: &[usize]) -> Result<Tensor> {
        self.reduce(ReduceKind::Sum, dimensions)
    }

    /// Maximum over `dimensions` (removed from the shape).
    pub fn max(&self, dimensions: &[usize]) -> Result<Tensor> {
        self.reduce(ReduceKind::Max, dimensions)
    }

    /// Minimum over `dimensions` (removed from the shape).
    pub fn min(&self, dimensions: &[usize]) -> Result<Tensor> {
        self.reduce(ReduceKind::Min, dimensions)
    }

    /// Mean over `dimensions` (removed from the shape).
    pub fn mean(&self, dimensions: &[usize]) -> Result<Tensor> {
        let count: i64 = dimensions
            .iter()
            .map(|&d| self.dims().get(d).copied().unwrap_or(1))
            .product();
        self.sum(dimensions)?.mul_scalar(1.0 / count.max(1) as f64)
    }

    /// Sum of every element, as a scalar.
    pub fn sum_all(&self) -> Result<Tensor> {
        let all: Vec<usize> = (0..self.rank()).collect();
        self.sum(&all)
    }

    /// Sum over `dimensions`, kept as size 1 (for broadcasting back).
    pub fn sum_keepdims(&self, dimensions: &[usize]) -> Result<Tensor> {
        self.sum(dimensions)?.reshape(&keepdims_shape(self.dims(), dimensions))
    }

    /// Maximum over `dimensions`, kept as size 1.
    pub fn max_keepdims(&self, dimensions: &[usize]) -> Result<Tensor> {
        self.max(dimensions)?.reshape(&keepdims_shape(self.dims(), dimensions))
    }
}

fn keepdims_shape(dims: &[i64], reduced: &[usize]) -> Vec<i64> {
    dims.iter()
        .enumerate()
        .map(|(i, &d)| if reduced.contains(&i) { 1 } else { d })
        .collect()
}

impl Rule for Reduce {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let region = ctx.e.reducer_region(self.kind.combiner(), ctx.operand_types[0].dtype);
        let dims: Vec<i64> = self.dimensions.iter().map(|&d| d as i64).collect();
        ctx.generic(
            "stablehlo.reduce",
            &format!("dimensions = {}", i64_array(&dims)),
            &[region],
        );
        Ok(())
    }

    /// Sum: the cotangent broadcast back. Max/min: shared evenly among the
    /// elements equal to the result.
    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (x, y, g) = (&args.inputs[0], &args.outputs[0], args.cotangent(0)?);
        let kept = kept_dimensions(x.rank(), &self.dimensions);
        let g_full = g.broadcast_in_dim(x.dims(), &kept)?;
        let dx = match self.kind {
            ReduceKind::Sum => g_full,
            ReduceKind::Max | ReduceKind::Min => {
                let hit = x.eq(&y.broadcast_in_dim(x.dims(), &kept)?)?;
                let zero = x.zeros_like()?;
                let mask = hit.select(&x.ones_like()?, &zero)?;
                let count = mask.sum(&self.dimensions)?.broadcast_in_dim(x.dims(), &kept)?;
                mask.mul(&g_full)?.div(&count)?
            }
        };
        Ok(vec![Some(dx), None])
    }
}

/// Cumulative sum of operand 0 along `axis` (from the end when `reverse`),
/// as a window sum from operand 1 (zero).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CumSum {
    pub axis: usize,
    pub reverse: bool,
}

impl Tensor {
    /// The first index of the extreme along `axis`, by two passes: the
    /// extreme itself (NaN-propagating, so any NaN makes it NaN), then
    /// the least position holding it (or holding a NaN). XLA's CPU backend
    /// runs these several times faster than one reduce of (value, index)
    /// pairs.
    fn arg_extreme(&self, axis: usize, dtype: ElementType, smallest: bool) -> Result<Tensor> {
        let name = if smallest { "argmin" } else { "argmax" };
        if !dtype.is_integer() || axis >= self.rank() || self.dims()[axis] == 0 {
            return Err(Error::Trace {
                op: name,
                message: format!(
                    "needs an integer index dtype and a non-empty axis, got {dtype} along axis {axis} of {}",
                    self.ty
                ),
            });
        }
        let x = self.stop_gradient()?;
        let kind = if smallest { ReduceKind::Min } else { ReduceKind::Max };
        let extreme = x
            .reduce(kind, &[axis])?
            .broadcast_in_dim(x.dims(), &kept_dimensions(x.rank(), &[axis]))?;
        let nan = |t: &Tensor| t.ne(t);
        let hit = x.eq(&extreme)?.or(&nan(&x)?.and(&nan(&extreme)?)?)?;
        // Positions as floats: XLA's CPU backend reduces floats in one
        // pass, integers through a materialized copy (f32 is exact below
        // 2^24, f64 beyond).
        let n = self.dims()[axis];
        let float = if n <= 1 << 24 {
            ElementType::F32
        } else {
            ElementType::F64
        };
        let positions = self.graph.iota(float, self.dims(), axis)?;
        let past_end = positions.full_like(n as f64)?;
        hit.select(&positions, &past_end)?.min(&[axis])?.convert(dtype)
    }

    /// Index of the largest element along `axis` (removed from the shape),
    /// as integers of `dtype`. Ties go to the first index; NaN counts as
    /// larger than any number, so the first NaN wins (as in `numpy.argmax`).
    pub fn argmax(&self, axis: usize, dtype: ElementType) -> Result<Tensor> {
        self.arg_extreme(axis, dtype, false)
    }

    /// Index of the smallest element along `axis` (removed from the shape),
    /// as integers of `dtype`. Ties go to the first index; NaN counts as
    /// smaller than any number, so the first NaN wins (as in `numpy.argmin`).
    pub fn argmin(&self, axis: usize, dtype: ElementType) -> Result<Tensor> {
        self.arg_extreme(axis, dtype, true)
    }

    /// Cumulative sum along `axis`: element `i` sums elements `0..=i`, or
    /// `i..` when `reverse`.
    pub fn cumsum(&self, axis: usize, reverse: bool) -> Result<Tensor> {
        if axis >= self.rank() {
            return Err(Error::Trace {
                op: "cumsum",
                message: format!("axis {axis} is out of range for {}", self.ty),
            });
        }
        if self.dims()[axis] <= 1 {
            return Ok(self.clone());
        }
        let zero = self.scalar_like(0.0)?;
        self.graph
            .apply(Op::CumSum(CumSum { axis, reverse }), &[self, &zero], self.ty.clone())
    }
}

impl Rule for CumSum {
    fn name(&self) -> &'static str {
        "cumsum"
    }

    /// A window as long as the axis, padded before it (after it when
    /// reversed) so that window `i` ends (starts) at element `i`.
    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let ty = &ctx.operand_types[0];
        let (rank, n) = (ty.dims.len(), ty.dims[self.axis]);
        let mut window = vec![1; rank];
        window[self.axis] = n;
        let padding: Vec<String> = (0..rank)
            .map(|i| match (i == self.axis, self.reverse) {
                (false, _) => i64_list(&[0, 0]),
                (true, false) => i64_list(&[n - 1, 0]),
                (true, true) => i64_list(&[0, n - 1]),
            })
            .collect();
        let attributes = format!(
            "padding = dense<[{}]> : tensor<{rank}x2xi64>, window_dimensions = {}, window_strides = {}",
            padding.join(", "),
            i64_array(&window),
            i64_array(&vec![1; rank])
        );
        let region = ctx.e.reducer_region("stablehlo.add", ty.dtype);
        ctx.generic("stablehlo.reduce_window", &attributes, &[region]);
        Ok(())
    }

    /// Each element feeds every later (earlier) sum: the cotangent summed
    /// in the opposite direction.
    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let dx = args.cotangent(0)?.cumsum(self.axis, !self.reverse)?;
        Ok(vec![Some(dx), None])
    }
}
