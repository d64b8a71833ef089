//! Indexed reads and writes: `gather` (slices at run-time start indices),
//! `scatter_add` (updates summed into slices at run-time start indices),
//! `scatter` (slices overwritten by the updates), and the model helpers
//! built on gather: `take` (embedding lookup) and `take_along_axis`.
//!
//! Gather and scatter-add are each other's transpose: the VJP of a gather
//! scatter-adds its cotangent into zeros, and that of a scatter-add passes
//! the cotangent to the operand and gathers it for the updates. A replacing
//! scatter passes the operand the cotangent with the overwritten windows
//! zeroed. Indices are integers and get no gradient. They are expected in
//! range: XLA clamps gather starts into the operand but skips scatter
//! updates that fall outside it, so only in-range indices give gradients
//! that match (and a replacing scatter's need distinct windows).

use crate::dtype::{ElementType, TensorType};
use crate::error::{Error, Result};
use crate::trace::emit::{EmitCtx, i64_array, i64_list};
use crate::trace::graph::Tensor;
use crate::trace::op::{Op, Rule, VjpArgs};

/// Dimension numbers of [`Tensor::gather`]: StableHLO's, without batching
/// dimensions.
///
/// Every index vector of the indices (a vector along `index_vector_dim`)
/// gives the start of one slice of the operand. The output's dimensions
/// are the indices' other (batch) dimensions, in order, with the slice's
/// dimensions that are not collapsed placed at `offset_dims`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GatherDims {
    /// Output dimensions holding the slice's non-collapsed dimensions, increasing.
    pub offset_dims: Vec<usize>,
    /// Operand dimensions of slice size 1 left out of the output, increasing.
    pub collapsed_slice_dims: Vec<usize>,
    /// The operand dimension that entry `i` of an index vector is the start in.
    pub start_index_map: Vec<usize>,
    /// The indices dimension holding index vectors; the indices' rank when
    /// each index is a scalar (a vector of one).
    pub index_vector_dim: usize,
}

/// Dimension numbers of [`Tensor::scatter_add`] and [`Tensor::scatter`]:
/// StableHLO's, without batching dimensions.
///
/// Every index vector of the indices gives the start of one window of the
/// operand, into which the matching window of the updates is added. The
/// updates' dimensions are the indices' batch dimensions (in order) and the
/// window's dimensions at `update_window_dims`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ScatterDims {
    /// Updates dimensions holding the window's dimensions, increasing.
    pub update_window_dims: Vec<usize>,
    /// Operand dimensions of window size 1 that the updates leave out, increasing.
    pub inserted_window_dims: Vec<usize>,
    /// The operand dimension that entry `i` of an index vector is the start in.
    pub scatter_dims_to_operand_dims: Vec<usize>,
    /// The indices dimension holding index vectors; the indices' rank when
    /// each index is a scalar (a vector of one).
    pub index_vector_dim: usize,
}

/// Slices of operand 0 at the start indices of operand 1.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Gather {
    pub dims: GatherDims,
    pub slice_sizes: Vec<i64>,
}

/// How a scatter combines an update with the operand's value it lands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Combine {
    /// The sum of both.
    Add,
    /// The update.
    Replace,
}

/// Operand 0 with windows of operand 2 combined in at the start indices of operand 1.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Scatter {
    pub dims: ScatterDims,
    pub combine: Combine,
}

/// Strictly increasing dimensions below `bound`.
fn increasing(dims: &[usize], bound: usize) -> bool {
    dims.windows(2).all(|w| w[0] < w[1]) && dims.iter().all(|&d| d < bound)
}

/// Distinct dimensions below `bound`.
fn distinct(dims: &[usize], bound: usize) -> bool {
    let mut seen = vec![false; bound];
    dims.iter()
        .all(|&d| d < bound && !std::mem::replace(&mut seen[d], true))
}

/// The batch dimensions of `indices` (all but `index_vector_dim`) and the
/// length of its index vectors; `None` when `index_vector_dim` is past its rank.
fn index_vectors(indices: &TensorType, index_vector_dim: usize) -> Option<(Vec<i64>, usize)> {
    let rank = indices.dims.len();
    if index_vector_dim > rank {
        return None;
    }
    let batch = (0..rank)
        .filter(|&d| d != index_vector_dim)
        .map(|d| indices.dims[d])
        .collect();
    let length = indices.dims.get(index_vector_dim).map_or(1, |&n| n as usize);
    Some((batch, length))
}

/// `[1, 2]` for a list of dimensions.
fn dims_list(dims: &[usize]) -> String {
    i64_list(&dims.iter().map(|&d| d as i64).collect::<Vec<_>>())
}

impl GatherDims {
    /// The scatter that writes back where this gather reads (its transpose).
    fn transposed(&self) -> ScatterDims {
        ScatterDims {
            update_window_dims: self.offset_dims.clone(),
            inserted_window_dims: self.collapsed_slice_dims.clone(),
            scatter_dims_to_operand_dims: self.start_index_map.clone(),
            index_vector_dim: self.index_vector_dim,
        }
    }
}

impl ScatterDims {
    /// The gather that reads where this scatter writes (its transpose).
    fn transposed(&self) -> GatherDims {
        GatherDims {
            offset_dims: self.update_window_dims.clone(),
            collapsed_slice_dims: self.inserted_window_dims.clone(),
            start_index_map: self.scatter_dims_to_operand_dims.clone(),
            index_vector_dim: self.index_vector_dim,
        }
    }
}

impl Gather {
    /// The result type, or an error naming the dimension numbers that do not fit.
    fn infer(&self, operand: &TensorType, indices: &TensorType) -> Result<TensorType> {
        let d = &self.dims;
        let fail = |why: String| Error::Trace {
            op: "gather",
            message: format!(
                "{why} (operand {operand}, indices {indices}, {d:?}, slice_sizes {:?})",
                self.slice_sizes
            ),
        };
        let rank = operand.dims.len();
        if !indices.dtype.is_integer() {
            return Err(fail("indices must be integers".to_string()));
        }
        let (batch, length) = index_vectors(indices, d.index_vector_dim)
            .ok_or_else(|| fail("index_vector_dim is past the indices' rank".to_string()))?;
        if d.start_index_map.len() != length || !distinct(&d.start_index_map, rank) {
            return Err(fail(format!(
                "start_index_map must name {length} distinct operand dimensions"
            )));
        }
        let sizes = &self.slice_sizes;
        if sizes.len() != rank || (0..rank).any(|i| sizes[i] < 0 || sizes[i] > operand.dims[i]) {
            return Err(fail(
                "slice_sizes must give one size per operand dimension, within it".to_string(),
            ));
        }
        let collapsed = &d.collapsed_slice_dims;
        if !increasing(collapsed, rank) || collapsed.iter().any(|&c| sizes[c] != 1) {
            return Err(fail(
                "collapsed_slice_dims must be increasing operand dimensions of slice size 1".to_string(),
            ));
        }
        let kept: Vec<i64> = (0..rank).filter(|i| !collapsed.contains(i)).map(|i| sizes[i]).collect();
        let out_rank = batch.len() + kept.len();
        if d.offset_dims.len() != kept.len() || !increasing(&d.offset_dims, out_rank) {
            return Err(fail(format!(
                "offset_dims must be {} increasing dimensions of the rank-{out_rank} output",
                kept.len()
            )));
        }
        let (mut kept, mut batch) = (kept.into_iter(), batch.into_iter());
        let dims: Vec<i64> = (0..out_rank)
            .map(|i| {
                let next = if d.offset_dims.contains(&i) {
                    kept.next()
                } else {
                    batch.next()
                };
                next.expect("counts checked above")
            })
            .collect();
        Ok(TensorType::new(operand.dtype, dims))
    }
}

impl Scatter {
    /// The result type (the operand's), or an error naming what does not fit.
    fn infer(&self, operand: &TensorType, indices: &TensorType, updates: &TensorType) -> Result<TensorType> {
        let d = &self.dims;
        let fail = |why: String| Error::Trace {
            op: self.name(),
            message: format!("{why} (operand {operand}, indices {indices}, updates {updates}, {d:?})"),
        };
        let rank = operand.dims.len();
        if operand.dtype != updates.dtype {
            return Err(fail("operand and updates have different dtypes".to_string()));
        }
        if !indices.dtype.is_integer() {
            return Err(fail("indices must be integers".to_string()));
        }
        let (batch, length) = index_vectors(indices, d.index_vector_dim)
            .ok_or_else(|| fail("index_vector_dim is past the indices' rank".to_string()))?;
        if d.scatter_dims_to_operand_dims.len() != length || !distinct(&d.scatter_dims_to_operand_dims, rank) {
            return Err(fail(format!(
                "scatter_dims_to_operand_dims must name {length} distinct operand dimensions"
            )));
        }
        let window = &d.update_window_dims;
        let inserted = &d.inserted_window_dims;
        if !increasing(window, updates.dims.len())
            || !increasing(inserted, rank)
            || window.len() + inserted.len() != rank
        {
            return Err(fail(format!(
                "update_window_dims (increasing updates dimensions) and inserted_window_dims (increasing operand dimensions) must together count the operand's {rank} dimensions"
            )));
        }
        let scatter: Vec<i64> = (0..updates.dims.len())
            .filter(|i| !window.contains(i))
            .map(|i| updates.dims[i])
            .collect();
        if scatter != batch {
            return Err(fail(format!(
                "the updates' scatter dimensions {scatter:?} must equal the indices' batch dimensions {batch:?}"
            )));
        }
        let fits = (0..rank)
            .filter(|i| !inserted.contains(i))
            .zip(window)
            .all(|(o, &w)| updates.dims[w] <= operand.dims[o]);
        if !fits {
            return Err(fail("an update window is larger than the operand".to_string()));
        }
        Ok(operand.clone())
    }
}

impl Tensor {
    /// General gather (StableHLO semantics, no batching dimensions): for
    /// each index vector of `indices`, the slice of `slice_sizes` starting
    /// there, laid out as [`GatherDims`] describes. Starts are clamped so
    /// the slice stays inside.
    pub fn gather(&self, indices: &Tensor, dims: &GatherDims, slice_sizes: &[i64]) -> Result<Tensor> {
        self.same_graph(indices, "gather")?;
        let op = Gather {
            dims: dims.clone(),
            slice_sizes: slice_sizes.to_vec(),
        };
        let ty = op.infer(&self.ty, &indices.ty)?;
        self.graph.apply(Op::Gather(op), &[self, indices], ty)
    }

    /// This tensor with each window of `updates` added at the start given
    /// by its index vector of `indices` (StableHLO scatter with an add
    /// region, no batching dimensions); repeated indices accumulate and
    /// windows that fall outside are skipped.
    pub fn scatter_add(&self, indices: &Tensor, updates: &Tensor, dims: &ScatterDims) -> Result<Tensor> {
        self.scatter_with(indices, updates, dims, Combine::Add)
    }

    /// This tensor with each window of `updates` written over the window at
    /// the start given by its index vector of `indices` (StableHLO scatter
    /// returning the update); windows that fall outside are skipped, so an
    /// out-of-range index (−1, say) writes nothing. Windows should not
    /// overlap: which of two overlapping updates wins is unspecified.
    pub fn scatter(&self, indices: &Tensor, updates: &Tensor, dims: &ScatterDims) -> Result<Tensor> {
        self.scatter_with(indices, updates, dims, Combine::Replace)
    }

    fn scatter_with(&self, indices: &Tensor, updates: &Tensor, dims: &ScatterDims, combine: Combine) -> Result<Tensor> {
        let op = Scatter {
            dims: dims.clone(),
            combine,
        };
        self.same_graph(indices, op.name())?;
        self.same_graph(updates, op.name())?;
        let ty = op.infer(&self.ty, &indices.ty, &updates.ty)?;
        self.graph.apply(Op::Scatter(op), &[self, indices, updates], ty)
    }

    /// The entries at integer `indices` (any shape) along `axis`, as
    /// `numpy.take`: dimension `axis` is replaced by the indices'
    /// dimensions. An embedding lookup is `table.take(&ids, 0)`:
    /// `[V, D]` with ids `[B, T]` gives `[B, T, D]`.
    pub fn take(&self, indices: &Tensor, axis: usize) -> Result<Tensor> {
        let rank = self.rank();
        if axis >= rank {
            return Err(Error::Trace {
                op: "take",
                message: format!("axis {axis} is out of range for {}", self.ty),
            });
        }
        let n = indices.rank();
        let mut slice_sizes = self.dims().to_vec();
        slice_sizes[axis] = 1;
        let dims = GatherDims {
            offset_dims: (0..axis).chain(axis + n..rank - 1 + n).collect(),
            collapsed_slice_dims: vec![axis],
            start_index_map: vec![axis],
            index_vector_dim: n,
        };
        self.gather(indices, &dims, &slice_sizes)
    }

    /// The entries at integer `indices` along `axis`, as
    /// `numpy.take_along_axis`: `indices` has this tensor's rank and
    /// dimensions except along `axis`, and the result has the indices'
    /// shape (`[B, T, V]` logits with ids `[B, T, 1]` give `[B, T, 1]`).
    pub fn take_along_axis(&self, indices: &Tensor, axis: usize) -> Result<Tensor> {
        let rank = self.rank();
        let fits = axis < rank
            && indices.dtype().is_integer()
            && indices.rank() == rank
            && (0..rank).all(|i| i == axis || indices.dims()[i] == self.dims()[i]);
        if !fits {
            return Err(Error::Trace {
                op: "take_along_axis",
                message: format!(
                    "integer indices {} must have the rank and dimensions of {} except along axis {axis}",
                    indices.ty, self.ty
                ),
            });
        }
        // Positions count in the indices' dtype, at least 32 bits wide.
        let indices = match indices.dtype() {
            ElementType::S8 | ElementType::U8 => indices.convert(ElementType::S32)?,
            _ => indices.clone(),
        };
        // Full index tuples: the given index along `axis`, the position elsewhere.
        let mut column = indices.dims().to_vec();
        column.push(1);
        let parts = (0..rank)
            .map(|i| {
                if i == axis {
                    indices.reshape(&column)
                } else {
                    self.graph.iota(indices.dtype(), &column, i)
                }
            })
            .collect::<Result<Vec<Tensor>>>()?;
        let full = Tensor::concatenate(&parts.iter().collect::<Vec<_>>(), rank)?;
        let all: Vec<usize> = (0..rank).collect();
        let dims = GatherDims {
            offset_dims: Vec::new(),
            collapsed_slice_dims: all.clone(),
            start_index_map: all,
            index_vector_dim: rank,
        };
        self.gather(&full, &dims, &vec![1; rank])
    }
}

impl Rule for Gather {
    fn name(&self) -> &'static str {
        "gather"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let d = &self.dims;
        ctx.generic(
            "stablehlo.gather",
            &format!(
                "dimension_numbers = #stablehlo.gather<offset_dims = {}, collapsed_slice_dims = {}, start_index_map = {}, index_vector_dim = {}>, indices_are_sorted = false, slice_sizes = {}",
                dims_list(&d.offset_dims),
                dims_list(&d.collapsed_slice_dims),
                dims_list(&d.start_index_map),
                d.index_vector_dim,
                i64_array(&self.slice_sizes)
            ),
            &[],
        );
        Ok(())
    }

    /// The cotangent scatter-added into zeros where the slices came from.
    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (operand, indices, g) = (&args.inputs[0], &args.inputs[1], args.cotangent(0)?);
        let d_operand = operand
            .zeros_like()?
            .scatter_add(indices, &g, &self.dims.transposed())?;
        Ok(vec![Some(d_operand), None])
    }
}

impl Rule for Scatter {
    fn name(&self) -> &'static str {
        match self.combine {
            Combine::Add => "scatter_add",
            Combine::Replace => "scatter",
        }
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let d = &self.dims;
        let dtype = ctx.operand_types[0].dtype;
        let region = match self.combine {
            Combine::Add => ctx.e.reducer_region("stablehlo.add", dtype),
            Combine::Replace => ctx.e.second_argument_region(dtype),
        };
        ctx.generic(
            "stablehlo.scatter",
            &format!(
                "indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = {}, inserted_window_dims = {}, scatter_dims_to_operand_dims = {}, index_vector_dim = {}>, unique_indices = false",
                dims_list(&d.update_window_dims),
                dims_list(&d.inserted_window_dims),
                dims_list(&d.scatter_dims_to_operand_dims),
                d.index_vector_dim
            ),
            &[region],
        );
        Ok(())
    }

    /// The updates' cotangent is the cotangent gathered from the windows
    /// they landed on; the operand's passes through, with those windows
    /// zeroed when they were overwritten.
    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (indices, updates, g) = (&args.inputs[1], &args.inputs[2], args.cotangent(0)?);
        let d = &self.dims;
        let mut window = d.update_window_dims.iter().map(|&w| updates.dims()[w]);
        let slice_sizes: Vec<i64> = (0..g.rank())
            .map(|i| {
                if d.inserted_window_dims.contains(&i) {
                    1
                } else {
                    window.next().expect("counts checked when traced")
                }
            })
            .collect();
        let d_updates = g.gather(indices, &d.transposed(), &slice_sizes)?;
        let d_operand = match self.combine {
            Combine::Add => g,
            Combine::Replace => g.scatter(indices, &updates.zeros_like()?, d)?,
        };
        Ok(vec![Some(d_operand), None, Some(d_updates)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_shape_interleaves_batch_and_offset_dimensions() {
        let operand = TensorType::new(ElementType::F32, [7, 4, 5]);
        let indices = TensorType::new(ElementType::S32, [2, 2, 3]);
        let gather = Gather {
            dims: GatherDims {
                offset_dims: vec![1, 3],
                collapsed_slice_dims: vec![0],
                start_index_map: vec![0, 2],
                index_vector_dim: 1,
            },
            slice_sizes: vec![1, 4, 2],
        };
        // Batch dimensions [2, 3] at output 0 and 2, slice [4, 2] at 1 and 3.
        assert_eq!(gather.infer(&operand, &indices).unwrap().dims, [2, 4, 3, 2]);
        let floats = TensorType::new(ElementType::F32, [2, 2, 3]);
        let error = gather.infer(&operand, &floats).unwrap_err().to_string();
        assert!(error.starts_with("gather") && error.contains("integers"), "{error}");
    }

    #[test]
    fn scatter_shape_checks_windows_against_indices() {
        let operand = TensorType::new(ElementType::F32, [5, 3]);
        let indices = TensorType::new(ElementType::S32, [4]);
        let scatter = Scatter {
            dims: ScatterDims {
                update_window_dims: vec![1],
                inserted_window_dims: vec![0],
                scatter_dims_to_operand_dims: vec![0],
                index_vector_dim: 1,
            },
            combine: Combine::Add,
        };
        let updates = TensorType::new(ElementType::F32, [4, 3]);
        assert_eq!(scatter.infer(&operand, &indices, &updates).unwrap(), operand);
        let short = TensorType::new(ElementType::F32, [3, 3]);
        let error = scatter.infer(&operand, &indices, &short).unwrap_err().to_string();
        assert!(error.starts_with("scatter_add") && error.contains("[3]"), "{error}");
    }
}
