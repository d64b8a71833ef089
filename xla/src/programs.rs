//! Hand-written StableHLO programs for benchmarks and runtime checks.

use crate::dtype::ElementType;

/// `(m×k) · (k×n)` in one element type, as a `dot_general` in generic syntax.
pub fn matmul(m: usize, k: usize, n: usize, dtype: ElementType) -> String {
    let t = dtype.mlir_name();
    format!(
        r#"module @matmul_{m}x{k}x{n}_{t} {{
  func.func public @main(%a: tensor<{m}x{k}x{t}>, %b: tensor<{k}x{n}x{t}>) -> tensor<{m}x{n}x{t}> {{
    %c = "stablehlo.dot_general"(%a, %b) {{dot_dimension_numbers = #stablehlo.dot<lhs_contracting_dimensions = [1], rhs_contracting_dimensions = [0]>}} : (tensor<{m}x{k}x{t}>, tensor<{k}x{n}x{t}>) -> tensor<{m}x{n}x{t}>
    return %c : tensor<{m}x{n}x{t}>
  }}
}}"#
    )
}
