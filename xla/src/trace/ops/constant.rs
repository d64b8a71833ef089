//! Constants and iota: values known while tracing.

use half::{bf16, f16};

use crate::dtype::{ElementType, NativeType, TensorType};
use crate::error::{Error, Result};
use crate::trace::emit::EmitCtx;
use crate::trace::graph::{Graph, Tensor};
use crate::trace::op::{Op, Rule, VjpArgs};

/// A dense constant: its type and row-major little-endian bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Constant {
    pub ty: TensorType,
    pub bytes: Vec<u8>,
}

/// `0, 1, 2, …` along one dimension.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Iota {
    pub dimension: usize,
}

impl Graph {
    /// A constant of `data` (row-major) with `dims`.
    pub fn constant<T: NativeType>(&self, data: &[T], dims: &[i64]) -> Result<Tensor> {
        let ty = TensorType::new(T::ELEMENT_TYPE, dims);
        if data.len() != ty.element_count() || dims.iter().any(|&d| d < 0) {
            return Err(Error::Trace {
                op: "constant",
                message: format!("{} values do not fill shape {dims:?}", data.len()),
            });
        }
        // SAFETY: `NativeType` values are plain bytes without padding.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) };
        self.apply(
            Op::Constant(Constant {
                ty: ty.clone(),
                bytes: bytes.to_vec(),
            }),
            &[],
            ty,
        )
    }

    /// A scalar of `dtype` holding `value` (rounded or truncated to the type).
    pub fn scalar(&self, value: f64, dtype: ElementType) -> Result<Tensor> {
        let ty = TensorType::new(dtype, []);
        self.apply(
            Op::Constant(Constant {
                ty: ty.clone(),
                bytes: scalar_bytes(value, dtype),
            }),
            &[],
            ty,
        )
    }

    /// A tensor of `dims` filled with `value`.
    pub fn full(&self, value: f64, dtype: ElementType, dims: &[i64]) -> Result<Tensor> {
        self.scalar(value, dtype)?.broadcast_to(dims)
    }

    /// A tensor of `dims` counting `0, 1, …` along `dimension`.
    pub fn iota(&self, dtype: ElementType, dims: &[i64], dimension: usize) -> Result<Tensor> {
        if dimension >= dims.len() {
            return Err(Error::Trace {
                op: "iota",
                message: format!("dimension {dimension} is out of range for shape {dims:?}"),
            });
        }
        self.apply(Op::Iota(Iota { dimension }), &[], TensorType::new(dtype, dims))
    }
}

impl Tensor {
    /// Zeros of this tensor's type.
    pub fn zeros_like(&self) -> Result<Tensor> {
        self.full_like(0.0)
    }

    /// Ones of this tensor's type.
    pub fn ones_like(&self) -> Result<Tensor> {
        self.full_like(1.0)
    }

    /// `value` in this tensor's type and shape.
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        self.graph.full(value, self.dtype(), self.dims())
    }

    /// A scalar of this tensor's dtype (for scalar operands).
    pub fn scalar_like(&self, value: f64) -> Result<Tensor> {
        self.graph.scalar(value, self.dtype())
    }
}

/// The little-endian bytes of `value` as one element of `dtype`.
fn scalar_bytes(value: f64, dtype: ElementType) -> Vec<u8> {
    match dtype {
        ElementType::Pred => vec![u8::from(value != 0.0)],
        ElementType::S8 => (value as i8).to_le_bytes().to_vec(),
        ElementType::S32 => (value as i32).to_le_bytes().to_vec(),
        ElementType::S64 => (value as i64).to_le_bytes().to_vec(),
        ElementType::U8 => (value as u8).to_le_bytes().to_vec(),
        ElementType::U32 => (value as u32).to_le_bytes().to_vec(),
        ElementType::U64 => (value as u64).to_le_bytes().to_vec(),
        ElementType::F16 => f16::from_f64(value).to_le_bytes().to_vec(),
        ElementType::Bf16 => bf16::from_f64(value).to_le_bytes().to_vec(),
        ElementType::F32 => (value as f32).to_le_bytes().to_vec(),
        ElementType::F64 => value.to_le_bytes().to_vec(),
    }
}

fn hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(2 + 2 * bytes.len());
    text.push_str("0x");
    for byte in bytes {
        text.push_str(&format!("{byte:02X}"));
    }
    text
}

impl Rule for Constant {
    fn name(&self) -> &'static str {
        "constant"
    }

    /// Exact bits as a hex dense literal; booleans go through `ui8`, whose
    /// hex form is one byte per element.
    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        if self.ty.element_count() == 0 {
            ctx.generic(
                "stablehlo.constant",
                &format!("value = dense<> : {}", self.ty.mlir()),
                &[],
            );
            return Ok(());
        }
        if self.ty.dtype == ElementType::Pred {
            let bytes_ty = TensorType::new(ElementType::U8, self.ty.dims.clone());
            let bytes = ctx.e.fresh();
            ctx.e.line(&format!(
                "{bytes} = \"stablehlo.constant\"() {{value = dense<\"{}\"> : {}}} : () -> {}",
                hex(&self.bytes),
                bytes_ty.mlir(),
                bytes_ty.mlir()
            ));
            ctx.operands = vec![bytes];
            ctx.operand_types = vec![bytes_ty];
            ctx.generic("stablehlo.convert", "", &[]);
            return Ok(());
        }
        ctx.generic(
            "stablehlo.constant",
            &format!("value = dense<\"{}\"> : {}", hex(&self.bytes), self.ty.mlir()),
            &[],
        );
        Ok(())
    }

    fn vjp(&self, _: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        Ok(Vec::new())
    }
}

impl Rule for Iota {
    fn name(&self) -> &'static str {
        "iota"
    }

    fn emit(&self, ctx: &mut EmitCtx<'_>) -> Result<()> {
        ctx.generic(
            "stablehlo.iota",
            &format!("iota_dimension = {} : i64", self.dimension),
            &[],
        );
        Ok(())
    }

    fn vjp(&self, _: &VjpArgs<'_>) -> Result<Vec<Option<Tensor>>> {
        Ok(Vec::new())
    }
}
