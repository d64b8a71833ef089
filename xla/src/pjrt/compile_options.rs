//! Compile options and their `xla.CompileOptionsProto` encoding.
//!
//! `PJRT_Client_Compile` takes the options as a serialized proto; empty
//! options abort inside XLA (`replica_count > 0`), so replicas and partitions
//! are always written. Only the fields grpo sets are declared, with XLA's
//! field numbers.

use prost::Message;

use super::device::Device;
use crate::error::{Error, Result};

/// How a program is compiled: replicas, partitions and which devices run them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Copies of the program run in parallel, one argument list each. Default 1.
    pub num_replicas: usize,
    /// SPMD partitions of the program. Default 1.
    pub num_partitions: usize,
    /// Device id per `[replica][partition]`; `None` lets the plugin choose
    /// (its first devices). Default `None`.
    pub device_assignment: Option<Vec<Vec<i32>>>,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            device_assignment: None,
        }
    }
}

impl CompileOptions {
    /// One replica, one partition, on `device`.
    pub fn on_device(device: &Device) -> Self {
        CompileOptions {
            device_assignment: Some(vec![vec![device.id()]]),
            ..CompileOptions::default()
        }
    }

    /// One replica per device of `devices`, in that order.
    pub fn replicated(devices: &[Device]) -> Self {
        CompileOptions {
            num_replicas: devices.len(),
            num_partitions: 1,
            device_assignment: Some(devices.iter().map(|d| vec![d.id()]).collect()),
        }
    }

    /// One replica split into one SPMD partition per device of `devices`, in
    /// that order: XLA's SPMD partitioner cuts the program by its
    /// `mhlo.sharding` annotations, and partition `p` runs on `devices[p]`.
    pub fn partitioned(devices: &[Device]) -> Self {
        CompileOptions {
            num_replicas: 1,
            num_partitions: devices.len(),
            device_assignment: Some(vec![devices.iter().map(Device::id).collect()]),
        }
    }

    /// Checks the options against the client's devices: XLA aborts the
    /// process on zero replicas, so nothing malformed may reach it.
    pub fn validate(&self, devices: &[Device]) -> Result<()> {
        let fail = |message: String| Err(Error::CompileOptions(message));
        if self.num_replicas == 0 || self.num_partitions == 0 {
            return fail(format!(
                "{} replicas × {} partitions: both must be at least 1",
                self.num_replicas, self.num_partitions
            ));
        }
        let needed = self.num_replicas * self.num_partitions;
        if needed > devices.len() {
            return fail(format!(
                "{} replicas × {} partitions need {needed} devices, the client has {}",
                self.num_replicas,
                self.num_partitions,
                devices.len()
            ));
        }
        let Some(assignment) = &self.device_assignment else {
            return Ok(());
        };
        if assignment.len() != self.num_replicas || assignment.iter().any(|r| r.len() != self.num_partitions) {
            return fail(format!(
                "the device assignment must be {} replicas × {} partitions of device ids",
                self.num_replicas, self.num_partitions
            ));
        }
        let mut used = std::collections::HashSet::new();
        for &id in assignment.iter().flatten() {
            if !devices.iter().any(|d| d.id() == id) {
                return fail(format!(
                    "the device assignment names device {id}, which the client does not have"
                ));
            }
            if !used.insert(id) {
                return fail(format!("the device assignment uses device {id} twice"));
            }
        }
        Ok(())
    }

    /// The serialized `CompileOptionsProto`.
    pub fn to_proto_bytes(&self) -> Vec<u8> {
        let device_assignment = self.device_assignment.as_ref().map(|by_replica| {
            let partitions = by_replica.first().map_or(0, Vec::len);
            DeviceAssignmentProto {
                replica_count: to_i32(by_replica.len()),
                computation_count: to_i32(partitions),
                computation_devices: (0..partitions)
                    .map(|p| ComputationDevice {
                        replica_device_ids: by_replica
                            .iter()
                            .map(|r| i64::from(r.get(p).copied().unwrap_or(-1)))
                            .collect(),
                    })
                    .collect(),
            }
        });
        CompileOptionsProto {
            executable_build_options: Some(ExecutableBuildOptionsProto {
                num_replicas: to_i64(self.num_replicas),
                num_partitions: to_i64(self.num_partitions),
                use_spmd_partitioning: self.num_partitions > 1,
                device_assignment,
            }),
        }
        .encode_to_vec()
    }
}

fn to_i32(value: usize) -> i32 {
    i32::try_from(value).unwrap_or(i32::MAX)
}

fn to_i64(value: usize) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// `xla.CompileOptionsProto` (subset).
#[derive(Clone, PartialEq, Message)]
struct CompileOptionsProto {
    #[prost(message, optional, tag = "3")]
    executable_build_options: Option<ExecutableBuildOptionsProto>,
}

/// `xla.ExecutableBuildOptionsProto` (subset).
#[derive(Clone, PartialEq, Message)]
struct ExecutableBuildOptionsProto {
    #[prost(int64, tag = "4")]
    num_replicas: i64,
    #[prost(int64, tag = "5")]
    num_partitions: i64,
    #[prost(bool, tag = "6")]
    use_spmd_partitioning: bool,
    #[prost(message, optional, tag = "9")]
    device_assignment: Option<DeviceAssignmentProto>,
}

/// `xla.DeviceAssignmentProto`.
#[derive(Clone, PartialEq, Message)]
struct DeviceAssignmentProto {
    #[prost(int32, tag = "1")]
    replica_count: i32,
    #[prost(int32, tag = "2")]
    computation_count: i32,
    #[prost(message, repeated, tag = "3")]
    computation_devices: Vec<ComputationDevice>,
}

/// `xla.DeviceAssignmentProto.ComputationDevice`.
#[derive(Clone, PartialEq, Message)]
struct ComputationDevice {
    #[prost(int64, repeated, tag = "1")]
    replica_device_ids: Vec<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_options_encode_as_xla_expects() {
        // executable_build_options { num_replicas: 1, num_partitions: 1 }
        assert_eq!(
            CompileOptions::default().to_proto_bytes(),
            [0x1a, 0x04, 0x20, 0x01, 0x28, 0x01]
        );
    }

    #[test]
    fn device_assignment_is_written_per_partition() {
        let options = CompileOptions {
            num_replicas: 2,
            num_partitions: 1,
            device_assignment: Some(vec![vec![3], vec![1]]),
        };
        let proto = CompileOptionsProto::decode(options.to_proto_bytes().as_slice()).unwrap();
        let assignment = proto.executable_build_options.unwrap().device_assignment.unwrap();
        assert_eq!(assignment.replica_count, 2);
        assert_eq!(assignment.computation_count, 1);
        assert_eq!(assignment.computation_devices[0].replica_device_ids, [3, 1]);
    }

    #[test]
    fn partitions_turn_on_spmd_with_one_device_per_partition() {
        let options = CompileOptions {
            num_replicas: 1,
            num_partitions: 3,
            device_assignment: Some(vec![vec![2, 0, 1]]),
        };
        let build = CompileOptionsProto::decode(options.to_proto_bytes().as_slice())
            .unwrap()
            .executable_build_options
            .unwrap();
        assert_eq!((build.num_replicas, build.num_partitions), (1, 3));
        assert!(build.use_spmd_partitioning);
        let assignment = build.device_assignment.unwrap();
        assert_eq!((assignment.replica_count, assignment.computation_count), (1, 3));
        let ids: Vec<Vec<i64>> = assignment
            .computation_devices
            .iter()
            .map(|c| c.replica_device_ids.clone())
            .collect();
        assert_eq!(ids, [[2], [0], [1]]);
    }
}
