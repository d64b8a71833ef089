//! Elementwise ops: unary math, binary arithmetic with numpy-style
//! broadcasting, comparison, select, and dtype conversion.
//!
//! Binary ops broadcast at trace time (explicit `broadcast_in_dim` nodes),
//! so the emitted op always sees equal shapes and its VJP never reduces.

use crate::dtype::{ElementType, TensorType};
use crate::error::{Error, Result};
use crate::trace::emit::EmitCtx;
use crate::trace::graph::Tensor;
use crate::trace::op::{Op, Rule, VjpArgs};

/// A one-input op.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Unary {
    Neg,
    Exp,
    Log,
    Log1p,
    Tanh,
    Logistic,
    Sqrt,
    Rsqrt,
    Abs,
    Sign,
    Floor,
    Sin,
    Cos,
    Not,
}

/// A two-input op over equal shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    Pow,
    And,
    Or,
    Xor,
    ShiftLeft,
    ShiftRightLogical,
}

/// A comparison yielding `pred`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Compare {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

/// `pred ? on_true : on_false`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Select;

/// Conversion to another element type: by value, or by bits (same width).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Convert {
    pub to: ElementType,
    pub bitcast: bool,
}

/// The numpy broadcast of two shapes (aligned at the last dimension).
pub(crate) fn broadcast_shapes(a: &[i64], b: &[i64], op: &'static str) -> Result<Vec<i64>> {
    let rank = a.len().max(b.len());
    let pad = |s: &[i64]| -> Vec<i64> {
        std::iter::repeat_n(1, rank - s.len())
            .chain(s.iter().copied())
            .collect()
    };
    let (pa, pb) = (pad(a), pad(b));
    pa.iter()
        .zip(&pb)
        .map(|(&x, &y)| match (x, y) {
            _ if x == y => Ok(x),
            (1, _) => Ok(y),
            (_, 1) => Ok(x),
            _ => Err(Error::Trace {
                op,
                message: format!("shapes {a:?} and {b:?} do not broadcast"),
            }),
        })
        .collect()
}

impl Unary {
    fn name(self) -> &'static str {
        match self {
            Unary::Neg => "neg",
            Unary::Exp => "exp",
            Unary::Log => "log",
            Unary::Log1p => "log1p",
            Unary::Tanh => "tanh",
            Unary::Logistic => "logistic",
            Unary::Sqrt => "sqrt",
            Unary::Rsqrt => "rsqrt",
            Unary::Abs => "abs",
            Unary::Sign => "sign",
            Unary::Floor => "floor",
            Unary::Sin => "sin",
            Unary::Cos => "cos",
            Unary::Not => "not",
        }
    }

    fn stablehlo(self) -> &'static str {
        match self {
            Unary::Neg => "stablehlo.negate",
            Unary::Exp => "stablehlo.exponential",
            Unary::Log => "stablehlo.log",
            Unary::Log1p => "stablehlo.log_plus_one",
            Unary::Tanh => "stablehlo.tanh",
            Unary::Logistic => "stablehlo.logistic",
            Unary::Sqrt => "stablehlo.sqrt",
            Unary::Rsqrt => "stablehlo.rsqrt",
            Unary::Abs => "stablehlo.abs",
            Unary::Sign => "stablehlo.sign",
            Unary::Floor => "stablehlo.floor",
            Unary::Sin => "stablehlo.sine",
            Unary::Cos => "stablehlo.cosine",
            Unary::Not => "stablehlo.not",
        }
    }

    /// The dtype rule: math on floats, `neg`/`abs`/`sign` also on integers,
    /// `not` on integers and `pred`.
    fn infer(self, x: &TensorType) -> Result<TensorType> {
        let ok = match self {
            Unary::Neg | Unary::Abs | Unary::Sign => x.dtype != ElementType::Pred,
            Unary::Not => !x.dtype.is_float(),
            _ => x.dtype.is_float(),
        };
        if ok {
            Ok(x.clone())
        } else {
            Err(Error::Trace {
                op: self.name(),
                message: format!("does not apply to {x}"),
            })
        }
    }
}

impl Binary {
    fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
            Binary::Max => "max",
            Binary::Min => "min",
            Binary::Pow => "pow",
            Binary::And => "and",
            Binary::Or => "or",
            Binary::Xor => "xor",
            Binary::ShiftLeft => "shift_left",
            Binary::ShiftRightLogical => "shift_right_logical",
        }
    }

    fn stablehlo(self) -> &'static str {
        match self {
            Binary::Add => "stablehlo.add",
            Binary::Sub => "stablehlo.subtract",
            Binary::Mul => "stablehlo.multiply",
            Binary::Div => "stablehlo.divide",
            Binary::Max => "stablehlo.maximum",
            Binary::Min => "stablehlo.minimum",
            Binary::Pow => "stablehlo.power",
            Binary::And => "stablehlo.and",
            Binary::Or => "stablehlo.or",
            Binary::Xor => "stablehlo.xor",
            Binary::ShiftLeft => "stablehlo.shift_left",
            Binary::ShiftRightLogical => "stablehlo.shift_right_logical",
        }
    }

    /// Equal dtypes; bitwise ops on integers and `pred`, shifts on integers.
    fn infer(self, a: &TensorType, b: &TensorType) -> Result<TensorType> {
        let fail = |why: &str| Error::Trace {
            op: self.name(),
            message: format!("{why}: {a} and {b}"),
        };
        if a.dtype != b.dtype {
            return Err(fail("operands have different dtypes; convert one first"));
        }
        let ok = match self {
            Binary::And | Binary::Or | Binary::Xor => !a.dtype.is_float(),
            Binary::ShiftLeft | Binary::ShiftRightLogical => a.dtype.is_integer(),
            _ => a.dtype != ElementType::Pred,
        };
        if !ok {
            return Err(fail("does not apply to this dtype"));
        }
        Ok(TensorType::new(
            a.dtype,
            broadcast_shapes(&a.dims, &b.dims, self.name())?,
        ))
    }
}

impl Compare {
    fn direction(self) -> &'static str {
        match self {
            Compare::Eq => "EQ",
            Compare::Ne => "NE",
            Compare::Lt => "LT",
            Compare::Le => "LE",
            Compare::Gt => "GT",
            Compare::Ge => "GE",
        }
    }
}

impl Tensor {
    fn unary(&self, op: Unary) -> Result<Tensor> {
        let ty = op.infer(&self.ty)?;
        self.graph.apply(Op::Unary(op), &[self], ty)
    }

    /// Broadcasts both operands to their common shape, then applies `op`.
    fn binary(&self, other: &Tensor, op: Binary) -> Result<Tensor> {
        self.same_graph(other, op.name())?;
        let ty = op.infer(&self.ty, &other.ty)?;
        let a = self.broadcast_to(&ty.dims)?;
        let b = other.broadcast_to(&ty.dims)?;
        self.graph.apply(Op::Binary(op), &[&a, &b], ty)
    }

    fn compare(&self, other: &Tensor, op: Compare) -> Result<Tensor> {
        self.same_graph(other, "compare")?;
        if self.dtype() != other.dtype() {
            return Err(Error::Trace {
                op: "compare",
                message: format!("operands have different dtypes: {} and {}", self.ty, other.ty),
            });
        }
        let dims = broadcast_shapes(self.dims(), other.dims(), "compare")?;
        let a = self.broadcast_to(&dims)?;
        let b = other.broadcast_to(&dims)?;
        self.graph
            .apply(Op::Compare(op), &[&a, &b], TensorType::new(ElementType::Pred, dims))
    }

    /// `-x`.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary(Unary::Neg)
    }
    /// `e^x`.
    pub fn exp(&self) -> Result<Tensor> {
        self.unary(Unary::Exp)
    }
    /// Natural logarithm.
    pub fn log(&self) -> Result<Tensor> {
        self.unary(Unary::Log)
    }
    /// `log(1 + x)`, accurate near 0.
    pub fn log1p(&self) -> Result<Tensor> {
        self.unary(Unary::Log1p)
    }
    /// Hyperbolic tangent.
    pub fn tanh(&self) -> Result<Tensor> {
        self.unary(Unary::Tanh)
    }
    /// `1 / (1 + e^-x)`.
    pub fn logistic(&self) -> Result<Tensor> {
        self.unary(Unary::Logistic)
    }
    /// Square root.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary(Unary::Sqrt)
    }
    /// `1 / sqrt(x)`.
    pub fn rsqrt(&self) -> Result<Tensor> {
        self.unary(Unary::Rsqrt)
    }
    /// `|x|`.
    pub fn abs(&self) -> Result<Tensor> {
        self.unary(Unary::Abs)
    }
    /// -1, 0 or 1.
    pub fn sign(&self) -> Result<Tensor> {
        self.unary(Unary::Sign)
    }
    /// Rounds toward negative infinity.
    pub fn floor(&self) -> Result<Tensor> {
        self.unary(Unary::Floor)
    }
    /// Sine.
    pub fn sin(&self) -> Result<Tensor> {
        self.unary(Unary::Sin)
    }
    /// Cosine.
    pub fn cos(&self) -> Result<Tensor> {
        self.unary(Unary::Cos)
    }
    /// Logical (pred) or bitwise (integer) not.
    pub fn not(&self) -> Result<Tensor> {
        self.unary(Unary::Not)
    }
    /// `x²`.
    pub fn square(&self) -> Result<Tensor> {
        self.mul(self)
    }

    /// `x + y`, broadcasting.
    pub fn add(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Add)
    }
    /// `x - y`, broadcasting.
    pub fn sub(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Sub)
    }
    /// `x * y`, broadcasting.
    pub fn mul(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Mul)
    }
    /// `x / y`, broadcasting.
    pub fn div(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Div)
    }
    /// Elementwise maximum, broadcasting.
    pub fn maximum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Max)
    }
    /// Elementwise minimum, broadcasting.
    pub fn minimum(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Min)
    }
    /// `x ^ y`, broadcasting.
    pub fn pow(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Pow)
    }
    /// Logical or bitwise and.
    pub fn and(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::And)
    }
    /// Logical or bitwise or.
    pub fn or(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Or)
    }
    /// Logical or bitwise exclusive or.
    pub fn xor(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::Xor)
    }
    /// Integer shift left.
    pub fn shift_left(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::ShiftLeft)
    }
    /// Integer shift right, filling with zeros.
    pub fn shift_right_logical(&self, other: &Tensor) -> Result<Tensor> {
        self.binary(other, Binary::ShiftRightLogical)
    }

    /// `x + c`.
    pub fn add_scalar(&self, c: f64) -> Result<Tensor> {
        self.add(&self.scalar_like(c)?)
    }
    /// `x * c`.
    pub fn mul_scalar(&self, c: f64) -> Result<Tensor> {
        self.mul(&self.scalar_like(c)?)
    }
    /// `x ^ c`.
    pub fn pow_scalar(&self, c: f64) -> Result<Tensor> {
        self.pow(&self.scalar_like(c)?)
    }

    /// `x == y` (pred).
    pub fn eq(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, Compare::Eq)
    }
    /// `x != y` (pred).
    pub fn ne(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, Compare::Ne)
    }
    /// `x < y` (pred).
    pub fn lt(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, Compare::Lt)
    }
    /// `x <= y` (pred).
    pub fn le(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, Compare::Le)
    }
    /// `x > y` (pred).
    pub fn gt(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, Compare::Gt)
    }
    /// `x >= y` (pred).
    pub fn ge(&self, other: &Tensor) -> Result<Tensor> {
        self.compare(other, Compare::Ge)
    }

    /// `self ? on_true : on_false` for a `pred` tensor, broadcasting all three.
    pub fn select(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        self.same_graph(on_true, "select")?;
        self.same_graph(on_false, "select")?;
        if self.dtype() != ElementType::Pred || on_true.dtype() != on_false.dtype() {
            return Err(Error::Trace {
                op: "select",
                message: format!(
                    "needs a pred condition and equal branch dtypes, got {}, {} and {}",
                    self.ty, on_true.ty, on_false.ty
                ),
            });
        }
        let dims = broadcast_shapes(
            &broadcast_shapes(self.dims(), on_true.dims(), "select")?,
            on_false.dims(),
            "select",
        )?;
        let (p, t, f) = (
            self.broadcast_to(&dims)?,
            on_true.broadcast_to(&dims)?,
            on_false.broadcast_to(&dims)?,
        );
        self.graph.apply(
            Op::Select(Select),
            &[&p, &t, &f],
            TensorType::new(on_true.dtype(), dims),
        )
    }

    /// Converts values to `dtype` (rounding; floats to integers truncate).
    pub fn convert(&self, dtype: ElementType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let op = Op::Convert(Convert {
            to: dtype,
            bitcast: false,
        });
        self.graph.apply(op, &[self], TensorType::new(dtype, self.dims()))
    }

    /// Reinterprets the bits as `dtype`, which must have the same width.
    pub fn bitcast(&self, dtype: ElementType) -> Result<Tensor> {
        if dtype.byte_size() != self.dtype().byte_size() || dtype == ElementType::Pred {
            return Err(Error::Trace {
                op: "bitcast",
                message: format!("{} and {dtype} differ in width", self.dtype()),
            });
        }
        let op = Op::Convert(Convert {
            to: dtype,
            bitcast: true,
        });
        self.graph.apply(op, &[self], TensorType::new(dtype, self.dims()))
    }
}

impl Rule for Unary {
    fn name(&self) -> &'static str {
        Unary::name(*self)
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic(self.stablehlo(), "", &[]);
        Ok(())
    }

    /// Nonlinear rules reuse the forward output `y` where it is cheaper.
    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (x, y, g) = (&args.inputs[0], &args.outputs[0], args.cotangent(0)?);
        let dx = match self {
            Unary::Neg => g.neg()?,
            Unary::Exp => g.mul(y)?,
            Unary::Log => g.div(x)?,
            Unary::Log1p => g.div(&x.add_scalar(1.0)?)?,
            Unary::Tanh => g.mul(&y.square()?.neg()?.add_scalar(1.0)?)?,
            Unary::Logistic => g.mul(&y.mul(&y.neg()?.add_scalar(1.0)?)?)?,
            Unary::Sqrt => g.div(&y.mul_scalar(2.0)?)?,
            Unary::Rsqrt => g.mul(&y.div(x)?.mul_scalar(-0.5)?)?,
            Unary::Abs => g.mul(&x.sign()?)?,
            Unary::Sin => g.mul(&x.cos()?)?,
            Unary::Cos => g.mul(&x.sin()?.neg()?)?,
            Unary::Sign | Unary::Floor | Unary::Not => return Ok(vec![None]),
        };
        Ok(vec![Some(dx)])
    }
}

impl Rule for Binary {
    fn name(&self) -> &'static str {
        Binary::name(*self)
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic(self.stablehlo(), "", &[]);
        Ok(())
    }

    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (x, y, z, g) = (&args.inputs[0], &args.inputs[1], &args.outputs[0], args.cotangent(0)?);
        if !x.dtype().is_float() {
            return Ok(vec![None, None]);
        }
        let (dx, dy) = match self {
            Binary::Add => (g.clone(), g),
            Binary::Sub => (g.clone(), g.neg()?),
            Binary::Mul => (g.mul(y)?, g.mul(x)?),
            Binary::Div => (g.div(y)?, g.mul(z)?.div(y)?.neg()?),
            Binary::Max | Binary::Min => {
                // Ties split the cotangent evenly, as JAX does.
                let wins = if *self == Binary::Max { x.gt(y)? } else { x.lt(y)? };
                let zero = g.zeros_like()?;
                let half = g.mul_scalar(0.5)?;
                let tie = x.eq(y)?;
                let dx = wins.select(&g, &tie.select(&half, &zero)?)?;
                let dy = g.sub(&dx)?;
                (dx, dy)
            }
            Binary::Pow => {
                // d/dx x^y = y x^(y-1); d/dy x^y = x^y log x (taken as 0 where x = 0).
                let dx = g.mul(&y.mul(&x.pow(&y.add_scalar(-1.0)?)?)?)?;
                let zero = x.zeros_like()?;
                let log_x = x.eq(&zero)?.select(&zero, &x.log()?)?;
                (dx, g.mul(&z.mul(&log_x)?)?)
            }
            Binary::And | Binary::Or | Binary::Xor | Binary::ShiftLeft | Binary::ShiftRightLogical => {
                return Ok(vec![None, None]);
            }
        };
        Ok(vec![Some(dx), Some(dy)])
    }
}

impl Rule for Compare {
    fn name(&self) -> &'static str {
        "compare"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let dtype = ctx.operand_types[0].dtype;
        let kind = if dtype.is_float() {
            "FLOAT"
        } else if dtype.is_unsigned() {
            "UNSIGNED"
        } else {
            "SIGNED"
        };
        ctx.generic(
            "stablehlo.compare",
            &format!(
                "comparison_direction = #stablehlo<comparison_direction {}>, compare_type = #stablehlo<comparison_type {kind}>",
                self.direction()
            ),
            &[],
        );
        Ok(())
    }

    fn vjp(&self, _: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        Ok(vec![None, None])
    }
}

impl Rule for Select {
    fn name(&self) -> &'static str {
        "select"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic("stablehlo.select", "", &[]);
        Ok(())
    }

    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let (p, g) = (&args.inputs[0], args.cotangent(0)?);
        let zero = g.zeros_like()?;
        Ok(vec![None, Some(p.select(&g, &zero)?), Some(p.select(&zero, &g)?)])
    }
}

impl Rule for Convert {
    fn name(&self) -> &'static str {
        if self.bitcast { "bitcast" } else { "convert" }
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        let op = if self.bitcast {
            "stablehlo.bitcast_convert"
        } else {
            "stablehlo.convert"
        };
        ctx.generic(op, "", &[]);
        Ok(())
    }

    /// Float-to-float conversions pass the cotangent back in the input's dtype.
    fn vjp(&self, args: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        let x = &args.inputs[0];
        if self.bitcast || !x.dtype().is_float() || !self.to.is_float() {
            return Ok(vec![None]);
        }
        Ok(vec![Some(args.cotangent(0)?.convert(x.dtype())?)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numpy_broadcasting() {
        assert_eq!(broadcast_shapes(&[3, 1, 5], &[4, 1], "t").unwrap(), [3, 4, 5]);
        assert_eq!(broadcast_shapes(&[], &[2, 2], "t").unwrap(), [2, 2]);
        let error = broadcast_shapes(&[3, 2], &[4, 2], "add").unwrap_err().to_string();
        assert!(
            error.contains("add") && error.contains("[3, 2]") && error.contains("[4, 2]"),
            "{error}"
        );
    }

    #[test]
    fn dtype_rules_name_the_op() {
        let f = TensorType::new(ElementType::F32, [2]);
        let i = TensorType::new(ElementType::S32, [2]);
        assert!(Unary::Exp.infer(&i).unwrap_err().to_string().starts_with("exp"));
        assert!(
            Binary::Add
                .infer(&f, &i)
                .unwrap_err()
                .to_string()
                .contains("different dtypes")
        );
        assert!(Binary::ShiftLeft.infer(&f, &f).is_err());
        assert_eq!(Binary::Mul.infer(&f, &f).unwrap(), f);
    }
}
