//! A safe arithmetic-expression parser evaluated in exact rationals: no
//! code is ever run. Grammar (usual precedence, `^` right-associative):
//!
//! ```text
//! expr   := term (('+' | '-') term)*
//! term   := unary (('*' | '×' | '/' | '÷') unary)*
//! unary  := '-' unary | power
//! power  := atom ('^' | '**') unary | atom
//! atom   := number | '(' expr ')'
//! ```

use crate::rational::Rational;
use crate::{Error, Result};

/// The longest expression accepted, in characters.
pub const MAX_LEN: usize = 1000;
/// The deepest nesting accepted.
const MAX_DEPTH: usize = 64;

/// A parsed and evaluated expression.
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluated {
    /// The exact value.
    pub value: Rational,
    /// The number literals, in order of appearance.
    pub numbers: Vec<Rational>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Token {
    Number(Rational),
    Op(char),
    Open,
    Close,
}

fn tokenize(text: &str) -> Result<Vec<Token>> {
    let mut tokens = Vec::new();
    let chars: Vec<char> = text.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            ' ' | '\t' | '\n' => {}
            '0'..='9' | '.' => {
                let start = i;
                while i + 1 < chars.len() && (chars[i + 1].is_ascii_digit() || chars[i + 1] == '.') {
                    i += 1;
                }
                let literal: String = chars[start..=i].iter().collect();
                tokens.push(Token::Number(Rational::parse_decimal(&literal)?));
            }
            '*' if chars.get(i + 1) == Some(&'*') => {
                tokens.push(Token::Op('^'));
                i += 1;
            }
            '+' | '-' | '^' | '/' | '*' => tokens.push(Token::Op(c)),
            '×' | 'x' => tokens.push(Token::Op('*')),
            '÷' => tokens.push(Token::Op('/')),
            '−' => tokens.push(Token::Op('-')),
            '(' => tokens.push(Token::Open),
            ')' => tokens.push(Token::Close),
            _ => return Err(Error::Arithmetic("unexpected character in expression")),
        }
        i += 1;
    }
    Ok(tokens)
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
    numbers: Vec<Rational>,
}

impl Parser {
    fn peek(&self) -> Option<Token> {
        self.tokens.get(self.at).copied()
    }

    fn binary(
        &mut self,
        ops: &[char],
        depth: usize,
        next: fn(&mut Self, usize) -> Result<Rational>,
    ) -> Result<Rational> {
        let mut left = next(self, depth)?;
        while let Some(Token::Op(op)) = self.peek().filter(|t| matches!(t, Token::Op(o) if ops.contains(o))) {
            self.at += 1;
            let right = next(self, depth)?;
            left = match op {
                '+' => left.checked_add(right)?,
                '-' => left.checked_sub(right)?,
                '*' => left.checked_mul(right)?,
                _ => left.checked_div(right)?,
            };
        }
        Ok(left)
    }

    fn expr(&mut self, depth: usize) -> Result<Rational> {
        if depth > MAX_DEPTH {
            return Err(Error::Arithmetic("expression nested too deeply"));
        }
        self.binary(&['+', '-'], depth, Self::term)
    }

    fn term(&mut self, depth: usize) -> Result<Rational> {
        self.binary(&['*', '/'], depth, Self::unary)
    }

    fn unary(&mut self, depth: usize) -> Result<Rational> {
        if self.peek() == Some(Token::Op('-')) {
            self.at += 1;
            return self.nested(depth, Self::unary)?.checked_neg();
        }
        let base = self.atom(depth)?;
        if self.peek() == Some(Token::Op('^')) {
            self.at += 1;
            return base.checked_pow(self.nested(depth, Self::unary)?);
        }
        Ok(base)
    }

    fn nested(&mut self, depth: usize, next: fn(&mut Self, usize) -> Result<Rational>) -> Result<Rational> {
        if depth > MAX_DEPTH {
            return Err(Error::Arithmetic("expression nested too deeply"));
        }
        next(self, depth + 1)
    }

    fn atom(&mut self, depth: usize) -> Result<Rational> {
        let token = self.peek().ok_or(Error::Arithmetic("expression ends early"))?;
        self.at += 1;
        match token {
            Token::Number(n) => {
                self.numbers.push(n);
                Ok(n)
            }
            Token::Open => {
                let value = self.expr(depth + 1)?;
                if self.peek() != Some(Token::Close) {
                    return Err(Error::Arithmetic("unbalanced parentheses"));
                }
                self.at += 1;
                Ok(value)
            }
            _ => Err(Error::Arithmetic("expected a number or '('")),
        }
    }
}

/// Parses and evaluates `text` exactly.
pub fn evaluate(text: &str) -> Result<Evaluated> {
    if text.chars().count() > MAX_LEN {
        return Err(Error::Arithmetic("expression too long"));
    }
    let mut parser = Parser {
        tokens: tokenize(text)?,
        at: 0,
        numbers: Vec::new(),
    };
    let value = parser.expr(0)?;
    if parser.at != parser.tokens.len() {
        return Err(Error::Arithmetic("trailing input after expression"));
    }
    Ok(Evaluated {
        value,
        numbers: parser.numbers,
    })
}
