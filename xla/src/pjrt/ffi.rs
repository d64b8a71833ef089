//! Hand-declared `#[repr(C)]` layouts of the PJRT C API, version 0.81.
//!
//! Only the argument structs grpo calls are declared; every slot of the
//! function table is present (so offsets are right), the unused ones typed as
//! [`RawFn`]. Names follow the C header with the `PJRT_` prefix dropped and
//! functions in snake case. Every argument struct starts with `struct_size`
//! and `extension_start`; [`args_struct!`] adds both, computes the C macro
//! `PJRT_STRUCT_SIZE` (end of the last field) and gives a zeroed `new()`.
//!
//! C enums are declared as `c_int` aliases so that any value a newer plugin
//! writes stays a valid Rust value.

#![allow(missing_docs)]

use std::ffi::{c_char, c_int, c_void};

/// Major version of the layouts below.
pub const API_MAJOR: i32 = 0;
/// Minor version of the layouts below; plugins older than this are refused.
pub const API_MINOR: i32 = 81;

macro_rules! opaque {
    ($($name:ident),* $(,)?) => {
        $(
            /// Opaque object owned by the plugin.
            #[repr(C)]
            pub struct $name {
                _private: [u8; 0],
            }
        )*
    };
}

opaque!(
    Error,
    Event,
    Client,
    Device,
    DeviceDescription,
    Memory,
    Executable,
    LoadedExecutable,
    Buffer,
    SerializedExecutable,
    ExecuteContext,
);

/// End offset of the last field of a struct, as `PJRT_STRUCT_SIZE` computes it.
macro_rules! last_field_end {
    ($name:ident; $field:ident : $ty:ty) => {
        std::mem::offset_of!($name, $field) + std::mem::size_of::<$ty>()
    };
    ($name:ident; $field:ident : $ty:ty, $($rest:tt)+) => {
        last_field_end!($name; $($rest)+)
    };
}

/// Declares an argument struct with the two common leading fields.
macro_rules! args_struct {
    ($name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        #[repr(C)]
        pub struct $name {
            pub struct_size: usize,
            pub extension_start: *mut ExtensionBase,
            $(pub $field: $ty,)*
        }

        impl $name {
            /// `PJRT_STRUCT_SIZE` of this struct for API 0.81.
            pub const STRUCT_SIZE: usize = last_field_end!(
                $name; struct_size: usize, extension_start: *mut ExtensionBase $(, $field: $ty)*
            );

            /// All fields zero (null pointers, `None` functions) and `struct_size` set.
            pub fn new() -> Self {
                // SAFETY: every field is an integer, a raw pointer, an
                // `Option` of a function pointer or a union of those, for
                // which all-zero bytes are a valid value.
                let mut value: Self = unsafe { std::mem::zeroed() };
                value.struct_size = Self::STRUCT_SIZE;
                value
            }
        }
    };
}

#[repr(C)]
pub struct ExtensionBase {
    pub struct_size: usize,
    pub kind: c_int,
    pub next: *mut ExtensionBase,
}

#[repr(C)]
pub struct ApiVersion {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub major_version: c_int,
    pub minor_version: c_int,
}

impl ApiVersion {
    /// `PJRT_Api_Version_STRUCT_SIZE`.
    pub const STRUCT_SIZE: usize = last_field_end!(ApiVersion; minor_version: c_int);
}

pub type ErrorCode = c_int;
pub type BufferType = c_int;
pub type NamedValueType = c_int;
pub type HostBufferSemantics = c_int;

pub const NAMED_VALUE_STRING: NamedValueType = 0;
pub const NAMED_VALUE_INT64: NamedValueType = 1;
pub const NAMED_VALUE_INT64_LIST: NamedValueType = 2;
pub const NAMED_VALUE_FLOAT: NamedValueType = 3;
pub const NAMED_VALUE_BOOL: NamedValueType = 4;

/// `PJRT_HostBufferSemantics_kImmutableOnlyDuringCall`.
pub const HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL: HostBufferSemantics = 0;

/// The value of a [`NamedValue`]; which member is live depends on its type.
#[repr(C)]
#[derive(Clone, Copy)]
pub union NamedValueUnion {
    pub string_value: *const c_char,
    pub int64_value: i64,
    pub int64_array_value: *const i64,
    pub float_value: f32,
    pub bool_value: bool,
}

args_struct!(NamedValue {
    name: *const c_char,
    name_size: usize,
    kind: NamedValueType,
    value: NamedValueUnion,
    value_size: usize,
});

args_struct!(ErrorDestroyArgs { error: *mut Error });
args_struct!(ErrorMessageArgs {
    error: *const Error,
    message: *const c_char,
    message_size: usize,
});
args_struct!(ErrorGetCodeArgs {
    error: *const Error,
    code: ErrorCode,
});

args_struct!(PluginInitializeArgs {});
args_struct!(PluginAttributesArgs {
    attributes: *const NamedValue,
    num_attributes: usize,
});

args_struct!(EventDestroyArgs { event: *mut Event });
args_struct!(EventAwaitArgs { event: *mut Event });

args_struct!(ClientCreateArgs {
    create_options: *const NamedValue,
    num_options: usize,
    kv_get_callback: *mut c_void,
    kv_get_user_arg: *mut c_void,
    kv_put_callback: *mut c_void,
    kv_put_user_arg: *mut c_void,
    client: *mut Client,
    kv_try_get_callback: *mut c_void,
    kv_try_get_user_arg: *mut c_void,
});
args_struct!(ClientDestroyArgs { client: *mut Client });
args_struct!(ClientPlatformNameArgs {
    client: *mut Client,
    platform_name: *const c_char,
    platform_name_size: usize,
});
args_struct!(ClientPlatformVersionArgs {
    client: *mut Client,
    platform_version: *const c_char,
    platform_version_size: usize,
});
args_struct!(ClientAddressableDevicesArgs {
    client: *mut Client,
    addressable_devices: *const *mut Device,
    num_addressable_devices: usize,
});

args_struct!(Program {
    code: *mut c_char,
    code_size: usize,
    format: *const c_char,
    format_size: usize,
});
args_struct!(ClientCompileArgs {
    client: *mut Client,
    program: *const Program,
    compile_options: *const c_char,
    compile_options_size: usize,
    executable: *mut LoadedExecutable,
});

args_struct!(ClientBufferFromHostBufferArgs {
    client: *mut Client,
    data: *const c_void,
    kind: BufferType,
    dims: *const i64,
    num_dims: usize,
    byte_strides: *const i64,
    num_byte_strides: usize,
    host_buffer_semantics: HostBufferSemantics,
    device: *mut Device,
    memory: *mut Memory,
    device_layout: *mut c_void,
    done_with_host_buffer: *mut Event,
    buffer: *mut Buffer,
});

args_struct!(DeviceDescriptionIdArgs {
    device_description: *mut DeviceDescription,
    id: c_int,
});
args_struct!(DeviceDescriptionProcessIndexArgs {
    device_description: *mut DeviceDescription,
    process_index: c_int,
});
args_struct!(DeviceDescriptionKindArgs {
    device_description: *mut DeviceDescription,
    device_kind: *const c_char,
    device_kind_size: usize,
});
args_struct!(DeviceDescriptionDebugStringArgs {
    device_description: *mut DeviceDescription,
    debug_string: *const c_char,
    debug_string_size: usize,
});
args_struct!(DeviceGetDescriptionArgs {
    device: *mut Device,
    device_description: *mut DeviceDescription,
});
args_struct!(DeviceLocalHardwareIdArgs {
    device: *mut Device,
    local_hardware_id: c_int,
});
args_struct!(DeviceMemoryStatsArgs {
    device: *mut Device,
    bytes_in_use: i64,
    peak_bytes_in_use: i64,
    peak_bytes_in_use_is_set: bool,
    num_allocs: i64,
    num_allocs_is_set: bool,
    largest_alloc_size: i64,
    largest_alloc_size_is_set: bool,
    bytes_limit: i64,
    bytes_limit_is_set: bool,
    bytes_reserved: i64,
    bytes_reserved_is_set: bool,
    peak_bytes_reserved: i64,
    peak_bytes_reserved_is_set: bool,
    bytes_reservable_limit: i64,
    bytes_reservable_limit_is_set: bool,
    largest_free_block_bytes: i64,
    largest_free_block_bytes_is_set: bool,
    pool_bytes: i64,
    pool_bytes_is_set: bool,
    peak_pool_bytes: i64,
    peak_pool_bytes_is_set: bool,
});

args_struct!(ExecutableDestroyArgs {
    executable: *mut Executable,
});
args_struct!(LoadedExecutableDestroyArgs {
    executable: *mut LoadedExecutable,
});
args_struct!(LoadedExecutableGetExecutableArgs {
    loaded_executable: *mut LoadedExecutable,
    executable: *mut Executable,
});
args_struct!(LoadedExecutableAddressableDevicesArgs {
    executable: *mut LoadedExecutable,
    addressable_devices: *const *mut Device,
    num_addressable_devices: usize,
});
args_struct!(ExecuteOptions {
    send_callbacks: *mut *mut c_void,
    recv_callbacks: *mut *mut c_void,
    num_send_ops: usize,
    num_recv_ops: usize,
    launch_id: c_int,
    non_donatable_input_indices: *const i64,
    num_non_donatable_input_indices: usize,
    context: *mut ExecuteContext,
    call_location: *const c_char,
    num_tasks: usize,
    task_ids: *mut c_int,
    incarnation_ids: *mut i64,
});
args_struct!(LoadedExecutableExecuteArgs {
    executable: *mut LoadedExecutable,
    options: *mut ExecuteOptions,
    argument_lists: *const *const *mut Buffer,
    num_devices: usize,
    num_args: usize,
    output_lists: *const *mut *mut Buffer,
    device_complete_events: *mut *mut Event,
    execute_device: *mut Device,
});
args_struct!(ExecutableOutputElementTypesArgs {
    executable: *mut Executable,
    output_types: *mut BufferType,
    num_output_types: usize,
});
args_struct!(ExecutableOutputDimensionsArgs {
    executable: *mut Executable,
    num_outputs: usize,
    dims: *const i64,
    dim_sizes: *const usize,
});
args_struct!(ExecutableSerializeArgs {
    executable: *const Executable,
    serialized_bytes: *const c_char,
    serialized_bytes_size: usize,
    serialized_executable: *mut SerializedExecutable,
    serialized_executable_deleter: Option<unsafe extern "C" fn(*mut SerializedExecutable)>,
});
args_struct!(ExecutableGetCompiledMemoryStatsArgs {
    executable: *mut Executable,
    generated_code_size_in_bytes: i64,
    argument_size_in_bytes: i64,
    output_size_in_bytes: i64,
    alias_size_in_bytes: i64,
    temp_size_in_bytes: i64,
    host_generated_code_size_in_bytes: i64,
    host_argument_size_in_bytes: i64,
    host_output_size_in_bytes: i64,
    host_alias_size_in_bytes: i64,
    host_temp_size_in_bytes: i64,
    peak_memory_in_bytes: i64,
    total_size_in_bytes: i64,
});
args_struct!(ExecutableDeserializeAndLoadArgs {
    client: *mut Client,
    serialized_executable: *const c_char,
    serialized_executable_size: usize,
    loaded_executable: *mut LoadedExecutable,
    overridden_serialized_compile_options: *const c_char,
    overridden_serialized_compile_options_size: usize,
});

args_struct!(BufferDestroyArgs { buffer: *mut Buffer });
args_struct!(BufferElementTypeArgs {
    buffer: *mut Buffer,
    kind: BufferType,
});
args_struct!(BufferDimensionsArgs {
    buffer: *mut Buffer,
    dims: *const i64,
    num_dims: usize,
});
args_struct!(BufferToHostBufferArgs {
    src: *mut Buffer,
    host_layout: *mut c_void,
    dst: *mut c_void,
    dst_size: usize,
    event: *mut Event,
});
args_struct!(BufferOnDeviceSizeInBytesArgs {
    buffer: *mut Buffer,
    on_device_size_in_bytes: usize,
});
args_struct!(BufferIsDeletedArgs {
    buffer: *mut Buffer,
    is_deleted: bool,
});
args_struct!(BufferCopyToDeviceArgs {
    buffer: *mut Buffer,
    dst_device: *mut Device,
    dst_buffer: *mut Buffer,
});
args_struct!(BufferDeviceArgs {
    buffer: *mut Buffer,
    device: *mut Device,
});
args_struct!(BufferReadyEventArgs {
    buffer: *mut Buffer,
    event: *mut Event,
});
args_struct!(BufferUnsafePointerArgs {
    buffer: *mut Buffer,
    buffer_pointer: usize,
});

/// A function of the table that returns an error (null on success).
pub type Fn<A> = Option<unsafe extern "C" fn(*mut A) -> *mut Error>;
/// A slot of the table grpo does not call.
pub type RawFn = Option<unsafe extern "C" fn()>;

/// The function table a plugin's `GetPjrtApi` returns, API 0.81 order.
#[repr(C)]
pub struct Api {
    pub struct_size: usize,
    pub extension_start: *mut ExtensionBase,
    pub pjrt_api_version: ApiVersion,

    pub error_destroy: Option<unsafe extern "C" fn(*mut ErrorDestroyArgs)>,
    pub error_message: Option<unsafe extern "C" fn(*mut ErrorMessageArgs)>,
    pub error_get_code: Fn<ErrorGetCodeArgs>,

    pub plugin_initialize: Fn<PluginInitializeArgs>,
    pub plugin_attributes: Fn<PluginAttributesArgs>,

    pub event_destroy: Fn<EventDestroyArgs>,
    pub event_is_ready: RawFn,
    pub event_error: RawFn,
    pub event_await: Fn<EventAwaitArgs>,
    pub event_on_ready: RawFn,

    pub client_create: Fn<ClientCreateArgs>,
    pub client_destroy: Fn<ClientDestroyArgs>,
    pub client_platform_name: Fn<ClientPlatformNameArgs>,
    pub client_process_index: RawFn,
    pub client_platform_version: Fn<ClientPlatformVersionArgs>,
    pub client_devices: RawFn,
    pub client_addressable_devices: Fn<ClientAddressableDevicesArgs>,
    pub client_lookup_device: RawFn,
    pub client_lookup_addressable_device: RawFn,
    pub client_addressable_memories: RawFn,
    pub client_compile: Fn<ClientCompileArgs>,
    pub client_default_device_assignment: RawFn,
    pub client_buffer_from_host_buffer: Fn<ClientBufferFromHostBufferArgs>,

    pub device_description_id: Fn<DeviceDescriptionIdArgs>,
    pub device_description_process_index: Fn<DeviceDescriptionProcessIndexArgs>,
    pub device_description_attributes: RawFn,
    pub device_description_kind: Fn<DeviceDescriptionKindArgs>,
    pub device_description_debug_string: Fn<DeviceDescriptionDebugStringArgs>,
    pub device_description_to_string: RawFn,

    pub device_get_description: Fn<DeviceGetDescriptionArgs>,
    pub device_is_addressable: RawFn,
    pub device_local_hardware_id: Fn<DeviceLocalHardwareIdArgs>,
    pub device_addressable_memories: RawFn,
    pub device_default_memory: RawFn,
    pub device_memory_stats: Fn<DeviceMemoryStatsArgs>,

    pub memory_id: RawFn,
    pub memory_kind: RawFn,
    pub memory_debug_string: RawFn,
    pub memory_to_string: RawFn,
    pub memory_addressable_by_devices: RawFn,

    pub executable_destroy: Fn<ExecutableDestroyArgs>,
    pub executable_name: RawFn,
    pub executable_num_replicas: RawFn,
    pub executable_num_partitions: RawFn,
    pub executable_num_outputs: RawFn,
    pub executable_size_of_generated_code_in_bytes: RawFn,
    pub executable_get_cost_analysis: RawFn,
    pub executable_output_memory_kinds: RawFn,
    pub executable_optimized_program: RawFn,
    pub executable_serialize: Fn<ExecutableSerializeArgs>,

    pub loaded_executable_destroy: Fn<LoadedExecutableDestroyArgs>,
    pub loaded_executable_get_executable: Fn<LoadedExecutableGetExecutableArgs>,
    pub loaded_executable_addressable_devices: Fn<LoadedExecutableAddressableDevicesArgs>,
    pub loaded_executable_delete: RawFn,
    pub loaded_executable_is_deleted: RawFn,
    pub loaded_executable_execute: Fn<LoadedExecutableExecuteArgs>,
    pub executable_deserialize_and_load: Fn<ExecutableDeserializeAndLoadArgs>,
    pub loaded_executable_fingerprint: RawFn,

    pub buffer_destroy: Fn<BufferDestroyArgs>,
    pub buffer_element_type: Fn<BufferElementTypeArgs>,
    pub buffer_dimensions: Fn<BufferDimensionsArgs>,
    pub buffer_unpadded_dimensions: RawFn,
    pub buffer_dynamic_dimension_indices: RawFn,
    pub buffer_get_memory_layout: RawFn,
    pub buffer_on_device_size_in_bytes: Fn<BufferOnDeviceSizeInBytesArgs>,
    pub buffer_device: Fn<BufferDeviceArgs>,
    pub buffer_memory: RawFn,
    pub buffer_delete: RawFn,
    pub buffer_is_deleted: Fn<BufferIsDeletedArgs>,
    pub buffer_copy_to_device: Fn<BufferCopyToDeviceArgs>,
    pub buffer_to_host_buffer: Fn<BufferToHostBufferArgs>,
    pub buffer_is_on_cpu: RawFn,
    pub buffer_ready_event: Fn<BufferReadyEventArgs>,
    pub buffer_unsafe_pointer: Fn<BufferUnsafePointerArgs>,
    pub buffer_increase_external_reference_count: RawFn,
    pub buffer_decrease_external_reference_count: RawFn,
    pub buffer_opaque_device_memory_data_pointer: RawFn,

    pub copy_to_device_stream_destroy: RawFn,
    pub copy_to_device_stream_add_chunk: RawFn,
    pub copy_to_device_stream_total_bytes: RawFn,
    pub copy_to_device_stream_granule_size: RawFn,
    pub copy_to_device_stream_current_bytes: RawFn,

    pub topology_description_create: RawFn,
    pub topology_description_destroy: RawFn,
    pub topology_description_platform_name: RawFn,
    pub topology_description_platform_version: RawFn,
    pub topology_description_get_device_descriptions: RawFn,
    pub topology_description_serialize: RawFn,
    pub topology_description_attributes: RawFn,

    pub compile: RawFn,

    pub executable_output_element_types: Fn<ExecutableOutputElementTypesArgs>,
    pub executable_output_dimensions: Fn<ExecutableOutputDimensionsArgs>,

    pub buffer_copy_to_memory: RawFn,
    pub client_create_view_of_device_buffer: RawFn,
    pub executable_fingerprint: RawFn,
    pub client_topology_description: RawFn,
    pub executable_get_compiled_memory_stats: Fn<ExecutableGetCompiledMemoryStatsArgs>,
    pub memory_kind_id: RawFn,
    pub execute_context_create: RawFn,
    pub execute_context_destroy: RawFn,
    pub buffer_copy_raw_to_host: RawFn,

    pub async_host_to_device_transfer_manager_destroy: RawFn,
    pub async_host_to_device_transfer_manager_transfer_data: RawFn,
    pub client_create_buffers_for_async_host_to_device: RawFn,
    pub async_host_to_device_transfer_manager_retrieve_buffer: RawFn,
    pub async_host_to_device_transfer_manager_device: RawFn,
    pub async_host_to_device_transfer_manager_buffer_count: RawFn,
    pub async_host_to_device_transfer_manager_buffer_size: RawFn,
    pub async_host_to_device_transfer_manager_set_buffer_error: RawFn,
    pub async_host_to_device_transfer_manager_add_metadata: RawFn,

    pub client_dma_map: RawFn,
    pub client_dma_unmap: RawFn,
    pub client_create_uninitialized_buffer: RawFn,
    pub client_update_global_process_info: RawFn,
    pub topology_description_deserialize: RawFn,
    pub client_create_alias_buffer: RawFn,
    pub client_fulfill_alias_buffer: RawFn,
    pub loaded_executable_get_device_assignment: RawFn,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// `PJRT_Api_STRUCT_SIZE` for API 0.81.
    const API_STRUCT_SIZE: usize = last_field_end!(Api; loaded_executable_get_device_assignment: RawFn);

    /// `*_STRUCT_SIZE` values of the 0.81 header, as gcc computes them.
    #[test]
    fn struct_sizes_match_the_c_header() {
        let expected: &[(&str, usize, usize)] = &[
            ("ApiVersion", ApiVersion::STRUCT_SIZE, 24),
            ("NamedValue", NamedValue::STRUCT_SIZE, 56),
            ("ErrorDestroyArgs", ErrorDestroyArgs::STRUCT_SIZE, 24),
            ("ErrorMessageArgs", ErrorMessageArgs::STRUCT_SIZE, 40),
            ("ErrorGetCodeArgs", ErrorGetCodeArgs::STRUCT_SIZE, 28),
            ("PluginInitializeArgs", PluginInitializeArgs::STRUCT_SIZE, 16),
            ("PluginAttributesArgs", PluginAttributesArgs::STRUCT_SIZE, 32),
            ("EventDestroyArgs", EventDestroyArgs::STRUCT_SIZE, 24),
            ("EventAwaitArgs", EventAwaitArgs::STRUCT_SIZE, 24),
            ("ClientCreateArgs", ClientCreateArgs::STRUCT_SIZE, 88),
            ("ClientDestroyArgs", ClientDestroyArgs::STRUCT_SIZE, 24),
            ("ClientPlatformNameArgs", ClientPlatformNameArgs::STRUCT_SIZE, 40),
            ("ClientPlatformVersionArgs", ClientPlatformVersionArgs::STRUCT_SIZE, 40),
            (
                "ClientAddressableDevicesArgs",
                ClientAddressableDevicesArgs::STRUCT_SIZE,
                40,
            ),
            ("Program", Program::STRUCT_SIZE, 48),
            ("ClientCompileArgs", ClientCompileArgs::STRUCT_SIZE, 56),
            (
                "ClientBufferFromHostBufferArgs",
                ClientBufferFromHostBufferArgs::STRUCT_SIZE,
                120,
            ),
            ("DeviceDescriptionIdArgs", DeviceDescriptionIdArgs::STRUCT_SIZE, 28),
            (
                "DeviceDescriptionProcessIndexArgs",
                DeviceDescriptionProcessIndexArgs::STRUCT_SIZE,
                28,
            ),
            ("DeviceDescriptionKindArgs", DeviceDescriptionKindArgs::STRUCT_SIZE, 40),
            (
                "DeviceDescriptionDebugStringArgs",
                DeviceDescriptionDebugStringArgs::STRUCT_SIZE,
                40,
            ),
            ("DeviceGetDescriptionArgs", DeviceGetDescriptionArgs::STRUCT_SIZE, 32),
            ("DeviceLocalHardwareIdArgs", DeviceLocalHardwareIdArgs::STRUCT_SIZE, 28),
            ("DeviceMemoryStatsArgs", DeviceMemoryStatsArgs::STRUCT_SIZE, 185),
            ("ExecutableDestroyArgs", ExecutableDestroyArgs::STRUCT_SIZE, 24),
            (
                "LoadedExecutableDestroyArgs",
                LoadedExecutableDestroyArgs::STRUCT_SIZE,
                24,
            ),
            (
                "LoadedExecutableGetExecutableArgs",
                LoadedExecutableGetExecutableArgs::STRUCT_SIZE,
                32,
            ),
            (
                "LoadedExecutableAddressableDevicesArgs",
                LoadedExecutableAddressableDevicesArgs::STRUCT_SIZE,
                40,
            ),
            ("ExecuteOptions", ExecuteOptions::STRUCT_SIZE, 112),
            (
                "LoadedExecutableExecuteArgs",
                LoadedExecutableExecuteArgs::STRUCT_SIZE,
                80,
            ),
            (
                "ExecutableOutputElementTypesArgs",
                ExecutableOutputElementTypesArgs::STRUCT_SIZE,
                40,
            ),
            (
                "ExecutableOutputDimensionsArgs",
                ExecutableOutputDimensionsArgs::STRUCT_SIZE,
                48,
            ),
            ("ExecutableSerializeArgs", ExecutableSerializeArgs::STRUCT_SIZE, 56),
            (
                "ExecutableGetCompiledMemoryStatsArgs",
                ExecutableGetCompiledMemoryStatsArgs::STRUCT_SIZE,
                120,
            ),
            (
                "ExecutableDeserializeAndLoadArgs",
                ExecutableDeserializeAndLoadArgs::STRUCT_SIZE,
                64,
            ),
            ("BufferDestroyArgs", BufferDestroyArgs::STRUCT_SIZE, 24),
            ("BufferElementTypeArgs", BufferElementTypeArgs::STRUCT_SIZE, 28),
            ("BufferDimensionsArgs", BufferDimensionsArgs::STRUCT_SIZE, 40),
            ("BufferToHostBufferArgs", BufferToHostBufferArgs::STRUCT_SIZE, 56),
            (
                "BufferOnDeviceSizeInBytesArgs",
                BufferOnDeviceSizeInBytesArgs::STRUCT_SIZE,
                32,
            ),
            ("BufferIsDeletedArgs", BufferIsDeletedArgs::STRUCT_SIZE, 25),
            ("BufferCopyToDeviceArgs", BufferCopyToDeviceArgs::STRUCT_SIZE, 40),
            ("BufferDeviceArgs", BufferDeviceArgs::STRUCT_SIZE, 32),
            ("BufferReadyEventArgs", BufferReadyEventArgs::STRUCT_SIZE, 32),
            ("BufferUnsafePointerArgs", BufferUnsafePointerArgs::STRUCT_SIZE, 32),
            ("Api", API_STRUCT_SIZE, 984),
        ];
        let wrong: Vec<_> = expected.iter().filter(|(_, rust, c)| rust != c).collect();
        assert!(wrong.is_empty(), "(struct, rust size, C size): {wrong:?}");
    }

    #[test]
    fn function_table_offsets_match_the_c_header() {
        assert_eq!(offset_of!(Api, client_compile), 200);
        assert_eq!(offset_of!(Api, loaded_executable_execute), 480);
        assert_eq!(offset_of!(Api, loaded_executable_get_device_assignment), 976);
    }
}
