//! ggml tensor types and their dequantization to f32.
//!
//! Block layouts as ggml defines them (all little-endian, `f16` scales):
//! - `F32`, `F16`, `BF16`: one value per element.
//! - `Q8_0`: 32 values as `d: f16, q: [i8; 32]`, value `q·d`.
//! - `Q4_0`: 32 values as `d: f16, q: [u8; 16]`, element `i` in the low nibble
//!   of byte `i` for `i < 16`, else the high nibble of byte `i − 16`; value `d·(q − 8)`.
//! - `Q4_1`: as `Q4_0` with a minimum after `d`: `d, m: f16`, value `d·q + m`.
//! - `Q4_K`: 256 values as `d, dmin: f16`, 12 bytes of 6-bit scales and mins
//!   of eight sub-blocks of 32, and 128 bytes of nibbles: sub-blocks `2p` and
//!   `2p + 1` are the low and high nibbles of bytes `32p..32p + 32`; value
//!   `(d·scale)·q − dmin·min`.
//! - `Q6_K`: 256 values as 128 bytes of low nibbles, 64 bytes of high 2-bit
//!   pairs, 16 `i8` scales of sub-blocks of 16 and `d: f16`; value `(d·scale)·(q − 32)`.

use std::fmt;

/// A ggml tensor element type, by its id in GGUF files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// 32-bit floats.
    pub const F32: Self = Self(0);
    /// IEEE half-precision floats.
    pub const F16: Self = Self(1);
    /// 4-bit blocks of 32 with a scale.
    pub const Q4_0: Self = Self(2);
    /// 4-bit blocks of 32 with a scale and a minimum.
    pub const Q4_1: Self = Self(3);
    /// 8-bit blocks of 32 with a scale.
    pub const Q8_0: Self = Self(8);
    /// 4-bit super-blocks of 256 with 6-bit sub-block scales and minimums.
    pub const Q4_K: Self = Self(12);
    /// 6-bit super-blocks of 256 with 8-bit sub-block scales.
    pub const Q6_K: Self = Self(14);
    /// bfloat16.
    pub const BF16: Self = Self(30);

    /// ggml's name of the type (`Q4_K`), or `None` for an id ggml does not define.
    pub fn name(self) -> Option<&'static str> {
        NAMES.iter().find(|(id, _)| *id == self.0).map(|(_, name)| *name)
    }

    /// The names of the types grpo dequantizes, for error messages: `F32, F16, …`.
    pub(crate) fn supported_names() -> String {
        let supported = NAMES.iter().filter(|(id, _)| Self(*id).layout().is_some());
        supported.map(|(_, name)| *name).collect::<Vec<_>>().join(", ")
    }

    /// The block layout, for the types grpo dequantizes.
    pub(crate) fn layout(self) -> Option<Layout> {
        let (elems, bytes, decode): (usize, usize, Decode) = match self {
            Self::F32 => (1, 4, f32_le),
            Self::F16 => (1, 2, f16_le),
            Self::BF16 => (1, 2, bf16_le),
            Self::Q8_0 => (32, 34, q8_0),
            Self::Q4_0 => (32, 18, q4_0),
            Self::Q4_1 => (32, 20, q4_1),
            Self::Q4_K => (256, 144, q4_k),
            Self::Q6_K => (256, 210, q6_k),
            _ => return None,
        };
        Some(Layout { elems, bytes, decode })
    }
}

/// `Q4_K (12)`, or `unknown (99)`.
impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name().unwrap_or("unknown"), self.0)
    }
}

/// How a type packs values: `elems` values in blocks of `bytes` bytes.
#[derive(Clone, Copy)]
pub(crate) struct Layout {
    /// Values per block.
    pub elems: usize,
    /// Bytes per block.
    pub bytes: usize,
    /// Decodes one block into `elems` values.
    decode: Decode,
}

/// Decodes one block into its values.
type Decode = fn(&[u8], &mut [f32]);

impl Layout {
    /// The values of whole blocks `data` (its length a multiple of `bytes`).
    pub fn dequantize(&self, data: &[u8]) -> Vec<f32> {
        let mut out = vec![0.0; data.len() / self.bytes * self.elems];
        for (block, values) in data.chunks_exact(self.bytes).zip(out.chunks_exact_mut(self.elems)) {
            (self.decode)(block, values);
        }
        out
    }
}

/// Every type ggml defines, for error messages.
const NAMES: [(u32, &str); 34] = [
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (30, "BF16"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
    (40, "NVFP4"),
    (41, "Q1_0"),
];

/// The little-endian f16 at byte `at`, widened (exactly) to f32.
fn f16_at(block: &[u8], at: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([block[at], block[at + 1]])).to_f32()
}

fn f32_le(block: &[u8], out: &mut [f32]) {
    out[0] = f32::from_le_bytes([block[0], block[1], block[2], block[3]]);
}

fn f16_le(block: &[u8], out: &mut [f32]) {
    out[0] = f16_at(block, 0);
}

fn bf16_le(block: &[u8], out: &mut [f32]) {
    out[0] = f32::from_bits(u32::from(u16::from_le_bytes([block[0], block[1]])) << 16);
}

fn q8_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (o, &q) in out.iter_mut().zip(&block[2..]) {
        *o = f32::from(q as i8) * d;
    }
}

/// Nibble `i` of 32 packed in 16 bytes: low nibbles first, then high ones.
fn nibble(qs: &[u8], i: usize) -> u8 {
    (qs[i % 16] >> (4 * (i / 16))) & 0xF
}

fn q4_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (i, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(nibble(&block[2..], i) as i8 - 8);
    }
}

fn q4_1(block: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(block, 0), f16_at(block, 2));
    for (i, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(nibble(&block[4..], i)) + m;
    }
}

fn q4_k(block: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let (s, qs) = (&block[4..16], &block[16..144]);
    for (j, values) in out.chunks_exact_mut(32).enumerate() {
        // Sub-blocks 0–3 keep 6 bits in bytes 0–7; 4–7 take their low 4 bits
        // from bytes 8–11 and their top 2 from the spare bits of bytes 0–7.
        let (scale, min) = if j < 4 {
            (s[j] & 63, s[j + 4] & 63)
        } else {
            (
                (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
                (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
            )
        };
        let (scale, min) = (d * f32::from(scale), dmin * f32::from(min));
        let shift = 4 * (j % 2);
        for (o, q) in values.iter_mut().zip(&qs[32 * (j / 2)..32 * (j / 2) + 32]) {
            *o = scale * f32::from((q >> shift) & 0xF) - min;
        }
    }
}

fn q6_k(block: &[u8], out: &mut [f32]) {
    let (ql, qh, scales) = (&block[..128], &block[128..192], &block[192..208]);
    let d = f16_at(block, 208);
    for (n, o) in out.iter_mut().enumerate() {
        // Each half of 128 values: low nibbles from 64 bytes (two passes of
        // 64), high bit pairs from 32 bytes (four passes of 32).
        let (half, r) = (n / 128, n % 128);
        let low = (ql[64 * half + r % 64] >> (4 * (r / 64))) & 0xF;
        let high = (qh[32 * half + r % 32] >> (2 * (r / 32))) & 3;
        let q = (low | (high << 4)) as i8 - 32;
        *o = d * f32::from(scales[n / 16] as i8) * f32::from(q);
    }
}
