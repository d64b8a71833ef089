//! TensorBoard event files: scalars and Markdown text that TensorBoard
//! shows and `wandb sync --sync-tensorboard` imports.
//!
//! A file is a sequence of records in TFRecord framing — the data's length
//! as a little-endian u64, that length's masked CRC-32C, the data, the
//! data's masked CRC-32C — each record an `Event` protobuf (TensorFlow's
//! `event.proto` and `summary.proto`, the fields used here written out as
//! prost messages). The first event names the file version; a run that
//! resumes writes a `SessionLog` START at its first step, which tells
//! TensorBoard to drop what earlier files logged from that step on.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;

use crate::error::Result;
use crate::hooks::io;

/// One event (TensorFlow's `Event`, the fields grpo writes).
#[derive(Clone, PartialEq, Message)]
struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    wall_time: f64,
    /// The training step.
    #[prost(int64, tag = "2")]
    step: i64,
    /// What the event carries.
    #[prost(oneof = "What", tags = "3, 5, 7")]
    what: Option<What>,
}

/// What an [`Event`] carries.
#[derive(Clone, PartialEq, prost::Oneof)]
enum What {
    /// The file's format version (the first event).
    #[prost(string, tag = "3")]
    FileVersion(String),
    /// Tagged values.
    #[prost(message, tag = "5")]
    Summary(Summary),
    /// A session starting (a resumed run).
    #[prost(message, tag = "7")]
    SessionLog(SessionLog),
}

/// TensorFlow's `Summary`: tagged values.
#[derive(Clone, PartialEq, Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

/// One tagged value of a [`Summary`].
#[derive(Clone, PartialEq, Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    /// Which plug-in shows it (text needs one; scalars do not).
    #[prost(message, optional, tag = "9")]
    metadata: Option<SummaryMetadata>,
    #[prost(oneof = "Reading", tags = "2, 8")]
    reading: Option<Reading>,
}

/// A [`SummaryValue`]'s value.
#[derive(Clone, PartialEq, prost::Oneof)]
enum Reading {
    /// A scalar.
    #[prost(float, tag = "2")]
    Simple(f32),
    /// A tensor (here, one string).
    #[prost(message, tag = "8")]
    Tensor(TensorProto),
}

/// TensorFlow's `SummaryMetadata`, its plug-in alone.
#[derive(Clone, PartialEq, Message)]
struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    plugin_data: Option<PluginData>,
}

/// TensorFlow's `SummaryMetadata.PluginData`.
#[derive(Clone, PartialEq, Message)]
struct PluginData {
    #[prost(string, tag = "1")]
    plugin_name: String,
    #[prost(bytes = "vec", tag = "2")]
    content: Vec<u8>,
}

/// TensorFlow's `TensorProto`, as a scalar string.
#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    /// `DT_STRING` = 7.
    #[prost(int32, tag = "1")]
    dtype: i32,
    /// No dimensions: a scalar.
    #[prost(message, optional, tag = "2")]
    tensor_shape: Option<TensorShape>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    string_val: Vec<Vec<u8>>,
}

/// TensorFlow's `TensorShapeProto` (no dimensions here).
#[derive(Clone, PartialEq, Message)]
struct TensorShape {}

/// TensorFlow's `SessionLog`, its status alone.
#[derive(Clone, PartialEq, Message)]
struct SessionLog {
    /// START = 1.
    #[prost(int32, tag = "1")]
    status: i32,
}

const DT_STRING: i32 = 7;
const SESSION_START: i32 = 1;

/// An event file being written.
pub struct EventFile {
    path: PathBuf,
    file: File,
}

impl EventFile {
    /// Starts a new event file in `dir` (created if missing), named as
    /// TensorFlow names them (`events.out.tfevents.<seconds>.<host>.<pid>.0`).
    pub fn create(dir: &Path) -> Result<EventFile> {
        std::fs::create_dir_all(dir).map_err(|e| io(dir, "create", e))?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".to_string());
        let name = format!(
            "events.out.tfevents.{}.{host}.{}.0",
            now().floor() as u64,
            std::process::id()
        );
        let path = dir.join(name);
        let file = File::create(&path).map_err(|e| io(&path, "create", e))?;
        let mut events = EventFile { path, file };
        events.write(0, What::FileVersion("brain.Event:2".to_string()))?;
        Ok(events)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Scalars at `step`, one event holding them all.
    pub fn scalars(&mut self, step: usize, values: &[(String, f32)]) -> Result<()> {
        let value = values
            .iter()
            .map(|(tag, value)| SummaryValue {
                tag: tag.clone(),
                metadata: None,
                reading: Some(Reading::Simple(*value)),
            })
            .collect();
        self.write(step, What::Summary(Summary { value }))
    }

    /// `markdown` under `tag` at `step`, shown by TensorBoard's text tab.
    pub fn text(&mut self, step: usize, tag: &str, markdown: &str) -> Result<()> {
        let value = SummaryValue {
            tag: tag.to_string(),
            metadata: Some(SummaryMetadata {
                plugin_data: Some(PluginData {
                    plugin_name: "text".to_string(),
                    content: Vec::new(),
                }),
            }),
            reading: Some(Reading::Tensor(TensorProto {
                dtype: DT_STRING,
                tensor_shape: Some(TensorShape {}),
                string_val: vec![markdown.as_bytes().to_vec()],
            })),
        };
        self.write(step, What::Summary(Summary { value: vec![value] }))
    }

    /// A session starting at `step`: TensorBoard drops what earlier files
    /// logged at `step` and after (a resumed run logs them again).
    pub fn restart_at(&mut self, step: usize) -> Result<()> {
        self.write(step, What::SessionLog(SessionLog { status: SESSION_START }))
    }

    /// Appends one event as one record, in one write.
    fn write(&mut self, step: usize, what: What) -> Result<()> {
        let event = Event {
            wall_time: now(),
            step: step as i64,
            what: Some(what),
        };
        let record = frame(&event.encode_to_vec());
        self.file
            .write_all(&record)
            .and_then(|()| self.file.flush())
            .map_err(|e| io(&self.path, "write", e))
    }
}

/// `data` as a TFRecord record.
pub fn frame(data: &[u8]) -> Vec<u8> {
    let length = (data.len() as u64).to_le_bytes();
    let mut record = Vec::with_capacity(data.len() + 16);
    record.extend_from_slice(&length);
    record.extend_from_slice(&masked_crc(&length).to_le_bytes());
    record.extend_from_slice(data);
    record.extend_from_slice(&masked_crc(data).to_le_bytes());
    record
}

/// TFRecord's masked CRC-32C of `data`.
fn masked_crc(data: &[u8]) -> u32 {
    crc32c::crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_framed_with_crc32c() {
        // CRC-32C's check value (RFC 3720); TensorBoard's reader checks the
        // masked sums of whole files (tests/tensorboard_check.py).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xe306_9283);
        let record = frame(b"abc");
        assert_eq!(record.len(), 8 + 4 + 3 + 4);
        assert_eq!(&record[..8], &3u64.to_le_bytes());
        assert_eq!(&record[12..15], b"abc");
    }
}
