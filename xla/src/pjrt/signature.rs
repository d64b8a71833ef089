//! Reads the parameters of `@main` from StableHLO text, so that calls can be
//! checked (count, dtype, shape, donation, sharding) before they reach the
//! plugin, and the shardings of its results.

use crate::dtype::{ElementType, TensorType};
use crate::error::{Error, Result};
use crate::sharding::Sharding;

/// One parameter of `@main`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parameter {
    /// Its type.
    pub ty: TensorType,
    /// Whether the program may take over the argument's memory
    /// (`tf.aliasing_output` or `jax.buffer_donor = true`).
    pub donatable: bool,
    /// Its `mhlo.sharding` (replicated when absent): in a partitioned
    /// program each device receives its shard of [`Parameter::ty`].
    pub sharding: Sharding,
}

/// The module name and the parameters of `@main`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// `module @name`, or `main` when the module is unnamed.
    pub name: String,
    /// Parameters in order.
    pub parameters: Vec<Parameter>,
    /// The `mhlo.sharding` of each result (replicated when absent).
    pub output_shardings: Vec<Sharding>,
}

impl Signature {
    /// Parses the signature of `@main` in `program`.
    pub fn parse(program: &str) -> Result<Signature> {
        let name = module_name(program).unwrap_or("main").to_string();
        let start = program
            .find("@main(")
            .ok_or_else(|| Error::Signature("the program has no `func.func @main(`".to_string()))?
            + "@main(".len();
        let list = &program[start..];
        let end = closing_paren(list).ok_or_else(|| Error::Signature("unbalanced parameter list".to_string()))?;
        let parameters = split_top_level(&list[..end])
            .into_iter()
            .filter(|p| !p.trim().is_empty())
            .map(parse_parameter)
            .collect::<Result<_>>()?;
        let output_shardings = parse_results(&list[end + 1..])?;
        Ok(Signature {
            name,
            parameters,
            output_shardings,
        })
    }
}

/// The shardings of the results after the parameter list: `-> (t {attrs}, …)`,
/// `-> t`, or none.
fn parse_results(text: &str) -> Result<Vec<Sharding>> {
    let Some(results) = text.trim_start().strip_prefix("->") else {
        return Ok(Vec::new());
    };
    let results = results.trim_start();
    let Some(list) = results.strip_prefix('(') else {
        return Ok(vec![Sharding::replicated()]);
    };
    let end = closing_paren(list).ok_or_else(|| Error::Signature("unbalanced result list".to_string()))?;
    split_top_level(&list[..end])
        .into_iter()
        .filter(|r| !r.trim().is_empty())
        .map(sharding_attribute)
        .collect()
}

/// The `mhlo.sharding = "…"` in an attribute text, replicated when there is none.
fn sharding_attribute(text: &str) -> Result<Sharding> {
    const KEY: &str = "mhlo.sharding = \"";
    let Some(start) = text.find(KEY).map(|i| i + KEY.len()) else {
        return Ok(Sharding::replicated());
    };
    let value = text[start..]
        .split('"')
        .next()
        .ok_or_else(|| Error::Signature(format!("unterminated sharding in `{text}`")))?;
    Sharding::from_hlo(value).map_err(Error::Signature)
}

fn module_name(program: &str) -> Option<&str> {
    let rest = program.trim_start().strip_prefix("module @")?;
    let end = rest.find(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.' || c == '$'))?;
    Some(&rest[..end])
}

/// Byte offset of the `)` closing a list that starts just after its `(`.
fn closing_paren(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    for (i, c) in text.char_indices() {
        match c {
            '"' => in_string = !in_string,
            _ if in_string => {}
            '(' | '{' | '<' | '[' => depth += 1,
            ')' if depth == 0 => return Some(i),
            ')' | '}' | '>' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// Splits at commas outside brackets and strings.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut in_string = false;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '"' => in_string = !in_string,
            _ if in_string => {}
            '(' | '{' | '<' | '[' => depth += 1,
            ')' | '}' | '>' | ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// `%arg0: tensor<2x3xf32> {tf.aliasing_output = 0 : i32}`.
fn parse_parameter(text: &str) -> Result<Parameter> {
    let text = text.trim();
    let (_, rest) = text
        .split_once(':')
        .ok_or_else(|| Error::Signature(format!("parameter `{text}` has no type")))?;
    let rest = rest.trim_start();
    let body = rest
        .strip_prefix("tensor<")
        .ok_or_else(|| Error::Signature(format!("parameter `{text}` is not a tensor")))?;
    let close = closing_angle(body).ok_or_else(|| Error::Signature(format!("unbalanced type in `{text}`")))?;
    let ty = parse_tensor_body(&body[..close]).map_err(|e| Error::Signature(format!("{e} in `{text}`")))?;
    let attributes = &body[close + 1..];
    let donatable = attributes.contains("tf.aliasing_output") || attributes.contains("jax.buffer_donor = true");
    let sharding = sharding_attribute(attributes)?;
    Ok(Parameter {
        ty,
        donatable,
        sharding,
    })
}

fn closing_angle(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '<' => depth += 1,
            '>' if depth == 0 => return Some(i),
            '>' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// `2x3xf32` (an encoding after a comma is ignored).
fn parse_tensor_body(body: &str) -> std::result::Result<TensorType, String> {
    let shape = body.split(',').next().unwrap_or(body).trim();
    let mut pieces: Vec<&str> = shape.split('x').collect();
    let dtype_name = pieces.pop().unwrap_or_default();
    let dtype = ElementType::from_mlir_name(dtype_name)
        .ok_or_else(|| format!("element type `{dtype_name}` is not supported"))?;
    let dims = pieces
        .iter()
        .map(|d| d.parse::<i64>().map_err(|_| format!("dimension `{d}` is not static")))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    Ok(TensorType::new(dtype, dims))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_types_and_donation() {
        let program = r#"module @jit_step attributes {mhlo.num_partitions = 1 : i32} {
  func.func public @main(%arg0: tensor<2x3xf32> {tf.aliasing_output = 0 : i32}, %arg1: tensor<bf16>, %arg2: tensor<4xi32> {jax.buffer_donor = true, mhlo.sharding = "{replicated}"}) -> (tensor<2x3xf32>) {
    return %arg0 : tensor<2x3xf32>
  }
}"#;
        let signature = Signature::parse(program).unwrap();
        assert_eq!(signature.name, "jit_step");
        let types: Vec<String> = signature.parameters.iter().map(|p| p.ty.mlir()).collect();
        assert_eq!(types, ["tensor<2x3xf32>", "tensor<bf16>", "tensor<4xi32>"]);
        let donatable: Vec<bool> = signature.parameters.iter().map(|p| p.donatable).collect();
        assert_eq!(donatable, [true, false, true]);
        assert_eq!(signature.output_shardings, [Sharding::replicated()]);
    }

    #[test]
    fn reads_shardings_of_parameters_and_results() {
        let program = r#"module @spmd {
  func.func public @main(%a: tensor<8x4xf32> {tf.aliasing_output = 0 : i32, mhlo.sharding = "{devices=[4,1]<=[4]}"}, %b: tensor<4xf32>) -> (tensor<8x4xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}, tensor<f32> {mhlo.sharding = "{replicated}"}, tensor<2x4xf32>) {
    func.return %a : tensor<8x4xf32>
  }
}"#;
        let signature = Signature::parse(program).unwrap();
        let shardings: Vec<&Sharding> = signature.parameters.iter().map(|p| &p.sharding).collect();
        assert_eq!(shardings, [&Sharding::split(0, 4), &Sharding::replicated()]);
        assert!(signature.parameters[0].donatable);
        let replicated = Sharding::replicated();
        assert_eq!(
            signature.output_shardings,
            [Sharding::split(0, 4), replicated.clone(), replicated]
        );
        let none = Signature::parse("func.func @main(%a: tensor<f32>) {}").unwrap();
        assert!(none.output_shardings.is_empty());
        let odd = r#"func.func @main(%a: tensor<4xf32> {mhlo.sharding = "{maximal device=1}"}) {}"#;
        let error = Signature::parse(odd).unwrap_err().to_string();
        assert!(error.contains("not supported"), "{error}");
    }

    #[test]
    fn no_parameters_and_bad_types() {
        let empty = Signature::parse("func.func @main() -> tensor<f32> { }").unwrap();
        assert!(empty.parameters.is_empty());
        assert_eq!(empty.name, "main");
        let dynamic = Signature::parse("func.func @main(%a: tensor<?x3xf32>) {}").unwrap_err();
        assert!(dynamic.to_string().contains("not static"), "{dynamic}");
        let missing = Signature::parse("func.func @other() {}").unwrap_err();
        assert!(missing.to_string().contains("@main"), "{missing}");
    }
}
