//! The loaded function table and the one way grpo calls into it.
//!
//! [`pjrt_call!`] checks that the plugin's table is long enough to hold the
//! function (`PJRT_Api.struct_size`), calls it, and turns a returned
//! `PJRT_Error` into [`Error::Pjrt`] with the plugin's code and message.

use std::ffi::c_char;

use super::ffi;
use crate::error::{Error, ErrorCode, Result};

/// A plugin's function table. Plugins are never unloaded, so it is `'static`.
#[derive(Clone, Copy)]
pub(crate) struct Api(&'static ffi::Api);

// SAFETY: the table is immutable after `GetPjrtApi` returns, and the PJRT C
// API requires its functions to be callable from any thread.
unsafe impl Send for Api {}
// SAFETY: as above.
unsafe impl Sync for Api {}

impl Api {
    /// Wraps the table returned by `GetPjrtApi`.
    ///
    /// # Safety
    /// `raw` must point to a table that stays valid for the rest of the process.
    pub(crate) unsafe fn from_raw(raw: *const ffi::Api) -> Api {
        // SAFETY: guaranteed by the caller.
        Api(unsafe { &*raw })
    }

    /// The raw table.
    pub(crate) fn raw(self) -> &'static ffi::Api {
        self.0
    }

    /// The function at `offset`, if the plugin's table reaches that far and fills it.
    pub(crate) fn function<F>(self, offset: usize, name: &'static str, slot: Option<F>) -> Result<F> {
        let missing = Error::MissingFunction {
            function: name,
            table_size: self.0.struct_size,
        };
        if offset + std::mem::size_of::<usize>() > self.0.struct_size {
            return Err(missing);
        }
        slot.ok_or(missing)
    }

    /// Converts a returned error pointer into a `Result`, destroying the error.
    pub(crate) fn check(self, error: *mut ffi::Error, function: &'static str) -> Result<()> {
        if error.is_null() {
            return Ok(());
        }
        let mut message_args = ffi::ErrorMessageArgs::new();
        message_args.error = error;
        let message = match self.0.error_message {
            Some(f) => {
                // SAFETY: `error` is a live error returned by the plugin.
                unsafe { f(&mut message_args) };
                // SAFETY: the message lives as long as `error`, which is still alive.
                unsafe { string_from_raw(message_args.message, message_args.message_size) }
            }
            None => String::from("(the plugin gives no message)"),
        };
        let mut code_args = ffi::ErrorGetCodeArgs::new();
        code_args.error = error;
        let code = match self.0.error_get_code {
            // SAFETY: as above; an error from GetCode itself is ignored.
            Some(f) if unsafe { f(&mut code_args) }.is_null() => code_args.code,
            _ => 2,
        };
        if let Some(destroy) = self.0.error_destroy {
            let mut destroy_args = ffi::ErrorDestroyArgs::new();
            destroy_args.error = error;
            // SAFETY: destroys the error exactly once; it is not used after.
            unsafe { destroy(&mut destroy_args) };
        }
        Err(Error::Pjrt {
            function,
            code: ErrorCode(code),
            message,
        })
    }
}

/// Copies a (pointer, length) string the plugin returned.
///
/// # Safety
/// `data` must be null or point to `len` readable bytes.
pub(crate) unsafe fn string_from_raw(data: *const c_char, len: usize) -> String {
    if data.is_null() || len == 0 {
        return String::new();
    }
    // SAFETY: guaranteed by the caller.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Calls `PJRT_<function>` with `args` through an [`Api`], returning `Result<()>`.
///
/// The caller guarantees that every pointer in `args` is valid for the call.
macro_rules! pjrt_call {
    ($api:expr, $function:ident, $args:expr) => {{
        let api: $crate::pjrt::api::Api = $api;
        api.function(
            std::mem::offset_of!($crate::pjrt::ffi::Api, $function),
            stringify!($function),
            api.raw().$function,
        )
        .and_then(|f| {
            // SAFETY: `f` comes from the plugin's table and `$args` is the
            // argument struct its C signature declares, with `struct_size` set.
            let error = unsafe { f(&mut $args) };
            api.check(error, stringify!($function))
        })
    }};
}

pub(crate) use pjrt_call;

impl Api {
    /// Waits for `event`, destroys it, and returns the error it carried.
    /// A null event counts as already complete.
    pub(crate) fn await_event(self, event: *mut ffi::Event) -> Result<()> {
        if event.is_null() {
            return Ok(());
        }
        let mut wait = ffi::EventAwaitArgs::new();
        wait.event = event;
        let waited = pjrt_call!(self, event_await, wait);
        let mut destroy = ffi::EventDestroyArgs::new();
        destroy.event = event;
        let destroyed = pjrt_call!(self, event_destroy, destroy);
        waited.and(destroyed)
    }
}
