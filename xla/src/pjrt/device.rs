//! Devices of a client: their ids, kinds and memory statistics.

use std::ptr::NonNull;

use super::api::{Api, pjrt_call, string_from_raw};
use super::ffi;
use crate::error::Result;

/// One addressable device of a [`Client`](super::Client).
///
/// Plain data read once when the client is created; it identifies the device
/// to the client it came from and is meaningless with another client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    raw: DevicePtr,
    id: i32,
    index: usize,
    local_hardware_id: i32,
    process_index: i32,
    kind: String,
    description: String,
}

/// The plugin's device handle; owned by the client, valid while it lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct DevicePtr(NonNull<ffi::Device>);

// SAFETY: a device handle is an immutable identifier that PJRT lets any
// thread pass to its calls.
unsafe impl Send for DevicePtr {}
// SAFETY: as above.
unsafe impl Sync for DevicePtr {}

/// Memory use a device reports (`PJRT_Device_MemoryStats`); not every
/// plugin has it (the CPU plugin does not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes allocated now.
    pub bytes_in_use: i64,
    /// Most bytes allocated at once, if reported.
    pub peak_bytes_in_use: Option<i64>,
    /// Bytes the device may allocate, if reported.
    pub bytes_limit: Option<i64>,
}

impl Device {
    /// Reads the client's addressable devices.
    pub(crate) fn addressable(api: Api, client: NonNull<ffi::Client>) -> Result<Vec<Device>> {
        let mut args = ffi::ClientAddressableDevicesArgs::new();
        args.client = client.as_ptr();
        pjrt_call!(api, client_addressable_devices, args)?;
        if args.addressable_devices.is_null() {
            return Ok(Vec::new());
        }
        // SAFETY: the plugin returned `num_addressable_devices` handles owned by the client.
        let raws = unsafe { std::slice::from_raw_parts(args.addressable_devices, args.num_addressable_devices) };
        raws.iter()
            .enumerate()
            .filter_map(|(index, &raw)| NonNull::new(raw).map(|raw| (index, raw)))
            .map(|(index, raw)| Device::read(api, raw, index))
            .collect()
    }

    fn read(api: Api, raw: NonNull<ffi::Device>, index: usize) -> Result<Device> {
        let mut get = ffi::DeviceGetDescriptionArgs::new();
        get.device = raw.as_ptr();
        pjrt_call!(api, device_get_description, get)?;
        let description = get.device_description;

        let mut id = ffi::DeviceDescriptionIdArgs::new();
        id.device_description = description;
        pjrt_call!(api, device_description_id, id)?;
        let mut process = ffi::DeviceDescriptionProcessIndexArgs::new();
        process.device_description = description;
        pjrt_call!(api, device_description_process_index, process)?;
        let mut kind = ffi::DeviceDescriptionKindArgs::new();
        kind.device_description = description;
        pjrt_call!(api, device_description_kind, kind)?;
        let mut debug = ffi::DeviceDescriptionDebugStringArgs::new();
        debug.device_description = description;
        pjrt_call!(api, device_description_debug_string, debug)?;
        let mut hardware = ffi::DeviceLocalHardwareIdArgs::new();
        hardware.device = raw.as_ptr();
        pjrt_call!(api, device_local_hardware_id, hardware)?;

        Ok(Device {
            raw: DevicePtr(raw),
            id: id.id,
            index,
            local_hardware_id: hardware.local_hardware_id,
            process_index: process.process_index,
            // SAFETY: the strings live as long as the description, owned by the client.
            kind: unsafe { string_from_raw(kind.device_kind, kind.device_kind_size) },
            // SAFETY: as above.
            description: unsafe { string_from_raw(debug.debug_string, debug.debug_string_size) },
        })
    }

    pub(crate) fn raw(&self) -> *mut ffi::Device {
        self.raw.0.as_ptr()
    }

    /// The device's global id.
    pub fn id(&self) -> i32 {
        self.id
    }

    /// Position among the client's addressable devices.
    pub fn index(&self) -> usize {
        self.index
    }

    /// The id of the hardware within this host.
    pub fn local_hardware_id(&self) -> i32 {
        self.local_hardware_id
    }

    /// The process that owns the device.
    pub fn process_index(&self) -> i32 {
        self.process_index
    }

    /// The device kind, e.g. `cpu` or `NVIDIA H200`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The plugin's description of the device.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Memory statistics, or an `UNIMPLEMENTED` error where the plugin has none.
    pub(crate) fn memory_stats(&self, api: Api) -> Result<MemoryStats> {
        let mut args = ffi::DeviceMemoryStatsArgs::new();
        args.device = self.raw();
        pjrt_call!(api, device_memory_stats, args)?;
        let set = |value: i64, is_set: bool| is_set.then_some(value);
        Ok(MemoryStats {
            bytes_in_use: args.bytes_in_use,
            peak_bytes_in_use: set(args.peak_bytes_in_use, args.peak_bytes_in_use_is_set),
            bytes_limit: set(args.bytes_limit, args.bytes_limit_is_set),
        })
    }
}
