//! The crate's error type: one enum with a variant per kind of failure.

use std::fmt;
use std::path::PathBuf;

use crate::dtype::{ElementType, TensorType};

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong loading plugins, compiling and running programs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No plugin for the platform was found in any searched place.
    #[error("no PJRT plugin for `{platform}` found (searched: {searched}); {advice}")]
    PluginNotFound {
        /// The platform asked for (`cpu`, `cuda`, `tpu`).
        platform: String,
        /// The places looked at, comma separated.
        searched: String,
        /// What to run to get one.
        advice: String,
    },
    /// The platform name is not one grpo knows.
    #[error("unknown platform `{0}`: choose cpu, cuda or tpu, or give a plugin path")]
    UnknownPlatform(String),
    /// `dlopen` failed.
    #[error("cannot load PJRT plugin {path}: {message}")]
    PluginLoad {
        /// The plugin file.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
    /// The library has no `GetPjrtApi` entry point.
    #[error("{path} is not a PJRT plugin: it exports no `GetPjrtApi` function")]
    NotAPlugin {
        /// The library file.
        path: PathBuf,
    },
    /// The plugin's API version cannot work with grpo's declared layouts.
    #[error(
        "PJRT plugin {path} speaks API {major}.{minor}, grpo needs {need_major}.{need_minor} or a later {need_major}.x: {advice}"
    )]
    ApiVersion {
        /// The plugin file.
        path: PathBuf,
        /// The plugin's major version.
        major: i32,
        /// The plugin's minor version.
        minor: i32,
        /// Major version grpo declares.
        need_major: i32,
        /// Oldest minor version grpo accepts.
        need_minor: i32,
        /// What to do about it.
        advice: &'static str,
    },
    /// The plugin's function table is too short for a function grpo calls.
    #[error("the PJRT plugin has no `{function}` (its function table is {table_size} bytes); install a newer plugin")]
    MissingFunction {
        /// The C name of the function.
        function: &'static str,
        /// The plugin's `PJRT_Api.struct_size`.
        table_size: usize,
    },
    /// A PJRT call returned an error.
    #[error("PJRT {function} failed ({code}): {message}")]
    Pjrt {
        /// The C function that failed.
        function: &'static str,
        /// The plugin's error code.
        code: ErrorCode,
        /// The plugin's message.
        message: String,
    },
    /// A program was called with the wrong number of arguments.
    #[error("program `{program}` takes {expected} arguments, got {found}")]
    ArgumentCount {
        /// Name of the program.
        program: String,
        /// Parameters of `@main`.
        expected: usize,
        /// Arguments given.
        found: usize,
    },
    /// An argument's dtype or shape differs from the parameter's.
    #[error("argument {index} of program `{program}` must be {expected}, got {found}")]
    ArgumentType {
        /// Name of the program.
        program: String,
        /// Position of the argument.
        index: usize,
        /// The parameter's type.
        expected: TensorType,
        /// The buffer's type.
        found: TensorType,
    },
    /// An argument lives on another device than the one the program runs on.
    #[error(
        "argument {index} of program `{program}` is on device {found}, the program runs on device {expected}; copy it with Buffer::copy_to_device"
    )]
    ArgumentDevice {
        /// Name of the program.
        program: String,
        /// Position of the argument.
        index: usize,
        /// Device id the program runs on.
        expected: i32,
        /// Device id of the buffer.
        found: i32,
    },
    /// A buffer was donated to a parameter that does not accept donation.
    #[error(
        "argument {index} of program `{program}` is donated, but its parameter has no `tf.aliasing_output`; borrow it instead"
    )]
    NotDonatable {
        /// Name of the program.
        program: String,
        /// Position of the argument.
        index: usize,
    },
    /// A donated buffer also appears as another argument.
    #[error(
        "argument {index} of program `{program}` is a donated buffer that is also passed elsewhere in the same call"
    )]
    DonatedTwice {
        /// Name of the program.
        program: String,
        /// Position of the argument.
        index: usize,
    },
    /// The number of per-device argument lists differs from the program's devices.
    #[error("program `{program}` runs on {expected} devices, got argument lists for {found}")]
    DeviceCount {
        /// Name of the program.
        program: String,
        /// Devices the program was compiled for.
        expected: usize,
        /// Argument lists given.
        found: usize,
    },
    /// A sharding does not fit its tensor or the program's devices.
    #[error("cannot lay out {what} ({ty}) as {sharding}: {message}")]
    Sharding {
        /// The tensor: `parameter 2 of program `step``, `a host array`.
        what: String,
        /// Its whole (unsharded) type.
        ty: TensorType,
        /// The sharding, as HLO text.
        sharding: String,
        /// What does not fit.
        message: String,
    },
    /// A per-device argument of a partitioned program is not its shard's type.
    #[error(
        "argument {index} of program `{program}` on device {device} must be its shard {expected}, got {found}; cut the whole array by the parameter's sharding (Client::sharded_from_host)"
    )]
    ShardType {
        /// Name of the program.
        program: String,
        /// Position of the argument.
        index: usize,
        /// Partition (device position) of the argument list.
        device: usize,
        /// The shard's type.
        expected: TensorType,
        /// The buffer's type.
        found: TensorType,
    },
    /// A sharded argument has another sharding than its parameter.
    #[error("argument {index} of program `{program}` must be sharded {expected}, it is sharded {found}")]
    ArgumentSharding {
        /// Name of the program.
        program: String,
        /// Position of the argument.
        index: usize,
        /// The parameter's sharding.
        expected: String,
        /// The argument's sharding.
        found: String,
    },
    /// The buffer was donated to a program (or deleted) and holds no data any more.
    #[error("the buffer was donated to a program and can no longer be used")]
    BufferDeleted,
    /// Host data does not fit the requested shape.
    #[error("host data has {found} elements, shape {dims:?} needs {expected}")]
    HostLength {
        /// The requested dimensions.
        dims: Vec<i64>,
        /// Elements the shape needs.
        expected: usize,
        /// Elements given.
        found: usize,
    },
    /// A buffer was read as another element type than it holds.
    #[error("buffer holds {found}, read as {expected}")]
    DtypeMismatch {
        /// The type asked for.
        expected: ElementType,
        /// The type the buffer holds.
        found: ElementType,
    },
    /// The plugin reported an element type grpo does not handle.
    #[error("the plugin returned element type code {0}, which grpo does not handle")]
    UnsupportedType(i32),
    /// The `@main` signature of a program could not be read.
    #[error("cannot read the signature of @main: {0}")]
    Signature(String),
    /// Compile options that cannot work on this client.
    #[error("invalid compile options: {0}")]
    CompileOptions(String),
    /// An op was applied to tensors whose shapes or dtypes it does not accept.
    #[error("{op}: {message}")]
    Trace {
        /// The op being added.
        op: &'static str,
        /// What is wrong, with the shapes involved.
        message: String,
    },
    /// Reverse-mode differentiation reached an op that has no gradient rule.
    #[error("cannot differentiate through `{op}`: it has no gradient rule; wrap its input in stop_gradient")]
    NoGradient {
        /// The op.
        op: &'static str,
    },
    /// A device index is out of range.
    #[error("device {index} does not exist: the client has {count} addressable devices")]
    NoSuchDevice {
        /// Index asked for.
        index: usize,
        /// Devices there are.
        count: usize,
    },
    /// Reading or writing the on-disk compile cache or plugin folder failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or folder.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// A PJRT error code (`PJRT_Error_Code`), shown by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub i32);

impl ErrorCode {
    /// `INVALID_ARGUMENT`.
    pub const INVALID_ARGUMENT: ErrorCode = ErrorCode(3);
    /// `UNIMPLEMENTED`.
    pub const UNIMPLEMENTED: ErrorCode = ErrorCode(12);
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 17] = [
            "OK",
            "CANCELLED",
            "UNKNOWN",
            "INVALID_ARGUMENT",
            "DEADLINE_EXCEEDED",
            "NOT_FOUND",
            "ALREADY_EXISTS",
            "PERMISSION_DENIED",
            "RESOURCE_EXHAUSTED",
            "FAILED_PRECONDITION",
            "ABORTED",
            "OUT_OF_RANGE",
            "UNIMPLEMENTED",
            "INTERNAL",
            "UNAVAILABLE",
            "DATA_LOSS",
            "UNAUTHENTICATED",
        ];
        match usize::try_from(self.0).ok().and_then(|i| NAMES.get(i)) {
            Some(name) => f.write_str(name),
            None => write!(f, "code {}", self.0),
        }
    }
}

impl Error {
    /// An [`Error::Trace`] for `op`.
    pub(crate) fn trace(op: &'static str, message: impl Into<String>) -> Self {
        Error::Trace {
            op,
            message: message.into(),
        }
    }

    /// A plugin answer grpo cannot use (a null handle, an unknown device).
    pub(crate) fn unexpected(function: &'static str, message: &str) -> Self {
        Error::Pjrt {
            function,
            code: ErrorCode(2),
            message: message.to_string(),
        }
    }

    /// An [`Error::Io`] for `path`.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
