//! Traced tensor programs: write a computation as Rust code over symbolic
//! [`Tensor`]s of a [`Graph`], differentiate it with [`grad`], build a
//! [`Function`], emit StableHLO and compile it through a client's cache —
//! on one device, or partitioned over several by XLA's SPMD partitioner
//! ([`Function::sharded`], a [`TrainStep`] on a [`Mesh`] of several devices).
//!
//! ```
//! use grpo_xla::trace::{Graph, grad};
//! use grpo_xla::ElementType;
//! # fn main() -> grpo_xla::Result<()> {
//! let g = Graph::new("square_sum");
//! let x = g.parameter(ElementType::F32, &[3])?;
//! let loss = x.square()?.sum_all()?;
//! let dx = grad(&loss, &[&x])?.remove(0); // 2x
//! let function = g.build(&[&loss, &dx])?;
//! assert!(function.to_stablehlo()?.contains("stablehlo.multiply"));
//! # Ok(()) }
//! ```

mod autodiff;
mod emit;
mod function;
mod graph;
mod head;
mod mesh;
mod nn;
mod op;
mod ops;
mod optim;
mod optimize;
mod train;

pub use autodiff::{grad, value_and_grad};
pub use function::Function;
pub use graph::{Graph, Tensor};
pub use head::{HeadScale, linear_log_probs};
pub use mesh::{Mesh, Parallelism};
pub use ops::control::{fori_loop, optimization_barrier, rng_bit_generator, uniform, while_loop};
pub use ops::custom::{VjpFn, custom_vjp, rematerialized};
pub use ops::gather::{GatherDims, ScatterDims};
pub use optim::{AdamW, AdamWState, Optimizer, Sgd, clip_by_global_norm, global_norm};
pub use train::{StepMetrics, TrainState, TrainStep, TrainStepSpec};
