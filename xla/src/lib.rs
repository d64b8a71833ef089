//! grpo-xla: grpo's way to XLA.
//!
//! - [`pjrt`]: the runtime over PJRT C API plugins (CPU, CUDA, TPU): load a
//!   [`Plugin`], create a [`Client`], move [`Buffer`]s, compile StableHLO text
//!   into [`Executable`]s (cached in memory and on disk) and run them with
//!   borrowed or donated arguments.
//! - [`dtype`]: element types and the Rust types that carry them.
//! - [`sharding`]: how a tensor is laid out over the devices of an SPMD
//!   program ([`Sharding`]); [`ShardedBuffer`]s hold such arrays and
//!   [`CompileOptions::partitioned`] compiles for XLA's SPMD partitioner.
//! - [`trace`]: traced tensor programs: ops, autodiff, StableHLO emission.
//! - [`programs`]: hand-written StableHLO programs for benchmarks and checks.
//!
//! ```
//! use grpo_xla::{Client, ClientOptions, CompileOptions, Platform};
//! # fn main() -> grpo_xla::Result<()> {
//! let client = Client::for_platform(Platform::Cpu, ClientOptions::default())?;
//! let device = client.device(0)?;
//! let program = "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
//!   %y = stablehlo.add %x, %x : tensor<2xf32>
//!   return %y : tensor<2xf32>
//! }";
//! let double = client.compile(program, &CompileOptions::default())?;
//! let x = client.buffer_from_host(&[1.0f32, 2.0], &[2], device)?;
//! let y = double.execute(&[&x])?;
//! assert_eq!(y[0].to_host::<f32>()?, [2.0, 4.0]);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod dtype;
mod error;
pub mod pjrt;
pub mod sharding;
pub mod trace;

pub use dtype::{ElementType, NativeType, Pred, TensorType};
pub use error::{Error, ErrorCode, Result};
pub use pjrt::{
    Arg, Buffer, Client, ClientOptions, CompileOptions, CompileStats, Device, Executable, LiveBuffers, Platform,
    Plugin, PluginSearch, ProgramMemory, ShardedBuffer,
};
pub use sharding::Sharding;
