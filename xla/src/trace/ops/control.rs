//! Control and sampling ops: stable sort with its permutation, `while`
//! loops over traced sub-graphs (and counted `fori_loop`s on top), explicit
//! threaded random bits (and uniform floats from them), and
//! `stop_gradient`.
//!
//! Regions (sort comparators, loop conditions and bodies) are traced into
//! fresh [`Graph`]s whose parameters are the region's arguments, frozen into
//! optimized [`Body`]s and emitted by the same code as the top-level body.

use std::hash::{Hash, Hasher};
use std::rc::Rc;

use crate::dtype::{ElementType, TensorType};
use crate::error::{Error, Result};
use crate::trace::emit::{EmitCtx, Emitter};
use crate::trace::graph::{Graph, Tensor};
use crate::trace::op::{Op, Rule, VjpArgs};
use crate::trace::optimize::Body;

/// A stable sort of every operand along `dimension`, ordered by operand 0
/// (the key); the other operands are permuted alongside it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Sort {
    pub dimension: usize,
    pub descending: bool,
}

/// `while cond(carried) { carried = body(carried) }` over the operands.
/// Two loops are equal only if they share their sub-graphs, so common
/// subexpression merging never fuses distinct loops.
#[derive(Debug, Clone)]
pub(crate) struct While {
    pub cond: Rc<Body>,
    pub body: Rc<Body>,
}

/// Random bits from an explicit THREE_FRY state: outputs the next state and
/// the bits.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct RngBitGenerator;

/// The identity, with no gradient.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct StopGradient;

/// The identity on several values that the compiler does not see through
/// (StableHLO's `optimization_barrier`): what is computed from its outputs
/// is never merged with what is computed from its inputs, and waits for all
/// of them. Equal only to itself, so two barriers are never merged either.
#[derive(Debug, Clone)]
pub(crate) struct OptimizationBarrier(Rc<()>);

impl PartialEq for OptimizationBarrier {
    fn eq(&self, other: &Self) -> bool {
        Rc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for OptimizationBarrier {}

impl Hash for OptimizationBarrier {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Rc::as_ptr(&self.0).hash(state);
    }
}

/// `values` through one [`OptimizationBarrier`]: the same values, which the
/// compiler may neither merge with their sources' users nor compute from
/// before all of `values` exist. The gradient passes through unchanged.
pub fn optimization_barrier(values: &[&Tensor]) -> Result<Vec<Tensor>> {
    let first = values
        .first()
        .ok_or_else(|| Error::trace("optimization_barrier", "needs at least one value"))?;
    let types = values.iter().map(|t| t.ty.clone()).collect();
    first
        .graph
        .apply_multi(Op::OptimizationBarrier(OptimizationBarrier(Rc::new(()))), values, types)
}

impl PartialEq for While {
    fn eq(&self, other: &Self) -> bool {
        Rc::ptr_eq(&self.cond, &other.cond) && Rc::ptr_eq(&self.body, &other.body)
    }
}

impl Eq for While {}

impl Hash for While {
    fn hash<H: Hasher>(&self, state: &mut H) {
        Rc::as_ptr(&self.cond).hash(state);
        Rc::as_ptr(&self.body).hash(state);
    }
}

fn type_list<'a>(types: impl IntoIterator<Item = &'a TensorType>) -> String {
    types
        .into_iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks that `what` returned exactly the types `want`, naming the first
/// mismatch.
fn check_results(op: &'static str, what: &str, got: &[Tensor], want: &[TensorType]) -> Result<()> {
    let got_types: Vec<&TensorType> = got.iter().map(Tensor::tensor_type).collect();
    if got_types.len() == want.len() && got_types.iter().zip(want).all(|(g, w)| *g == w) {
        return Ok(());
    }
    let detail = match got_types.iter().zip(want).position(|(g, w)| *g != w) {
        Some(i) if got_types.len() == want.len() => format!("output {i} is {}, not {}", got_types[i], want[i]),
        _ => format!("{} values instead of {}", got_types.len(), want.len()),
    };
    Err(Error::trace(
        op,
        format!(
            "{what} must return ({}) but returned ({}): {detail}",
            type_list(want),
            type_list(got_types)
        ),
    ))
}

/// Traces `f` into a fresh graph `name` with one parameter per type of
/// `parameters`, checks it returns `results` (when given), and freezes it
/// into an optimized body (the graph takes no more ops afterwards).
pub(crate) fn trace_body(
    op: &'static str,
    name: String,
    parameters: &[TensorType],
    results: Option<&[TensorType]>,
    f: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Body> {
    let graph = Graph::new(&name);
    let arguments = parameters
        .iter()
        .map(|t| graph.parameter(t.dtype, &t.dims))
        .collect::<Result<Vec<_>>>()?;
    let outputs = f(&arguments)?;
    for (i, output) in outputs.iter().enumerate() {
        if !Rc::ptr_eq(&graph.data, &output.graph.data) {
            return Err(Error::trace(
                op,
                format!(
                    "output {i} of `{name}` is a tensor of graph `{}`; a region can only return values computed \
                     from its parameters (a loop's carried values: carry outer tensors in `init`)",
                    output.graph.name()
                ),
            ));
        }
    }
    if let Some(results) = results {
        check_results(op, &format!("`{name}`"), &outputs, results)?;
    }
    let mut data = graph.data.borrow_mut();
    if data.parameters.len() != parameters.len() {
        return Err(Error::trace(
            op,
            format!(
                "`{name}` added parameters of its own; its parameters are fixed ({})",
                type_list(parameters)
            ),
        ));
    }
    data.finished = true;
    Ok(Body {
        nodes: data.nodes.clone(),
        parameters: data.parameters.clone(),
        outputs: outputs.iter().map(|t| t.id).collect(),
    }
    .optimized())
}

fn emit_region(e: &mut Emitter, body: &Body) -> Result<String> {
    e.region(&body.nodes, &body.parameters, &body.outputs)
}

fn pred_scalar() -> TensorType {
    TensorType::new(ElementType::Pred, [])
}

/// Adds a sort node over `operands` (same graph, same dimensions).
fn sorted(operands: &[&Tensor], sort: Sort) -> Result<Vec<Tensor>> {
    let types = operands.iter().map(|t| t.ty.clone()).collect();
    operands[0].graph.apply_multi(Op::Sort(sort), operands, types)
}

impl Tensor {
    /// Stable sort along `axis`, ascending or `descending`; NaNs go last in
    /// both orders. Returns the sorted values and, as `s32`, the index along
    /// `axis` each came from. The gradient flows back through the
    /// permutation.
    pub fn sort(&self, axis: usize, descending: bool) -> Result<(Tensor, Tensor)> {
        if axis >= self.rank() || self.dims()[axis] > i64::from(i32::MAX) {
            return Err(Error::trace(
                "sort",
                format!(
                    "axis {axis} is out of range for {} (or too long for s32 indices)",
                    self.ty
                ),
            ));
        }
        let iota = self.graph.iota(ElementType::S32, self.dims(), axis)?;
        let mut out = sorted(
            &[self, &iota],
            Sort {
                dimension: axis,
                descending,
            },
        )?;
        let indices = out.remove(1);
        Ok((out.remove(0), indices))
    }

    /// The same value, through which no gradient flows (emits nothing).
    pub fn stop_gradient(&self) -> Result<Tensor> {
        self.graph
            .apply(Op::StopGradient(StopGradient), &[self], self.ty.clone())
    }
}

impl Sort {
    /// The comparator over scalar pairs `(lhs_i, rhs_i)` of operands of
    /// `dtypes`: whether `lhs_0` goes before `rhs_0`.
    fn comparator(&self, dtypes: &[ElementType]) -> Result<Body> {
        let arguments: Vec<TensorType> = dtypes
            .iter()
            .flat_map(|&d| [TensorType::new(d, []), TensorType::new(d, [])])
            .collect();
        let key = dtypes[0];
        trace_body(
            "sort",
            "sort comparator".to_string(),
            &arguments,
            Some(&[pred_scalar()]),
            |p| {
                let (a, b) = (&p[0], &p[1]);
                let before = if self.descending { a.gt(b)? } else { a.lt(b)? };
                if !key.is_float() {
                    return Ok(vec![before]);
                }
                // A number goes before a NaN (`x != x`), so NaNs end up last.
                let nan_after = b.ne(b)?.and(&a.eq(a)?)?;
                Ok(vec![before.or(&nan_after)?])
            },
        )
    }
}

impl Rule for Sort {
    fn name(&self) -> &'static str {
        "sort"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let dtypes: Vec<ElementType> = ctx.operand_types.iter().map(|t| t.dtype).collect();
        let region = emit_region(ctx.e, &self.comparator(&dtypes)?)?;
        ctx.generic(
            "stablehlo.sort",
            &format!("dimension = {} : i64, is_stable = true", self.dimension),
            &[region],
        );
        Ok(())
    }

    /// Output `j` along the axis is input `perm[j]`, so each cotangent goes
    /// back to its place by sorting it with `perm` as the (ascending) key.
    /// The permutation is the key sorted with an iota; merging makes it the
    /// forward sort itself when that already carried one.
    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let key = &args.inputs[0];
        let iota = key.graph.iota(ElementType::S32, key.dims(), self.dimension)?;
        let perm = sorted(&[key, &iota], self.clone())?.remove(1);
        let mut operands = vec![&perm];
        operands.extend(args.cotangents.iter().flatten());
        let unsort = Sort {
            dimension: self.dimension,
            descending: false,
        };
        let mut unsorted = sorted(&operands, unsort)?.into_iter().skip(1);
        Ok(args
            .cotangents
            .iter()
            .map(|g| g.as_ref().and_then(|_| unsorted.next()))
            .collect())
    }
}

/// Runs `body` on the carried values while `cond` holds, starting from
/// `init`; returns the final carried values.
///
/// `cond` and `body` are traced once, each into a fresh graph whose
/// parameters are the carried values: tensors of the enclosing graph cannot
/// be used inside (carry them in `init`). `cond` returns a `pred` scalar;
/// `body` returns values of exactly the carried types. There is no gradient
/// through a loop.
pub fn while_loop(
    init: &[&Tensor],
    cond: impl FnOnce(&[Tensor]) -> Result<Tensor>,
    body: impl FnOnce(&[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    let first = init
        .first()
        .ok_or_else(|| Error::trace("while", "needs at least one carried value".to_string()))?;
    for t in init {
        first.same_graph(t, "while")?;
    }
    let types: Vec<TensorType> = init.iter().map(|t| t.ty.clone()).collect();
    let outer = first.graph.name();
    let cond = trace_body(
        "while",
        format!("{outer}/while_cond"),
        &types,
        Some(&[pred_scalar()]),
        |c| Ok(vec![cond(c)?]),
    )?;
    let body = trace_body("while", format!("{outer}/while_body"), &types, Some(&types), body)?;
    let op = Op::While(While {
        cond: Rc::new(cond),
        body: Rc::new(body),
    });
    first.graph.apply_multi(op, init, types)
}

/// Runs `body(i, carried)` for `i = 0, 1, …, count - 1` (an `s32` scalar),
/// starting from `init`; returns the final carried values. Built on
/// [`while_loop`] with the counter as an extra carried value.
pub fn fori_loop(
    count: i64,
    init: &[&Tensor],
    body: impl FnOnce(&Tensor, &[Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Vec<Tensor>> {
    let fail = |message: String| Err(Error::trace("fori_loop", message));
    if !(0..=i64::from(i32::MAX)).contains(&count) {
        return fail(format!("count {count} must be in 0..=2^31-1 (the counter is s32)"));
    }
    let Some(first) = init.first() else {
        return fail("needs at least one carried value".to_string());
    };
    let types: Vec<TensorType> = init.iter().map(|t| t.ty.clone()).collect();
    let zero = first.graph.scalar(0.0, ElementType::S32)?;
    let mut carried = vec![&zero];
    carried.extend_from_slice(init);
    let mut out = while_loop(
        &carried,
        |c| c[0].lt(&c[0].scalar_like(count as f64)?),
        |c| {
            let next = body(&c[0], &c[1..])?;
            check_results("fori_loop", "the fori_loop body", &next, &types)?;
            let mut all = vec![c[0].add_scalar(1.0)?];
            all.extend(next);
            Ok(all)
        },
    )?;
    out.remove(0);
    Ok(out)
}

/// THREE_FRY random bits: from a `u64[2]` `state`, the next state and `u32`
/// bits of `dims`. The same state always gives the same bits; thread the
/// new state into the next draw.
pub fn rng_bit_generator(state: &Tensor, dims: &[i64]) -> Result<(Tensor, Tensor)> {
    let state_type = TensorType::new(ElementType::U64, [2]);
    if *state.tensor_type() != state_type || dims.iter().any(|&d| d < 0) {
        return Err(Error::trace(
            "rng_bit_generator",
            format!(
                "needs a {state_type} state and non-negative dims, got {} and {dims:?}",
                state.ty
            ),
        ));
    }
    let bits = TensorType::new(ElementType::U32, dims);
    let mut out = state
        .graph
        .apply_multi(Op::RngBitGenerator(RngBitGenerator), &[state], vec![state_type, bits])?;
    let bits = out.remove(1);
    Ok((out.remove(0), bits))
}

/// Uniform floats of `dtype` in `[0, 1)` with `dims` from a `u64[2]`
/// `state`; returns the next state and the values. The top 23 random bits
/// become the mantissa of an `f32` in `[1, 2)`, minus one; narrower types
/// are kept below 1 after rounding.
pub fn uniform(state: &Tensor, dims: &[i64], dtype: ElementType) -> Result<(Tensor, Tensor)> {
    // The largest value below 1, where rounding from f32 could reach 1.
    let below_one = match dtype {
        ElementType::F16 => Some(1.0 - 2f64.powi(-11)),
        ElementType::Bf16 => Some(1.0 - 2f64.powi(-8)),
        ElementType::F32 | ElementType::F64 => None,
        other => {
            return Err(Error::trace("uniform", format!("needs a float dtype, got {other}")));
        }
    };
    let (next, bits) = rng_bit_generator(state, dims)?;
    let mantissa = bits.shift_right_logical(&bits.scalar_like(9.0)?)?;
    let one_to_two = mantissa
        .or(&bits.scalar_like(f64::from(1.0f32.to_bits()))?)?
        .bitcast(ElementType::F32)?;
    let values = one_to_two.add_scalar(-1.0)?.convert(dtype)?;
    let values = match below_one {
        Some(top) => values.minimum(&values.scalar_like(top)?)?,
        None => values,
    };
    Ok((next, values))
}

impl Rule for While {
    fn name(&self) -> &'static str {
        "while"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let cond = emit_region(ctx.e, &self.cond)?;
        let body = emit_region(ctx.e, &self.body)?;
        ctx.generic("stablehlo.while", "", &[cond, body]);
        Ok(())
    }

    fn vjp(&self, _: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        Err(Error::NoGradient { op: "while" })
    }
}

impl Rule for RngBitGenerator {
    fn name(&self) -> &'static str {
        "rng_bit_generator"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic(
            "stablehlo.rng_bit_generator",
            "rng_algorithm = #stablehlo<rng_algorithm THREE_FRY>",
            &[],
        );
        Ok(())
    }

    /// Integer in, integers out: nothing to differentiate.
    fn vjp(&self, _: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![None])
    }
}

impl Rule for OptimizationBarrier {
    fn name(&self) -> &'static str {
        "optimization_barrier"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic("stablehlo.optimization_barrier", "", &[]);
        Ok(())
    }

    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        Ok(args.cotangents.to_vec())
    }
}

impl Rule for StopGradient {
    fn name(&self) -> &'static str {
        "stop_gradient"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.alias_operand(0);
        Ok(())
    }

    fn vjp(&self, _: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![None])
    }
}
