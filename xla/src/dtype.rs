//! Element types, the Rust types that carry them on the host, and tensor types.

use std::fmt;

use half::{bf16, f16};

use crate::error::{Error, Result};

/// An element type grpo moves between host and device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementType {
    /// Boolean, one byte per element on the host.
    Pred,
    /// Signed 8-bit integer.
    S8,
    /// Signed 32-bit integer.
    S32,
    /// Signed 64-bit integer.
    S64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
}

impl ElementType {
    /// Every type, for tables and tests.
    pub const ALL: [ElementType; 11] = [
        ElementType::Pred,
        ElementType::S8,
        ElementType::S32,
        ElementType::S64,
        ElementType::U8,
        ElementType::U32,
        ElementType::U64,
        ElementType::F16,
        ElementType::Bf16,
        ElementType::F32,
        ElementType::F64,
    ];

    /// f16, bf16, f32 or f64.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            ElementType::F16 | ElementType::Bf16 | ElementType::F32 | ElementType::F64
        )
    }

    /// A signed or unsigned integer type (not `pred`).
    pub fn is_integer(self) -> bool {
        !self.is_float() && self != ElementType::Pred
    }

    /// Whether the type is unsigned (`pred` counts as unsigned).
    pub fn is_unsigned(self) -> bool {
        matches!(
            self,
            ElementType::Pred | ElementType::U8 | ElementType::U32 | ElementType::U64
        )
    }

    /// Bytes per element on the host.
    pub fn byte_size(self) -> usize {
        match self {
            ElementType::Pred | ElementType::S8 | ElementType::U8 => 1,
            ElementType::F16 | ElementType::Bf16 => 2,
            ElementType::S32 | ElementType::U32 | ElementType::F32 => 4,
            ElementType::S64 | ElementType::U64 | ElementType::F64 => 8,
        }
    }

    /// The element type's name in StableHLO text (`f32`, `bf16`, `i1`, `ui32`, …).
    pub fn mlir_name(self) -> &'static str {
        match self {
            ElementType::Pred => "i1",
            ElementType::S8 => "i8",
            ElementType::S32 => "i32",
            ElementType::S64 => "i64",
            ElementType::U8 => "ui8",
            ElementType::U32 => "ui32",
            ElementType::U64 => "ui64",
            ElementType::F16 => "f16",
            ElementType::Bf16 => "bf16",
            ElementType::F32 => "f32",
            ElementType::F64 => "f64",
        }
    }

    /// Parses a StableHLO element type name.
    pub fn from_mlir_name(name: &str) -> Option<ElementType> {
        ElementType::ALL.into_iter().find(|t| t.mlir_name() == name)
    }

    /// The `PJRT_Buffer_Type` value.
    pub(crate) fn pjrt_code(self) -> i32 {
        match self {
            ElementType::Pred => 1,
            ElementType::S8 => 2,
            ElementType::S32 => 4,
            ElementType::S64 => 5,
            ElementType::U8 => 6,
            ElementType::U32 => 8,
            ElementType::U64 => 9,
            ElementType::F16 => 10,
            ElementType::F32 => 11,
            ElementType::F64 => 12,
            ElementType::Bf16 => 13,
        }
    }

    /// The type of a `PJRT_Buffer_Type` value.
    pub(crate) fn from_pjrt_code(code: i32) -> Result<ElementType> {
        ElementType::ALL
            .into_iter()
            .find(|t| t.pjrt_code() == code)
            .ok_or(Error::UnsupportedType(code))
    }
}

impl fmt::Display for ElementType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            ElementType::Pred => "pred",
            ElementType::S8 => "s8",
            ElementType::S32 => "s32",
            ElementType::S64 => "s64",
            ElementType::U8 => "u8",
            ElementType::U32 => "u32",
            ElementType::U64 => "u64",
            ElementType::F16 => "f16",
            ElementType::Bf16 => "bf16",
            ElementType::F32 => "f32",
            ElementType::F64 => "f64",
        };
        f.write_str(name)
    }
}

/// A Rust type whose values are laid out exactly as one device element.
///
/// # Safety
/// Implementors must be plain data of `ELEMENT_TYPE.byte_size()` bytes, with
/// no padding, for which every bit pattern the device can produce is valid.
pub unsafe trait NativeType: Copy + Send + Sync + 'static {
    /// The element type this Rust type carries.
    const ELEMENT_TYPE: ElementType;
}

macro_rules! native_types {
    ($($ty:ty => $et:ident),* $(,)?) => {
        $(
            // SAFETY: a primitive of the element's exact size; all bit patterns valid.
            unsafe impl NativeType for $ty {
                const ELEMENT_TYPE: ElementType = ElementType::$et;
            }
        )*
    };
}

native_types!(
    i8 => S8,
    i32 => S32,
    i64 => S64,
    u8 => U8,
    u32 => U32,
    u64 => U64,
    f16 => F16,
    bf16 => Bf16,
    f32 => F32,
    f64 => F64,
);

/// A device boolean read or written as one byte (0 or 1).
///
/// `bool` itself cannot be a [`NativeType`]: a device byte other than 0 or 1
/// would be undefined behaviour in Rust.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct Pred(pub u8);

impl Pred {
    /// True when the byte is non-zero.
    pub fn get(self) -> bool {
        self.0 != 0
    }
}

impl From<bool> for Pred {
    fn from(value: bool) -> Self {
        Pred(u8::from(value))
    }
}

// SAFETY: one byte, every bit pattern valid.
unsafe impl NativeType for Pred {
    const ELEMENT_TYPE: ElementType = ElementType::Pred;
}

/// The element type and static dimensions of a tensor.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: ElementType,
    /// Dimensions, outermost first; empty for a scalar.
    pub dims: Vec<i64>,
}

impl TensorType {
    /// A tensor type of `dtype` with `dims`.
    pub fn new(dtype: ElementType, dims: impl Into<Vec<i64>>) -> Self {
        TensorType {
            dtype,
            dims: dims.into(),
        }
    }

    /// Number of elements.
    pub fn element_count(&self) -> usize {
        element_count(&self.dims)
    }

    /// Bytes of a dense row-major host copy.
    pub fn byte_size(&self) -> usize {
        self.element_count() * self.dtype.byte_size()
    }

    /// The StableHLO spelling, e.g. `tensor<2x3xf32>`.
    pub fn mlir(&self) -> String {
        let mut text = String::from("tensor<");
        for dim in &self.dims {
            text.push_str(&format!("{dim}x"));
        }
        text.push_str(self.dtype.mlir_name());
        text.push('>');
        text
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{:?}", self.dtype, self.dims)
    }
}

/// Number of elements of a shape (1 for a scalar).
pub fn element_count(dims: &[i64]) -> usize {
    dims.iter().map(|&d| usize::try_from(d).unwrap_or(0)).product()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mlir_names_round_trip() {
        for dtype in ElementType::ALL {
            assert_eq!(ElementType::from_mlir_name(dtype.mlir_name()), Some(dtype));
            assert_eq!(ElementType::from_pjrt_code(dtype.pjrt_code()).unwrap(), dtype);
        }
    }

    #[test]
    fn tensor_type_spelling() {
        assert_eq!(TensorType::new(ElementType::Bf16, [2, 3]).mlir(), "tensor<2x3xbf16>");
        assert_eq!(TensorType::new(ElementType::F32, []).mlir(), "tensor<f32>");
        assert_eq!(TensorType::new(ElementType::S32, [4, 0]).element_count(), 0);
    }
}
