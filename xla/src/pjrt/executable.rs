//! Compiled programs: compile, serialize, and execute with borrowed or
//! donated arguments on one or several devices.
//!
//! Every call is checked against the `@main` signature (argument count,
//! dtype, shape, device, donation) before it reaches the plugin, so a wrong
//! call is an [`Error`], never an abort inside XLA.
//!
//! A program compiled into SPMD partitions
//! ([`CompileOptions::partitioned`](super::CompileOptions::partitioned))
//! takes one argument list per device, each holding that device's shard
//! under the parameter's `mhlo.sharding`, and returns each device's shard of
//! every output; [`Executable::execute_sharded`] does the same over
//! [`ShardedBuffer`]s. On one device XLA ignores shardings, and so do the checks.

use std::ffi::c_char;
use std::ptr::NonNull;
use std::sync::Arc;

use super::api::{Api, pjrt_call};
use super::buffer::Buffer;
use super::client::{Client, ClientInner};
use super::device::Device;
use super::ffi;
use super::sharded::ShardedBuffer;
use super::signature::Signature;
use crate::dtype::{ElementType, TensorType};
use crate::error::{Error, Result};
use crate::sharding::Sharding;

/// One argument of a call: lent to the program, or given to it. `B` is a
/// [`Buffer`], or a [`ShardedBuffer`] for [`Executable::execute_sharded`].
#[derive(Debug)]
pub enum Arg<'a, B = Buffer> {
    /// The program reads the buffer; it stays valid.
    Borrow(&'a B),
    /// The program may reuse the buffer's memory for an output (its
    /// parameter must carry `tf.aliasing_output`); the buffer is deleted.
    Donate(&'a B),
}

impl<B> Clone for Arg<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Arg<'_, B> {}

impl<'a, B> Arg<'a, B> {
    fn buffer(self) -> &'a B {
        match self {
            Arg::Borrow(b) | Arg::Donate(b) => b,
        }
    }

    /// The same kind of argument over `f(buffer)`.
    fn map<C>(self, f: impl FnOnce(&'a B) -> &'a C) -> Arg<'a, C> {
        match self {
            Arg::Borrow(b) => Arg::Borrow(f(b)),
            Arg::Donate(b) => Arg::Donate(f(b)),
        }
    }
}

/// A compiled program loaded on its devices. Cheap to clone; `Send + Sync`.
#[derive(Clone)]
pub struct Executable {
    inner: Arc<ExecutableInner>,
}

struct ExecutableInner {
    client: Arc<ClientInner>,
    raw: NonNull<ffi::LoadedExecutable>,
    signature: Signature,
    outputs: Vec<TensorType>,
    devices: Vec<Device>,
    layout: Layout,
}

// SAFETY: PJRT loaded executables may be executed from several threads at
// once; the Rust fields are immutable.
unsafe impl Send for ExecutableInner {}
// SAFETY: as above.
unsafe impl Sync for ExecutableInner {}

/// How parameters and outputs are laid out over the program's devices.
#[derive(Default)]
struct Layout {
    /// Each parameter's sharding and the type every device receives.
    parameters: Vec<(Sharding, TensorType)>,
    /// Each output's sharding.
    outputs: Vec<Sharding>,
}

impl Layout {
    /// The layout of `signature` over `devices` devices: its shardings when
    /// the program is partitioned, whole tensors on one device (where XLA
    /// ignores shardings).
    fn new(signature: &Signature, devices: usize) -> Result<Layout> {
        if devices <= 1 {
            return Ok(Layout {
                parameters: signature
                    .parameters
                    .iter()
                    .map(|p| (Sharding::replicated(), p.ty.clone()))
                    .collect(),
                outputs: vec![Sharding::replicated(); signature.output_shardings.len()],
            });
        }
        let parameters = signature
            .parameters
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let what = format!("parameter {i} of program `{}`", signature.name);
                Ok((p.sharding.clone(), p.sharding.shard_type_of(&what, &p.ty, devices)?))
            })
            .collect::<Result<_>>()?;
        Ok(Layout {
            parameters,
            outputs: signature.output_shardings.clone(),
        })
    }
}

impl std::fmt::Debug for Executable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executable")
            .field("name", &self.inner.signature.name)
            .field("outputs", &self.inner.outputs)
            .finish()
    }
}

impl Drop for ExecutableInner {
    fn drop(&mut self) {
        let mut args = ffi::LoadedExecutableDestroyArgs::new();
        args.executable = self.raw.as_ptr();
        if let Err(error) = pjrt_call!(self.client.api(), loaded_executable_destroy, args) {
            tracing::warn!("destroying a PJRT executable: {error}");
        }
    }
}

impl Executable {
    /// Compiles `program` with serialized options, bypassing the cache.
    pub(crate) fn compile_uncached(client: &Client, program: &str, options: &[u8]) -> Result<Executable> {
        let signature = Signature::parse(program);
        let inner = &client.inner;
        let format = "mlir";
        let mut code = program.as_bytes().to_vec();
        let mut source = ffi::Program::new();
        source.code = code.as_mut_ptr().cast::<c_char>();
        source.code_size = code.len();
        source.format = format.as_ptr().cast::<c_char>();
        source.format_size = format.len();
        let mut args = ffi::ClientCompileArgs::new();
        args.client = inner.raw.as_ptr();
        args.program = &source;
        args.compile_options = options.as_ptr().cast::<c_char>();
        args.compile_options_size = options.len();
        pjrt_call!(inner.api(), client_compile, args)?;
        Executable::wrap(inner, args.executable, signature?)
    }

    /// Loads an executable serialized by [`Executable::serialize`] from the same plugin.
    pub(crate) fn deserialize(client: &Client, bytes: &[u8], program: &str) -> Result<Executable> {
        let signature = Signature::parse(program)?;
        let inner = &client.inner;
        let mut args = ffi::ExecutableDeserializeAndLoadArgs::new();
        args.client = inner.raw.as_ptr();
        args.serialized_executable = bytes.as_ptr().cast::<c_char>();
        args.serialized_executable_size = bytes.len();
        pjrt_call!(inner.api(), executable_deserialize_and_load, args)?;
        Executable::wrap(inner, args.loaded_executable, signature)
    }

    fn wrap(client: &Arc<ClientInner>, raw: *mut ffi::LoadedExecutable, signature: Signature) -> Result<Executable> {
        let raw = NonNull::new(raw)
            .ok_or_else(|| Error::unexpected("client_compile", "the plugin returned no executable"))?;
        let mut inner = ExecutableInner {
            client: client.clone(),
            raw,
            signature,
            outputs: Vec::new(),
            devices: Vec::new(),
            layout: Layout::default(),
        };
        let api = client.api();
        inner.devices = addressable_devices(api, client, raw)?;
        inner.outputs = with_executable(api, raw, output_types)??;
        inner.layout = Layout::new(&inner.signature, inner.devices.len())?;
        Ok(Executable { inner: Arc::new(inner) })
    }

    /// The program's name (`module @name`).
    pub fn name(&self) -> &str {
        &self.inner.signature.name
    }

    /// The parameters of `@main`.
    pub fn signature(&self) -> &Signature {
        &self.inner.signature
    }

    /// The type of each output, per device (the shard on each device of a
    /// partitioned program).
    pub fn output_types(&self) -> &[TensorType] {
        &self.inner.outputs
    }

    /// The devices the program runs on, one per replica (and partition).
    pub fn devices(&self) -> &[Device] {
        &self.inner.devices
    }

    /// What the compiler planned for one run on a device: its arguments,
    /// outputs (less those that reuse an argument's memory) and
    /// temporaries, in bytes.
    pub fn memory_stats(&self) -> Result<ProgramMemory> {
        let api = self.inner.client.api();
        with_executable(api, self.inner.raw, |api, executable| {
            let mut args = ffi::ExecutableGetCompiledMemoryStatsArgs::new();
            args.executable = executable;
            pjrt_call!(api, executable_get_compiled_memory_stats, args)?;
            let bytes = |n: i64| usize::try_from(n).unwrap_or(0);
            Ok(ProgramMemory {
                arguments: bytes(args.argument_size_in_bytes),
                outputs: bytes(args.output_size_in_bytes),
                aliased: bytes(args.alias_size_in_bytes),
                temporaries: bytes(args.temp_size_in_bytes),
                peak: bytes(args.peak_memory_in_bytes),
                code: bytes(args.generated_code_size_in_bytes),
            })
        })?
    }

    /// The plugin's serialization of the program, where the plugin has one.
    pub fn serialize(&self) -> Result<Vec<u8>> {
        let api = self.inner.client.api();
        with_executable(api, self.inner.raw, |api, executable| {
            let mut args = ffi::ExecutableSerializeArgs::new();
            args.executable = executable;
            pjrt_call!(api, executable_serialize, args)?;
            let bytes = if args.serialized_bytes.is_null() {
                Vec::new()
            } else {
                // SAFETY: the plugin returned this many bytes, alive until the deleter runs.
                unsafe { std::slice::from_raw_parts(args.serialized_bytes.cast::<u8>(), args.serialized_bytes_size) }
                    .to_vec()
            };
            if let Some(deleter) = args.serialized_executable_deleter {
                // SAFETY: called once, as the C API asks.
                unsafe { deleter(args.serialized_executable) };
            }
            Ok(bytes)
        })?
    }

    /// Runs a single-device program, borrowing every argument.
    pub fn execute(&self, args: &[&Buffer]) -> Result<Vec<Buffer>> {
        let args: Vec<Arg<'_>> = args.iter().map(|&b| Arg::Borrow(b)).collect();
        self.execute_args(&args)
    }

    /// Runs a single-device program with borrowed and donated arguments.
    pub fn execute_args(&self, args: &[Arg<'_>]) -> Result<Vec<Buffer>> {
        let mut outputs = self.execute_replicated(&[args])?;
        Ok(outputs.pop().unwrap_or_default())
    }

    /// Runs a partitioned program over sharded arrays, each argument laid out
    /// as its parameter's sharding; returns each output as a sharded array.
    pub fn execute_sharded(&self, args: &[Arg<'_, ShardedBuffer>]) -> Result<Vec<ShardedBuffer>> {
        let inner = &*self.inner;
        let program = || inner.signature.name.clone();
        let parameters = &inner.signature.parameters;
        if args.len() != parameters.len() {
            return Err(Error::ArgumentCount {
                program: program(),
                expected: parameters.len(),
                found: args.len(),
            });
        }
        let devices = inner.devices.len();
        for (index, (arg, (sharding, _))) in args.iter().zip(&inner.layout.parameters).enumerate() {
            let array = arg.buffer();
            if array.tensor_type() != &parameters[index].ty {
                return Err(Error::ArgumentType {
                    program: program(),
                    index,
                    expected: parameters[index].ty.clone(),
                    found: array.tensor_type().clone(),
                });
            }
            if array.sharding() != sharding {
                return Err(Error::ArgumentSharding {
                    program: program(),
                    index,
                    expected: sharding.to_string(),
                    found: array.sharding().to_string(),
                });
            }
            if array.shards().len() != devices {
                return Err(Error::DeviceCount {
                    program: program(),
                    expected: devices,
                    found: array.shards().len(),
                });
            }
        }
        let lists: Vec<Vec<Arg<'_>>> = (0..devices)
            .map(|device| args.iter().map(|a| a.map(|array| &array.shards()[device])).collect())
            .collect();
        let list_refs: Vec<&[Arg<'_>]> = lists.iter().map(Vec::as_slice).collect();
        let mut per_device: Vec<_> = self
            .execute_replicated(&list_refs)?
            .into_iter()
            .map(Vec::into_iter)
            .collect();
        inner
            .outputs
            .iter()
            .zip(&inner.layout.outputs)
            .map(|(shard, sharding)| {
                // Every device list holds one buffer per output (execute_replicated's contract).
                let shards = per_device
                    .iter_mut()
                    .map(|list| list.next().expect("an output per device"))
                    .collect();
                ShardedBuffer::from_shards(sharding.whole_type(shard), sharding.clone(), shards)
            })
            .collect()
    }

    /// Runs the program on all its devices, with one argument list per device
    /// (in [`Executable::devices`] order) holding that device's shard of each
    /// argument; returns one output list per device.
    pub fn execute_replicated(&self, lists: &[&[Arg<'_>]]) -> Result<Vec<Vec<Buffer>>> {
        let non_donatable = self.check_call(lists)?;
        let inner = &*self.inner;
        let raw_lists: Vec<Vec<*mut ffi::Buffer>> = lists
            .iter()
            .map(|list| list.iter().map(|a| a.buffer().raw()).collect())
            .collect();
        let raw_list_ptrs: Vec<*const *mut ffi::Buffer> = raw_lists.iter().map(|l| l.as_ptr()).collect();
        let mut outputs: Vec<Vec<*mut ffi::Buffer>> = lists
            .iter()
            .map(|_| vec![std::ptr::null_mut(); inner.outputs.len()])
            .collect();
        let output_ptrs: Vec<*mut *mut ffi::Buffer> = outputs.iter_mut().map(|l| l.as_mut_ptr()).collect();

        let mut options = ffi::ExecuteOptions::new();
        options.non_donatable_input_indices = non_donatable.as_ptr();
        options.num_non_donatable_input_indices = non_donatable.len();
        let mut args = ffi::LoadedExecutableExecuteArgs::new();
        args.executable = inner.raw.as_ptr();
        args.options = &mut options;
        args.argument_lists = raw_list_ptrs.as_ptr();
        args.num_devices = lists.len();
        args.num_args = inner.signature.parameters.len();
        args.output_lists = output_ptrs.as_ptr();
        pjrt_call!(inner.client.api(), loaded_executable_execute, args)?;

        // Take ownership of every returned buffer before checking any, so none leaks.
        let owned: Vec<Vec<Result<Buffer>>> = outputs
            .into_iter()
            .map(|list| {
                list.into_iter()
                    .map(|raw| Buffer::from_raw(&inner.client, raw))
                    .collect()
            })
            .collect();
        owned
            .into_iter()
            .map(|list| list.into_iter().collect::<Result<Vec<_>>>())
            .collect()
    }

    /// Checks a call before it reaches the plugin; returns the indices of
    /// donatable parameters whose argument is only borrowed.
    fn check_call(&self, lists: &[&[Arg<'_>]]) -> Result<Vec<i64>> {
        let inner = &*self.inner;
        let program = || inner.signature.name.clone();
        if lists.len() != inner.devices.len() {
            return Err(Error::DeviceCount {
                program: program(),
                expected: inner.devices.len(),
                found: lists.len(),
            });
        }
        let parameters = &inner.signature.parameters;
        let mut borrowed_donatable = vec![false; parameters.len()];
        for (position, (list, device)) in lists.iter().zip(&inner.devices).enumerate() {
            if list.len() != parameters.len() {
                return Err(Error::ArgumentCount {
                    program: program(),
                    expected: parameters.len(),
                    found: list.len(),
                });
            }
            for (index, ((arg, parameter), (sharding, shard))) in
                list.iter().zip(parameters).zip(&inner.layout.parameters).enumerate()
            {
                let buffer = arg.buffer();
                buffer.check_live()?;
                if buffer.tensor_type() != shard {
                    return Err(if sharding.is_replicated() {
                        Error::ArgumentType {
                            program: program(),
                            index,
                            expected: shard.clone(),
                            found: buffer.tensor_type().clone(),
                        }
                    } else {
                        Error::ShardType {
                            program: program(),
                            index,
                            device: position,
                            expected: shard.clone(),
                            found: buffer.tensor_type().clone(),
                        }
                    });
                }
                let on = buffer.device();
                if on.raw() != device.raw() {
                    return Err(Error::ArgumentDevice {
                        program: program(),
                        index,
                        expected: device.id(),
                        found: on.id(),
                    });
                }
                match arg {
                    Arg::Donate(_) if !parameter.donatable => {
                        return Err(Error::NotDonatable {
                            program: program(),
                            index,
                        });
                    }
                    Arg::Donate(_) if passed_more_than_once(buffer, lists) => {
                        return Err(Error::DonatedTwice {
                            program: program(),
                            index,
                        });
                    }
                    Arg::Borrow(_) if parameter.donatable => borrowed_donatable[index] = true,
                    _ => {}
                }
            }
        }
        Ok(borrowed_donatable
            .iter()
            .enumerate()
            .filter(|(_, borrowed)| **borrowed)
            .map(|(index, _)| index as i64)
            .collect())
    }
}

fn passed_more_than_once(buffer: &Buffer, lists: &[&[Arg<'_>]]) -> bool {
    lists
        .iter()
        .flat_map(|list| list.iter())
        .filter(|a| a.buffer().raw() == buffer.raw())
        .count()
        > 1
}

/// A compiled program's planned memory per device, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProgramMemory {
    /// Its arguments.
    pub arguments: usize,
    /// Its outputs.
    pub outputs: usize,
    /// Output bytes that reuse an argument's memory (donated arguments).
    pub aliased: usize,
    /// Temporaries live during a run.
    pub temporaries: usize,
    /// The most live at once during a run, arguments included, where the
    /// plugin reports it (0 where not).
    pub peak: usize,
    /// Generated code.
    pub code: usize,
}

/// Runs `f` on the `PJRT_Executable` behind a loaded executable, then frees it.
fn with_executable<T>(
    api: Api,
    loaded: NonNull<ffi::LoadedExecutable>,
    f: impl FnOnce(Api, *mut ffi::Executable) -> T,
) -> Result<T> {
    let mut get = ffi::LoadedExecutableGetExecutableArgs::new();
    get.loaded_executable = loaded.as_ptr();
    pjrt_call!(api, loaded_executable_get_executable, get)?;
    let result = f(api, get.executable);
    let mut destroy = ffi::ExecutableDestroyArgs::new();
    destroy.executable = get.executable;
    pjrt_call!(api, executable_destroy, destroy)?;
    Ok(result)
}

/// The element type and dimensions of each output.
fn output_types(api: Api, executable: *mut ffi::Executable) -> Result<Vec<TensorType>> {
    let mut types = ffi::ExecutableOutputElementTypesArgs::new();
    types.executable = executable;
    pjrt_call!(api, executable_output_element_types, types)?;
    let mut dims = ffi::ExecutableOutputDimensionsArgs::new();
    dims.executable = executable;
    pjrt_call!(api, executable_output_dimensions, dims)?;
    let count = types.num_output_types;
    if count == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the plugin returned `count` types and `num_outputs` dimension
    // counts whose sum is the length of `dims`, all owned by the executable.
    let (codes, ranks) = unsafe {
        (
            std::slice::from_raw_parts(types.output_types, count),
            std::slice::from_raw_parts(dims.dim_sizes, dims.num_outputs),
        )
    };
    let total: usize = ranks.iter().sum();
    // SAFETY: as above.
    let all_dims = if total == 0 {
        &[][..]
    } else {
        unsafe { std::slice::from_raw_parts(dims.dims, total) }
    };
    let mut offset = 0;
    codes
        .iter()
        .zip(ranks)
        .map(|(&code, &rank)| {
            let shape = all_dims[offset..offset + rank].to_vec();
            offset += rank;
            Ok(TensorType::new(ElementType::from_pjrt_code(code)?, shape))
        })
        .collect()
}

fn addressable_devices(
    api: Api,
    client: &ClientInner,
    executable: NonNull<ffi::LoadedExecutable>,
) -> Result<Vec<Device>> {
    let mut args = ffi::LoadedExecutableAddressableDevicesArgs::new();
    args.executable = executable.as_ptr();
    pjrt_call!(api, loaded_executable_addressable_devices, args)?;
    if args.addressable_devices.is_null() {
        return Ok(Vec::new());
    }
    // SAFETY: the plugin returned this many device handles owned by the client.
    let raws = unsafe { std::slice::from_raw_parts(args.addressable_devices, args.num_addressable_devices) };
    raws.iter()
        .map(|&raw| {
            client.device_by_raw(raw).cloned().ok_or_else(|| {
                Error::unexpected(
                    "loaded_executable_addressable_devices",
                    "the executable runs on a device the client does not list",
                )
            })
        })
        .collect()
}
