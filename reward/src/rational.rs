//! Exact rationals on i128 with checked arithmetic: overflow and division
//! by zero are errors, never panics or wrong answers.

use crate::{Error, Result};

/// A reduced fraction `num / den` with `den > 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rational {
    num: i128,
    den: i128,
}

fn gcd(mut a: i128, mut b: i128) -> i128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.abs()
}

const OVERFLOW: Error = Error::Arithmetic("overflow");

/// An integer, the exact decimal when the denominator divides a power of
/// ten (`0.875`, `-16.8`), else the reduced fraction (`-1/3`).
impl std::fmt::Display for Rational {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.den == 1 {
            return write!(f, "{}", self.num);
        }
        match self.decimal() {
            Some((whole, fraction, digits)) => {
                let sign = if self.num < 0 { "-" } else { "" };
                write!(f, "{sign}{whole}.{fraction:0digits$}")
            }
            None => write!(f, "{}/{}", self.num, self.den),
        }
    }
}

impl Rational {
    /// `num / den`, reduced; errors when `den` is 0.
    pub fn new(num: i128, den: i128) -> Result<Self> {
        if den == 0 {
            return Err(Error::Arithmetic("division by zero"));
        }
        let g = gcd(num, den).max(1);
        let sign = if den < 0 { -1 } else { 1 };
        let num = (num / g).checked_mul(sign).ok_or(OVERFLOW)?;
        let den = (den / g).checked_mul(sign).ok_or(OVERFLOW)?;
        Ok(Self { num, den })
    }

    /// The integer `n`.
    pub fn integer(n: i128) -> Self {
        Self { num: n, den: 1 }
    }

    /// Parses a decimal like `-12`, `3.25` or `.5` exactly.
    pub fn parse_decimal(text: &str) -> Result<Self> {
        let bad = || Error::Arithmetic("not a decimal number");
        let (negative, digits) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text.strip_prefix('+').unwrap_or(text)),
        };
        let (whole, frac) = digits.split_once('.').unwrap_or((digits, ""));
        if whole.is_empty() && frac.is_empty() || !(whole.chars().chain(frac.chars())).all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        let mut num: i128 = 0;
        let mut den: i128 = 1;
        for c in whole.chars().chain(frac.chars()) {
            num = num
                .checked_mul(10)
                .and_then(|n| n.checked_add(i128::from(c as u8 - b'0')))
                .ok_or(OVERFLOW)?;
        }
        for _ in frac.chars() {
            den = den.checked_mul(10).ok_or(OVERFLOW)?;
        }
        Self::new(if negative { -num } else { num }, den)
    }

    /// `|self|` as `whole.fraction` with `digits` fraction digits, when the
    /// denominator divides a power of ten that fits.
    fn decimal(self) -> Option<(u128, u128, usize)> {
        let (mut rest, mut twos, mut fives) = (self.den, 0u32, 0u32);
        while rest % 2 == 0 {
            rest /= 2;
            twos += 1;
        }
        while rest % 5 == 0 {
            rest /= 5;
            fives += 1;
        }
        if rest != 1 {
            return None;
        }
        let digits = twos.max(fives);
        let unit = 10u128.checked_pow(digits)?;
        let scaled = self.num.unsigned_abs().checked_mul(unit / self.den.unsigned_abs())?;
        Some((scaled / unit, scaled % unit, digits as usize))
    }

    /// The numerator.
    pub fn numerator(self) -> i128 {
        self.num
    }

    /// The denominator (positive).
    pub fn denominator(self) -> i128 {
        self.den
    }

    /// `self + other`.
    pub fn checked_add(self, other: Self) -> Result<Self> {
        let num = self.num.checked_mul(other.den).zip(other.num.checked_mul(self.den));
        let (a, b) = num.ok_or(OVERFLOW)?;
        Self::new(
            a.checked_add(b).ok_or(OVERFLOW)?,
            self.den.checked_mul(other.den).ok_or(OVERFLOW)?,
        )
    }

    /// `self - other`.
    pub fn checked_sub(self, other: Self) -> Result<Self> {
        self.checked_add(other.checked_neg()?)
    }

    /// `self * other`.
    pub fn checked_mul(self, other: Self) -> Result<Self> {
        let num = self.num.checked_mul(other.num).ok_or(OVERFLOW)?;
        Self::new(num, self.den.checked_mul(other.den).ok_or(OVERFLOW)?)
    }

    /// `self / other`; errors when `other` is 0.
    pub fn checked_div(self, other: Self) -> Result<Self> {
        let num = self.num.checked_mul(other.den).ok_or(OVERFLOW)?;
        Self::new(num, self.den.checked_mul(other.num).ok_or(OVERFLOW)?)
    }

    /// `-self`.
    pub fn checked_neg(self) -> Result<Self> {
        Ok(Self {
            num: self.num.checked_neg().ok_or(OVERFLOW)?,
            den: self.den,
        })
    }

    /// `self ^ exp` for a small integer exponent (|exp| ≤ 64).
    pub fn checked_pow(self, exp: Self) -> Result<Self> {
        if exp.den != 1 || exp.num.abs() > 64 {
            return Err(Error::Arithmetic("exponent must be an integer of at most 64"));
        }
        let mut out = Self::integer(1);
        for _ in 0..exp.num.abs() {
            out = out.checked_mul(self)?;
        }
        if exp.num < 0 {
            Self::integer(1).checked_div(out)
        } else {
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Rational;

    #[test]
    fn display_is_exact() {
        for (num, den, want) in [
            (408, 1, "408"),
            (-3, 1, "-3"),
            (7, 8, "0.875"),
            (-84, 5, "-16.8"),
            (1, 20, "0.05"),
            (-1, 3, "-1/3"),
            (5, 6, "5/6"),
            (1, 1024, "0.0009765625"),
        ] {
            assert_eq!(Rational::new(num, den).unwrap().to_string(), want, "{num}/{den}");
        }
        // A power of ten past u128 leaves the fraction.
        let tiny = Rational::new(1, 1 << 126).unwrap();
        assert_eq!(tiny.to_string(), format!("1/{}", 1i128 << 126));
    }
}
