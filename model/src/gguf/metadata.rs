//! GGUF metadata values: the thirteen value types and typed views of them.

use std::fmt;

/// The type of a GGUF metadata value, as numbered in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    /// `UINT8` (0).
    U8,
    /// `INT8` (1).
    I8,
    /// `UINT16` (2).
    U16,
    /// `INT16` (3).
    I16,
    /// `UINT32` (4).
    U32,
    /// `INT32` (5).
    I32,
    /// `FLOAT32` (6).
    F32,
    /// `BOOL` (7).
    Bool,
    /// `STRING` (8): u64 length and UTF-8 bytes.
    String,
    /// `ARRAY` (9): element type, u64 count, the elements.
    Array,
    /// `UINT64` (10).
    U64,
    /// `INT64` (11).
    I64,
    /// `FLOAT64` (12).
    F64,
}

impl ValueType {
    /// The value type numbered `id` in a GGUF file, if there is one.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The name GGUF's specification gives the type (`UINT8`, `STRING`, …).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "UINT8",
            I8 => "INT8",
            U16 => "UINT16",
            I16 => "INT16",
            U32 => "UINT32",
            I32 => "INT32",
            F32 => "FLOAT32",
            Bool => "BOOL",
            String => "STRING",
            Array => "ARRAY",
            U64 => "UINT64",
            I64 => "INT64",
            F64 => "FLOAT64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value of a GGUF file.
#[derive(Clone, Debug, PartialEq)]
pub enum MetadataValue {
    /// `UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT32`.
    F32(f32),
    /// `FLOAT64`.
    F64(f64),
    /// `BOOL`.
    Bool(bool),
    /// `STRING`.
    String(String),
    /// `ARRAY`: the element type (kept for empty arrays) and the elements,
    /// which may be arrays themselves.
    Array(ValueType, Vec<MetadataValue>),
}

impl MetadataValue {
    /// The value's GGUF type.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetadataValue::U8(_) => ValueType::U8,
            MetadataValue::I8(_) => ValueType::I8,
            MetadataValue::U16(_) => ValueType::U16,
            MetadataValue::I16(_) => ValueType::I16,
            MetadataValue::U32(_) => ValueType::U32,
            MetadataValue::I32(_) => ValueType::I32,
            MetadataValue::U64(_) => ValueType::U64,
            MetadataValue::I64(_) => ValueType::I64,
            MetadataValue::F32(_) => ValueType::F32,
            MetadataValue::F64(_) => ValueType::F64,
            MetadataValue::Bool(_) => ValueType::Bool,
            MetadataValue::String(_) => ValueType::String,
            MetadataValue::Array(..) => ValueType::Array,
        }
    }

    /// The string, if this is a `STRING`.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetadataValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The integer as a `u32`, if this is an integer of any type whose value fits.
    pub fn as_u32(&self) -> Option<u32> {
        self.integer().and_then(|v| u32::try_from(v).ok())
    }

    /// The integer as an `i32`, if this is an integer of any type whose value fits.
    pub fn as_i32(&self) -> Option<i32> {
        self.integer().and_then(|v| i32::try_from(v).ok())
    }

    /// The number as an `f32`, if this is a `FLOAT32` or a `FLOAT64`
    /// (rounded to the nearest `f32`).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            MetadataValue::F32(v) => Some(v),
            MetadataValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// The flag, if this is a `BOOL`.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            MetadataValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The elements, if this is an `ARRAY`.
    pub fn as_array(&self) -> Option<&[MetadataValue]> {
        match self {
            MetadataValue::Array(_, items) => Some(items),
            _ => None,
        }
    }

    /// Any integer type, widened without loss.
    fn integer(&self) -> Option<i128> {
        Some(match *self {
            MetadataValue::U8(v) => v.into(),
            MetadataValue::I8(v) => v.into(),
            MetadataValue::U16(v) => v.into(),
            MetadataValue::I16(v) => v.into(),
            MetadataValue::U32(v) => v.into(),
            MetadataValue::I32(v) => v.into(),
            MetadataValue::U64(v) => v.into(),
            MetadataValue::I64(v) => v.into(),
            _ => return None,
        })
    }
}

/// The type, and the value of a scalar, for error messages:
/// `UINT64 1099511627776`, `STRING of 12 bytes`, `ARRAY of 3 INT32`.
impl fmt::Display for MetadataValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ty = self.value_type();
        if let Some(v) = self.integer() {
            return write!(f, "{ty} {v}");
        }
        match self {
            MetadataValue::F32(v) => write!(f, "{ty} {v}"),
            MetadataValue::F64(v) => write!(f, "{ty} {v}"),
            MetadataValue::Bool(v) => write!(f, "{ty} {v}"),
            MetadataValue::String(s) => write!(f, "{ty} of {} bytes", s.len()),
            MetadataValue::Array(elem, items) => write!(f, "{ty} of {} {elem}", items.len()),
            _ => f.write_str(ty.name()),
        }
    }
}
