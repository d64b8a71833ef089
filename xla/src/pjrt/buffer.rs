//! Device buffers: host-to-device and device-to-host copies, shape and dtype.

use std::ptr::NonNull;
use std::sync::Arc;

use super::api::pjrt_call;
use super::client::{Client, ClientInner};
use super::device::Device;
use super::ffi;
use crate::dtype::{ElementType, NativeType, TensorType, element_count};
use crate::error::{Error, Result};

/// An array on a device, freed when dropped. `Send + Sync`.
///
/// A buffer donated to a program is deleted by it: every later use returns
/// [`Error::BufferDeleted`].
pub struct Buffer {
    client: Arc<ClientInner>,
    raw: NonNull<ffi::Buffer>,
    ty: TensorType,
    device_bytes: usize,
    /// Index of the holding device among the client's devices (buffers never move).
    device_index: usize,
}

// SAFETY: PJRT buffers are thread-safe by the C API's contract; the Rust
// fields are immutable.
unsafe impl Send for Buffer {}
// SAFETY: as above.
unsafe impl Sync for Buffer {}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({})", self.ty)
    }
}

impl Client {
    /// Copies `data` (row-major, `dims` outermost first) to `device`.
    pub fn buffer_from_host<T: NativeType>(&self, data: &[T], dims: &[i64], device: &Device) -> Result<Buffer> {
        // SAFETY: `NativeType` values are plain bytes without padding.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<u8>(), std::mem::size_of_val(data)) };
        self.buffer_from_host_bytes(bytes, &TensorType::new(T::ELEMENT_TYPE, dims), device)
    }

    /// Copies raw row-major bytes of type `ty` to `device`.
    pub fn buffer_from_host_bytes(&self, bytes: &[u8], ty: &TensorType, device: &Device) -> Result<Buffer> {
        let element_size = ty.dtype.byte_size();
        if ty.dims.iter().any(|&d| d < 0) || bytes.len() != ty.byte_size() {
            return Err(Error::HostLength {
                dims: ty.dims.clone(),
                expected: ty.element_count(),
                found: bytes.len() / element_size,
            });
        }
        let device = self.own_device(device)?;
        let api = self.inner.api();
        let mut args = ffi::ClientBufferFromHostBufferArgs::new();
        args.client = self.inner.raw.as_ptr();
        args.data = bytes.as_ptr().cast();
        args.kind = ty.dtype.pjrt_code();
        args.dims = ty.dims.as_ptr();
        args.num_dims = ty.dims.len();
        args.host_buffer_semantics = ffi::HOST_BUFFER_IMMUTABLE_ONLY_DURING_CALL;
        args.device = device.raw();
        pjrt_call!(api, client_buffer_from_host_buffer, args)?;
        let buffer = Buffer::from_raw(&self.inner, args.buffer)?;
        api.await_event(args.done_with_host_buffer)?;
        Ok(buffer)
    }

    /// `device` itself if it belongs to this client, else the error naming it.
    pub(crate) fn own_device<'a>(&self, device: &'a Device) -> Result<&'a Device> {
        match self.inner.device_by_raw(device.raw()) {
            Some(_) => Ok(device),
            None => Err(Error::NoSuchDevice {
                index: device.index(),
                count: self.inner.devices.len(),
            }),
        }
    }
}

impl Buffer {
    /// Takes ownership of a buffer the plugin returned, reading its type.
    pub(crate) fn from_raw(client: &Arc<ClientInner>, raw: *mut ffi::Buffer) -> Result<Buffer> {
        let raw = NonNull::new(raw).ok_or_else(|| Error::unexpected("buffer", "the plugin returned no buffer"))?;
        let api = client.api();
        // Own it first, so that it is destroyed if a query fails.
        client.track_buffer();
        let mut buffer = Buffer {
            client: client.clone(),
            raw,
            ty: TensorType::new(ElementType::U8, []),
            device_bytes: 0,
            device_index: 0,
        };
        let mut device = ffi::BufferDeviceArgs::new();
        device.buffer = raw.as_ptr();
        pjrt_call!(api, buffer_device, device)?;
        buffer.device_index = client
            .device_by_raw(device.device)
            .ok_or_else(|| Error::unexpected("buffer_device", "the buffer is on a device the client does not list"))?
            .index();
        let mut kind = ffi::BufferElementTypeArgs::new();
        kind.buffer = raw.as_ptr();
        pjrt_call!(api, buffer_element_type, kind)?;
        let mut dims = ffi::BufferDimensionsArgs::new();
        dims.buffer = raw.as_ptr();
        pjrt_call!(api, buffer_dimensions, dims)?;
        let dims = if dims.num_dims == 0 || dims.dims.is_null() {
            Vec::new()
        } else {
            // SAFETY: the plugin returned `num_dims` sizes living as long as the buffer.
            unsafe { std::slice::from_raw_parts(dims.dims, dims.num_dims) }.to_vec()
        };
        buffer.ty = TensorType::new(ElementType::from_pjrt_code(kind.kind)?, dims);
        let mut size = ffi::BufferOnDeviceSizeInBytesArgs::new();
        size.buffer = raw.as_ptr();
        buffer.device_bytes = match pjrt_call!(api, buffer_on_device_size_in_bytes, size) {
            Ok(()) => size.on_device_size_in_bytes,
            Err(_) => buffer.ty.byte_size(),
        };
        client.track_bytes(buffer.device_bytes);
        Ok(buffer)
    }

    pub(crate) fn raw(&self) -> *mut ffi::Buffer {
        self.raw.as_ptr()
    }

    /// The buffer's element type and dimensions.
    pub fn tensor_type(&self) -> &TensorType {
        &self.ty
    }

    /// The element type.
    pub fn dtype(&self) -> ElementType {
        self.ty.dtype
    }

    /// The dimensions, outermost first.
    pub fn dims(&self) -> &[i64] {
        &self.ty.dims
    }

    /// Number of elements.
    pub fn element_count(&self) -> usize {
        element_count(&self.ty.dims)
    }

    /// Bytes the buffer holds on its device.
    pub fn device_bytes(&self) -> usize {
        self.device_bytes
    }

    /// True once the buffer was donated to a program (or otherwise deleted).
    pub fn is_deleted(&self) -> bool {
        let mut args = ffi::BufferIsDeletedArgs::new();
        args.buffer = self.raw();
        pjrt_call!(self.client.api(), buffer_is_deleted, args).is_ok_and(|()| args.is_deleted)
    }

    /// `Ok` while the buffer holds data, [`Error::BufferDeleted`] after donation.
    pub(crate) fn check_live(&self) -> Result<()> {
        if self.is_deleted() {
            Err(Error::BufferDeleted)
        } else {
            Ok(())
        }
    }

    /// The device holding the buffer.
    pub fn device(&self) -> &Device {
        &self.client.devices[self.device_index]
    }

    /// The address of the buffer's device memory: equal addresses mean one
    /// allocation (used to check that donation reused an input).
    pub fn device_address(&self) -> Result<usize> {
        self.check_live()?;
        let mut args = ffi::BufferUnsafePointerArgs::new();
        args.buffer = self.raw();
        pjrt_call!(self.client.api(), buffer_unsafe_pointer, args)?;
        Ok(args.buffer_pointer)
    }

    /// Waits until the computation producing the buffer is done, returning its error if any.
    pub fn block_until_ready(&self) -> Result<()> {
        self.check_live()?;
        let api = self.client.api();
        let mut args = ffi::BufferReadyEventArgs::new();
        args.buffer = self.raw();
        pjrt_call!(api, buffer_ready_event, args)?;
        api.await_event(args.event)
    }

    /// Copies the buffer to the host as `T`, which must be its element type.
    pub fn to_host<T: NativeType>(&self) -> Result<Vec<T>> {
        if T::ELEMENT_TYPE != self.ty.dtype {
            return Err(Error::DtypeMismatch {
                expected: T::ELEMENT_TYPE,
                found: self.ty.dtype,
            });
        }
        let mut out: Vec<T> = Vec::with_capacity(self.element_count());
        // SAFETY: the copy below writes `byte_size` bytes into the capacity.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(out.as_mut_ptr().cast::<u8>(), self.element_count() * size_of::<T>())
        };
        self.copy_to_host(bytes)?;
        // SAFETY: every element was written by the device copy, and any bit
        // pattern is a valid `T` (the `NativeType` contract).
        unsafe { out.set_len(self.element_count()) };
        Ok(out)
    }

    /// Copies the buffer to the host as dense row-major bytes.
    pub fn to_host_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.ty.byte_size()];
        self.copy_to_host(&mut out)?;
        Ok(out)
    }

    fn copy_to_host(&self, dst: &mut [u8]) -> Result<()> {
        self.check_live()?;
        if dst.is_empty() {
            return Ok(());
        }
        let api = self.client.api();
        let mut args = ffi::BufferToHostBufferArgs::new();
        args.src = self.raw();
        args.dst = dst.as_mut_ptr().cast();
        args.dst_size = dst.len();
        pjrt_call!(api, buffer_to_host_buffer, args)?;
        api.await_event(args.event)
    }

    /// Copies the buffer to another device of the same client.
    pub fn copy_to_device(&self, device: &Device) -> Result<Buffer> {
        self.check_live()?;
        if self.client.device_by_raw(device.raw()).is_none() {
            return Err(Error::NoSuchDevice {
                index: device.index(),
                count: self.client.devices.len(),
            });
        }
        let mut args = ffi::BufferCopyToDeviceArgs::new();
        args.buffer = self.raw();
        args.dst_device = device.raw();
        pjrt_call!(self.client.api(), buffer_copy_to_device, args)?;
        Buffer::from_raw(&self.client, args.dst_buffer)
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        self.client.untrack_buffer(self.device_bytes);
        let mut args = ffi::BufferDestroyArgs::new();
        args.buffer = self.raw();
        if let Err(error) = pjrt_call!(self.client.api(), buffer_destroy, args) {
            tracing::warn!("destroying a PJRT buffer: {error}");
        }
    }
}
