//! Ops that move data without arithmetic: broadcast, reshape, transpose,
//! slices (static and dynamic), concatenation, padding and reversal.
//! Their VJPs are their transposes: reductions, inverse permutations, pads
//! and slices.

use crate::dtype::{TensorType, element_count};
use crate::error::{Error, Result};
use crate::trace::emit::{EmitCtx, i64_array};
use crate::trace::graph::Tensor;
use crate::trace::op::{Op, Rule, VjpArgs};

/// Input dimension `i` becomes output dimension `dimensions[i]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct BroadcastInDim {
    pub dimensions: Vec<usize>,
}

/// Same elements, new dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Reshape;

/// Output dimension `i` is input dimension `permutation[i]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Transpose {
    pub permutation: Vec<usize>,
}

/// A strided box of the input.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Slice {
    pub start: Vec<i64>,
    pub limit: Vec<i64>,
    pub strides: Vec<i64>,
}

/// A box of `sizes` at run-time start indices (one scalar operand each).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct DynamicSlice {
    pub sizes: Vec<i64>,
}

/// The input with a box overwritten by an update at run-time start indices.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct DynamicUpdateSlice;

/// Inputs joined along one dimension.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Concatenate {
    pub axis: usize,
}

/// Edge and interior padding with a scalar value operand.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Pad {
    pub low: Vec<i64>,
    pub high: Vec<i64>,
    pub interior: Vec<i64>,
}

/// The input read backwards along some dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Reverse {
    pub dimensions: Vec<usize>,
}

fn is_permutation(perm: &[usize], rank: usize) -> bool {
    let mut seen = vec![false; rank];
    perm.len() == rank && perm.iter().all(|&p| p < rank && !std::mem::replace(&mut seen[p], true))
}

fn is_integer_scalar(t: &Tensor) -> bool {
    t.rank() == 0 && t.dtype().is_integer()
}

impl Tensor {
    /// Broadcasts with explicit dimension mapping: input dimension `i`
    /// becomes output dimension `dimensions[i]` (size equal, or 1).
    pub fn broadcast_in_dim(&self, dims: &[i64], dimensions: &[usize]) -> Result<Tensor> {
        let ok = dimensions.len() == self.rank()
            && dimensions
                .iter()
                .zip(self.dims())
                .all(|(&d, &size)| d < dims.len() && (size == dims[d] || size == 1))
            && dimensions.windows(2).all(|w| w[0] < w[1]);
        if !ok {
            return Err(Error::trace(
                "broadcast_in_dim",
                format!("cannot map {} onto {dims:?} with dimensions {dimensions:?}", self.ty),
            ));
        }
        if dims == self.dims() {
            return Ok(self.clone());
        }
        let op = Op::BroadcastInDim(BroadcastInDim {
            dimensions: dimensions.to_vec(),
        });
        self.graph.apply(op, &[self], TensorType::new(self.dtype(), dims))
    }

    /// Numpy-style broadcast to `dims` (trailing dimensions aligned).
    pub fn broadcast_to(&self, dims: &[i64]) -> Result<Tensor> {
        if dims == self.dims() {
            return Ok(self.clone());
        }
        if self.rank() > dims.len() {
            return Err(Error::trace(
                "broadcast",
                format!("cannot broadcast {} to the lower rank {dims:?}", self.ty),
            ));
        }
        let offset = dims.len() - self.rank();
        let dimensions: Vec<usize> = (offset..dims.len()).collect();
        self.broadcast_in_dim(dims, &dimensions)
    }

    /// The same elements with `dims` (same element count).
    pub fn reshape(&self, dims: &[i64]) -> Result<Tensor> {
        if dims.iter().any(|&d| d < 0) || element_count(dims) != self.ty.element_count() {
            return Err(Error::trace(
                "reshape",
                format!("cannot reshape {} to {dims:?}", self.ty),
            ));
        }
        if dims == self.dims() {
            return Ok(self.clone());
        }
        self.graph
            .apply(Op::Reshape(Reshape), &[self], TensorType::new(self.dtype(), dims))
    }

    /// Permutes dimensions: output dimension `i` is input dimension `permutation[i]`.
    pub fn transpose(&self, permutation: &[usize]) -> Result<Tensor> {
        if !is_permutation(permutation, self.rank()) {
            return Err(Error::trace(
                "transpose",
                format!("{permutation:?} is not a permutation of the dimensions of {}", self.ty),
            ));
        }
        if permutation.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(self.clone());
        }
        let dims: Vec<i64> = permutation.iter().map(|&p| self.dims()[p]).collect();
        let op = Op::Transpose(Transpose {
            permutation: permutation.to_vec(),
        });
        self.graph.apply(op, &[self], TensorType::new(self.dtype(), dims))
    }

    /// Swaps the last two dimensions.
    pub fn t(&self) -> Result<Tensor> {
        let rank = self.rank();
        if rank < 2 {
            return Err(Error::trace(
                "transpose",
                format!("{} has fewer than 2 dimensions", self.ty),
            ));
        }
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(rank - 2, rank - 1);
        self.transpose(&perm)
    }

    /// The box `start..limit` with `strides` in every dimension.
    pub fn slice(&self, start: &[i64], limit: &[i64], strides: &[i64]) -> Result<Tensor> {
        let rank = self.rank();
        let ok = start.len() == rank
            && limit.len() == rank
            && strides.len() == rank
            && (0..rank).all(|i| 0 <= start[i] && start[i] <= limit[i] && limit[i] <= self.dims()[i] && strides[i] > 0);
        if !ok {
            return Err(Error::trace(
                "slice",
                format!("{start:?}..{limit:?} by {strides:?} is not inside {}", self.ty),
            ));
        }
        let dims: Vec<i64> = (0..rank)
            .map(|i| (limit[i] - start[i] + strides[i] - 1) / strides[i])
            .collect();
        let op = Op::Slice(Slice {
            start: start.to_vec(),
            limit: limit.to_vec(),
            strides: strides.to_vec(),
        });
        self.graph.apply(op, &[self], TensorType::new(self.dtype(), dims))
    }

    /// `start..end` along `axis`, everything along the others.
    pub fn slice_axis(&self, axis: usize, start: i64, end: i64) -> Result<Tensor> {
        if axis >= self.rank() {
            return Err(Error::trace(
                "slice",
                format!("axis {axis} is out of range for {}", self.ty),
            ));
        }
        let mut from = vec![0; self.rank()];
        let mut to = self.dims().to_vec();
        from[axis] = start;
        to[axis] = end;
        self.slice(&from, &to, &vec![1; self.rank()])
    }

    /// A box of `sizes` starting at run-time scalar indices (clamped into range, as in XLA).
    pub fn dynamic_slice(&self, starts: &[&Tensor], sizes: &[i64]) -> Result<Tensor> {
        let ok = starts.len() == self.rank()
            && sizes.len() == self.rank()
            && starts.iter().all(|s| is_integer_scalar(s))
            && (0..self.rank()).all(|i| 0 <= sizes[i] && sizes[i] <= self.dims()[i]);
        if !ok {
            return Err(Error::trace(
                "dynamic_slice",
                format!(
                    "needs one integer scalar start per dimension and sizes within {}, got sizes {sizes:?}",
                    self.ty
                ),
            ));
        }
        let mut inputs = vec![self];
        inputs.extend_from_slice(starts);
        let op = Op::DynamicSlice(DynamicSlice { sizes: sizes.to_vec() });
        self.graph.apply(op, &inputs, TensorType::new(self.dtype(), sizes))
    }

    /// This tensor with `update` written at run-time scalar start indices.
    pub fn dynamic_update_slice(&self, update: &Tensor, starts: &[&Tensor]) -> Result<Tensor> {
        let ok = update.dtype() == self.dtype()
            && update.rank() == self.rank()
            && starts.len() == self.rank()
            && starts.iter().all(|s| is_integer_scalar(s))
            && (0..self.rank()).all(|i| update.dims()[i] <= self.dims()[i]);
        if !ok {
            return Err(Error::trace(
                "dynamic_update_slice",
                format!(
                    "cannot write {} into {} with {} start indices",
                    update.ty,
                    self.ty,
                    starts.len()
                ),
            ));
        }
        let mut inputs = vec![self, update];
        inputs.extend_from_slice(starts);
        self.graph
            .apply(Op::DynamicUpdateSlice(DynamicUpdateSlice), &inputs, self.ty.clone())
    }

    /// Joins `tensors` along `axis`; all other dimensions must agree.
    pub fn concatenate(tensors: &[&Tensor], axis: usize) -> Result<Tensor> {
        let first = tensors
            .first()
            .ok_or_else(|| Error::trace("concatenate", "needs at least one tensor".to_string()))?;
        let ok = axis < first.rank()
            && tensors.iter().all(|t| {
                t.dtype() == first.dtype()
                    && t.rank() == first.rank()
                    && (0..first.rank()).all(|i| i == axis || t.dims()[i] == first.dims()[i])
            });
        if !ok {
            let types: Vec<String> = tensors.iter().map(|t| t.ty.to_string()).collect();
            return Err(Error::trace(
                "concatenate",
                format!("cannot join {} along axis {axis}", types.join(", ")),
            ));
        }
        for t in tensors {
            first.same_graph(t, "concatenate")?;
        }
        let mut dims = first.dims().to_vec();
        dims[axis] = tensors.iter().map(|t| t.dims()[axis]).sum();
        first.graph.apply(
            Op::Concatenate(Concatenate { axis }),
            tensors,
            TensorType::new(first.dtype(), dims),
        )
    }

    /// Pads with the scalar `value`: `low`/`high` at the edges (non-negative)
    /// and `interior` between elements.
    pub fn pad(&self, value: &Tensor, low: &[i64], high: &[i64], interior: &[i64]) -> Result<Tensor> {
        let rank = self.rank();
        let ok = value.rank() == 0
            && value.dtype() == self.dtype()
            && low.len() == rank
            && high.len() == rank
            && interior.len() == rank
            && (0..rank).all(|i| low[i] >= 0 && high[i] >= 0 && interior[i] >= 0);
        if !ok {
            return Err(Error::trace(
                "pad",
                format!(
                    "low {low:?}, high {high:?}, interior {interior:?} do not fit {} (value {})",
                    self.ty, value.ty
                ),
            ));
        }
        let dims: Vec<i64> = (0..rank)
            .map(|i| {
                let n = self.dims()[i];
                low[i] + high[i] + n + (n - 1).max(0) * interior[i]
            })
            .collect();
        let op = Op::Pad(Pad {
            low: low.to_vec(),
            high: high.to_vec(),
            interior: interior.to_vec(),
        });
        self.graph
            .apply(op, &[self, value], TensorType::new(self.dtype(), dims))
    }

    /// Reverses the order of elements along `dimensions`.
    pub fn reverse(&self, dimensions: &[usize]) -> Result<Tensor> {
        if dimensions.iter().any(|&d| d >= self.rank()) {
            return Err(Error::trace(
                "reverse",
                format!("dimensions {dimensions:?} are out of range for {}", self.ty),
            ));
        }
        let op = Op::Reverse(Reverse {
            dimensions: dimensions.to_vec(),
        });
        self.graph.apply(op, &[self], self.ty.clone())
    }
}

impl Rule for BroadcastInDim {
    fn name(&self) -> &'static str {
        "broadcast_in_dim"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let dims: Vec<i64> = self.dimensions.iter().map(|&d| d as i64).collect();
        ctx.generic(
            "stablehlo.broadcast_in_dim",
            &format!("broadcast_dimensions = {}", i64_array(&dims)),
            &[],
        );
        Ok(())
    }

    /// Sums over the new and the stretched dimensions.
    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (x, g) = (&args.inputs[0], args.cotangent(0)?);
        let out_dims = g.dims().to_vec();
        let kept: Vec<usize> = self
            .dimensions
            .iter()
            .zip(x.dims())
            .filter(|&(&d, &size)| size == out_dims[d])
            .map(|(&d, _)| d)
            .collect();
        let summed: Vec<usize> = (0..out_dims.len()).filter(|d| !kept.contains(d)).collect();
        let reduced = g.sum(&summed)?;
        Ok(vec![Some(reduced.reshape(x.dims())?)])
    }
}

impl Rule for Reshape {
    fn name(&self) -> &'static str {
        "reshape"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic("stablehlo.reshape", "", &[]);
        Ok(())
    }

    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(args.cotangent(0)?.reshape(args.inputs[0].dims())?)])
    }
}

impl Rule for Transpose {
    fn name(&self) -> &'static str {
        "transpose"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let perm: Vec<i64> = self.permutation.iter().map(|&p| p as i64).collect();
        ctx.generic(
            "stablehlo.transpose",
            &format!("permutation = {}", i64_array(&perm)),
            &[],
        );
        Ok(())
    }

    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let mut inverse = vec![0; self.permutation.len()];
        for (i, &p) in self.permutation.iter().enumerate() {
            inverse[p] = i;
        }
        Ok(vec![Some(args.cotangent(0)?.transpose(&inverse)?)])
    }
}

impl Rule for Slice {
    fn name(&self) -> &'static str {
        "slice"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic(
            "stablehlo.slice",
            &format!(
                "start_indices = {}, limit_indices = {}, strides = {}",
                i64_array(&self.start),
                i64_array(&self.limit),
                i64_array(&self.strides)
            ),
            &[],
        );
        Ok(())
    }

    /// Pads the cotangent back into place with zeros.
    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (x, g) = (&args.inputs[0], args.cotangent(0)?);
        if g.tensor_type().element_count() == 0 {
            return Ok(vec![Some(x.zeros_like()?)]);
        }
        let high: Vec<i64> = (0..x.rank())
            .map(|i| x.dims()[i] - (self.start[i] + (g.dims()[i] - 1) * self.strides[i] + 1))
            .collect();
        let interior: Vec<i64> = self.strides.iter().map(|s| s - 1).collect();
        let zero = g.scalar_like(0.0)?;
        Ok(vec![Some(g.pad(&zero, &self.start, &high, &interior)?)])
    }
}

impl Rule for DynamicSlice {
    fn name(&self) -> &'static str {
        "dynamic_slice"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic(
            "stablehlo.dynamic_slice",
            &format!("slice_sizes = {}", i64_array(&self.sizes)),
            &[],
        );
        Ok(())
    }

    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (x, g) = (&args.inputs[0], args.cotangent(0)?);
        let starts: Vec<&Tensor> = args.inputs[1..].iter().collect();
        let mut out = vec![Some(x.zeros_like()?.dynamic_update_slice(&g, &starts)?)];
        out.extend(starts.iter().map(|_| None));
        Ok(out)
    }
}

impl Rule for DynamicUpdateSlice {
    fn name(&self) -> &'static str {
        "dynamic_update_slice"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic("stablehlo.dynamic_update_slice", "", &[]);
        Ok(())
    }

    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (update, g) = (&args.inputs[1], args.cotangent(0)?);
        let starts: Vec<&Tensor> = args.inputs[2..].iter().collect();
        let d_operand = g.dynamic_update_slice(&update.zeros_like()?, &starts)?;
        let d_update = g.dynamic_slice(&starts, update.dims())?;
        let mut out = vec![Some(d_operand), Some(d_update)];
        out.extend(starts.iter().map(|_| None));
        Ok(out)
    }
}

impl Rule for Concatenate {
    fn name(&self) -> &'static str {
        "concatenate"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic(
            "stablehlo.concatenate",
            &format!("dimension = {} : i64", self.axis),
            &[],
        );
        Ok(())
    }

    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let g = args.cotangent(0)?;
        let mut offset = 0;
        args.inputs
            .iter()
            .map(|x| {
                let size = x.dims()[self.axis];
                let piece = g.slice_axis(self.axis, offset, offset + size)?;
                offset += size;
                Ok(Some(piece))
            })
            .collect()
    }
}

impl Rule for Pad {
    fn name(&self) -> &'static str {
        "pad"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic(
            "stablehlo.pad",
            &format!(
                "edge_padding_low = {}, edge_padding_high = {}, interior_padding = {}",
                i64_array(&self.low),
                i64_array(&self.high),
                i64_array(&self.interior)
            ),
            &[],
        );
        Ok(())
    }

    /// The operand's cotangent is the strided slice it came from; the
    /// padding value's is the sum over all padded positions.
    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (x, g) = (&args.inputs[0], args.cotangent(0)?);
        let rank = x.rank();
        let strides: Vec<i64> = self.interior.iter().map(|i| i + 1).collect();
        let limit: Vec<i64> = (0..rank)
            .map(|i| self.low[i] + (x.dims()[i] - 1).max(0) * strides[i] + i64::from(x.dims()[i] > 0))
            .collect();
        let dx = g.slice(&self.low, &limit, &strides)?;
        let all: Vec<usize> = (0..rank).collect();
        let d_value = g.sum(&all)?.sub(&dx.sum(&all)?)?;
        Ok(vec![Some(dx), Some(d_value)])
    }
}

impl Rule for Reverse {
    fn name(&self) -> &'static str {
        "reverse"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let dims: Vec<i64> = self.dimensions.iter().map(|&d| d as i64).collect();
        ctx.generic("stablehlo.reverse", &format!("dimensions = {}", i64_array(&dims)), &[]);
        Ok(())
    }

    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![Some(args.cotangent(0)?.reverse(&self.dimensions)?)])
    }
}
