//! ggml tensor types and their dequantization to f32.
//!
//! Block layouts as ggml defines them (all little-endian, `f16` scales):
//! - `F32`, `F16`, `BF16`: one value per element.
//! - `Q8_0`: 32 values as `d: f16, q: [i8; 32]`, value `q·d`.
//! - `Q4_0`: 32 values as `d: f16, q: [u8; 16]`, element `i` in the low nibble
//!   of byte `i` for `i < 16`, else the high nibble of byte `i − 16`; value `d·(q − 8)`.
//! - `Q4_1`: as `Q4_0` with a minimum after `d`: `d, m: f16`, value `d·q + m`.
//! - `Q5_0`: 32 values as `d: f16`, `qh: u32` (the fifth bit of element `i`
//!   is bit `i`) and the nibbles of `Q4_0`; value `d·(q − 16)`.
//! - `Q5_1`: as `Q5_0` with a minimum: `d, m: f16, qh, nibbles`, value `d·q + m`.
//! - `IQ4_NL`: as `Q4_0`, each nibble indexing a fixed non-linear table
//!   ([`IQ4_VALUES`]); value `d·table[q]`.
//! - `Q2_K`: 256 values as 16 bytes of 4-bit scales (low) and mins (high) of
//!   sub-blocks of 16, 64 bytes of 2-bit values, `d, dmin: f16`; element `n`
//!   is bits `2j..2j + 2` of byte `32h + n % 32` (`h = n / 128`, `j = n % 128
//!   / 32`); value `(d·scale)·q − dmin·min`.
//! - `Q3_K`: 256 values as 32 bytes of high bits, 64 bytes of 2-bit values
//!   (placed as in `Q2_K`), 12 bytes of 6-bit scales of sub-blocks of 16, and
//!   `d: f16`; the high bit of element `n` is bit `4h + j` of byte `n % 32`;
//!   value `d·(scale − 32)·(q − 4·[high bit clear])`.
//! - `Q4_K`: 256 values as `d, dmin: f16`, 12 bytes of 6-bit scales and mins
//!   of eight sub-blocks of 32, and 128 bytes of nibbles: sub-blocks `2p` and
//!   `2p + 1` are the low and high nibbles of bytes `32p..32p + 32`; value
//!   `(d·scale)·q − dmin·min`.
//! - `Q5_K`: as `Q4_K` with 32 bytes of fifth bits between the scales and the
//!   nibbles (that of element `n` is bit `n / 32` of byte `n % 32`).
//! - `Q6_K`: 256 values as 128 bytes of low nibbles, 64 bytes of high 2-bit
//!   pairs, 16 `i8` scales of sub-blocks of 16 and `d: f16`; value `(d·scale)·(q − 32)`.
//! - `IQ4_XS`: 256 values as `d: f16`, the high 2 bits of eight 6-bit
//!   sub-block scales (`u16`), their low 4 bits (4 bytes) and the nibbles of
//!   eight `IQ4_NL` blocks; value `d·(scale − 32)·table[q]`.
//!
//! llama.cpp's `_S`/`_M`/`_L` mixes of Q2_K…Q6_K hold these types only (and
//! `Q5_0`/`Q5_1`/`Q8_0`/`IQ4_NL` for rows that are not a multiple of 256
//! wide, as SmolLM2's 576 and Qwen2.5-0.5B's 896).

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
    /// 5-bit blocks of 32 with a scale.
    pub const Q5_0: Self = Self(6);
    /// 5-bit blocks of 32 with a scale and a minimum.
    pub const Q5_1: Self = Self(7);
    /// 8-bit blocks of 32 with a scale.
    pub const Q8_0: Self = Self(8);
    /// 2-bit super-blocks of 256 with 4-bit sub-block scales and minimums.
    pub const Q2_K: Self = Self(10);
    /// 3-bit super-blocks of 256 with 6-bit sub-block scales.
    pub const Q3_K: Self = Self(11);
    /// 4-bit super-blocks of 256 with 6-bit sub-block scales and minimums.
    pub const Q4_K: Self = Self(12);
    /// 5-bit super-blocks of 256 with 6-bit sub-block scales and minimums.
    pub const Q5_K: Self = Self(13);
    /// 6-bit super-blocks of 256 with 8-bit sub-block scales.
    pub const Q6_K: Self = Self(14);
    /// 4-bit blocks of 32 on a non-linear table, with a scale.
    pub const IQ4_NL: Self = Self(20);
    /// 4-bit super-blocks of 256 on the `IQ4_NL` table, with 6-bit sub-block scales.
    pub const IQ4_XS: Self = Self(23);
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
            Self::Q5_0 => (32, 22, q5_0),
            Self::Q5_1 => (32, 24, q5_1),
            Self::IQ4_NL => (32, 18, iq4_nl),
            Self::Q2_K => (256, 84, q2_k),
            Self::Q3_K => (256, 110, q3_k),
            Self::Q4_K => (256, 144, q4_k),
            Self::Q5_K => (256, 176, q5_k),
            Self::Q6_K => (256, 210, q6_k),
            Self::IQ4_XS => (256, 136, iq4_xs),
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

/// The 5-bit value `i` of 32: its nibble and bit `i` of the `u32` at `qh`.
fn five_bits(block: &[u8], qh: usize, qs: usize, i: usize) -> u8 {
    let high = u32::from_le_bytes([block[qh], block[qh + 1], block[qh + 2], block[qh + 3]]);
    nibble(&block[qs..], i) | ((((high >> i) & 1) as u8) << 4)
}

fn q5_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (i, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(five_bits(block, 2, 6, i) as i8 - 16);
    }
}

fn q5_1(block: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(block, 0), f16_at(block, 2));
    for (i, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(five_bits(block, 4, 8, i)) + m;
    }
}

/// The non-linear values `IQ4_NL` and `IQ4_XS` nibbles index.
pub const IQ4_VALUES: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

fn iq4_nl(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (i, o) in out.iter_mut().enumerate() {
        *o = d * f32::from(IQ4_VALUES[usize::from(nibble(&block[2..], i))]);
    }
}

fn iq4_xs(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let high = u16::from_le_bytes([block[2], block[3]]);
    let (low, qs) = (&block[4..8], &block[8..136]);
    for (j, values) in out.chunks_exact_mut(32).enumerate() {
        let scale = ((low[j / 2] >> (4 * (j % 2))) & 0xF) | ((((high >> (2 * j)) & 3) as u8) << 4);
        let scale = d * f32::from(i16::from(scale) - 32);
        for (i, o) in values.iter_mut().enumerate() {
            *o = scale * f32::from(IQ4_VALUES[usize::from(nibble(&qs[16 * j..16 * j + 16], i))]);
        }
    }
}

/// The 2-bit value `n` of a 256-value block of `Q2_K` or `Q3_K` layout:
/// bits `2j..2j + 2` of byte `32h + n % 32` of `qs`.
fn two_bits(qs: &[u8], n: usize) -> u8 {
    let (h, j) = (n / 128, n % 128 / 32);
    (qs[32 * h + n % 32] >> (2 * j)) & 3
}

fn q2_k(block: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&block[..16], &block[16..80]);
    let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
    for (n, o) in out.iter_mut().enumerate() {
        let s = scales[n / 16];
        *o = d * f32::from(s & 0xF) * f32::from(two_bits(qs, n)) - dmin * f32::from(s >> 4);
    }
}

fn q3_k(block: &[u8], out: &mut [f32]) {
    let (high_bits, qs, s) = (&block[..32], &block[32..96], &block[96..108]);
    let d = f16_at(block, 108);
    for (n, o) in out.iter_mut().enumerate() {
        // Scale k: its low 4 bits from bytes 0–7 (low nibbles, then high
        // ones), its top 2 from bytes 8–11 (bits 2(k/4), of byte 8 + k % 4).
        let k = n / 16;
        let low = if k < 8 { s[k] & 0xF } else { s[k - 8] >> 4 };
        let top = (s[8 + k % 4] >> (2 * (k / 4))) & 3;
        let scale = i16::from(low | (top << 4)) - 32;
        let (h, j) = (n / 128, n % 128 / 32);
        let set = (high_bits[n % 32] >> (4 * h + j)) & 1 == 1;
        let q = i16::from(two_bits(qs, n)) - if set { 0 } else { 4 };
        *o = d * f32::from(scale) * f32::from(q);
    }
}

/// The 6-bit scale and minimum of sub-block `j` of 8 in the 12 bytes `s` of
/// a `Q4_K` or `Q5_K` block: sub-blocks 0–3 keep 6 bits in bytes 0–7; 4–7
/// take their low 4 bits from bytes 8–11 and their top 2 from the spare
/// bits of bytes 0–7.
fn scale_min_k4(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

fn q4_k(block: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let (s, qs) = (&block[4..16], &block[16..144]);
    for (j, values) in out.chunks_exact_mut(32).enumerate() {
        let (scale, min) = scale_min_k4(s, j);
        let (scale, min) = (d * f32::from(scale), dmin * f32::from(min));
        let shift = 4 * (j % 2);
        for (o, q) in values.iter_mut().zip(&qs[32 * (j / 2)..32 * (j / 2) + 32]) {
            *o = scale * f32::from((q >> shift) & 0xF) - min;
        }
    }
}

fn q5_k(block: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let (s, high_bits, qs) = (&block[4..16], &block[16..48], &block[48..176]);
    for (j, values) in out.chunks_exact_mut(32).enumerate() {
        let (scale, min) = scale_min_k4(s, j);
        let (scale, min) = (d * f32::from(scale), dmin * f32::from(min));
        let shift = 4 * (j % 2);
        let low = &qs[32 * (j / 2)..32 * (j / 2) + 32];
        for (i, (o, q)) in values.iter_mut().zip(low).enumerate() {
            let fifth = ((high_bits[i] >> j) & 1) << 4;
            *o = scale * f32::from(((q >> shift) & 0xF) | fifth) - min;
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
