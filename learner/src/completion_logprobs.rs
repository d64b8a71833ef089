//! Log-probs of a micro-batch's completion columns under given weights, by
//! a forward-only program per micro-batch shape. They are the "old"
//! policy of the clipped ratio when a batch gets `μ > 1` optimization
//! passes (TRL's `num_iterations`; [`crate::trainer::OldLogprobs::Input`]),
//! computed before the first, and the frozen reference's of the KL term
//! when β > 0 — both at the sampling temperature, as the policy's are.
//!
//! On an SPMD placement the program is partitioned like the train step:
//! the weights in their layout (FSDP shards stay shards), the micro-batch's
//! rows split over the devices, and the `[rows, C]` output split the same
//! way, so it joins the batch's inputs where it is.

use std::collections::HashMap;

use grpo_model::decoder::Decoder;
use grpo_xla::trace::Graph;
use grpo_xla::{Arg, Client, ElementType, Executable, Sharding};

use crate::error::{Error, Result};
use crate::placement::{BatchInputs, LearnerState, Placement};
use crate::trainer::{MicroBatchShape, completion_logprobs};

/// Compiles and runs the completion log-prob programs of a decoder.
pub struct CompletionLogprobs {
    client: Client,
    decoder: Decoder,
    /// Devices the programs are partitioned over (1: not partitioned).
    devices: usize,
    /// The logits are divided by it (the rollouts' sampling temperature).
    temperature: f64,
    programs: HashMap<MicroBatchShape, Executable>,
}

impl CompletionLogprobs {
    /// Programs of `decoder` with f32 parameters, for weights and batches
    /// on `placement`, scoring at `temperature`.
    pub fn new(client: &Client, decoder: &Decoder, placement: &Placement, temperature: f32) -> CompletionLogprobs {
        CompletionLogprobs {
            client: client.clone(),
            decoder: decoder.clone(),
            devices: placement.device_count(),
            temperature: f64::from(temperature),
            programs: HashMap::new(),
        }
    }

    /// Appends to `inputs` (a micro-batch of `shape`, as
    /// [`crate::batch::MicroBatch::upload`] makes it: token ids and
    /// attention first) the `[samples, C]` log-probs of its completion slots
    /// under the f32 weights of `policy`, laid out as the batch is.
    pub fn append(&mut self, policy: &LearnerState, shape: MicroBatchShape, inputs: &mut BatchInputs) -> Result<()> {
        match (policy, inputs) {
            (LearnerState::OneDevice(state), BatchInputs::OneDevice(buffers)) => {
                let program = self.program(shape, None)?;
                let mut args: Vec<_> = state.params.iter().collect();
                args.extend([&buffers[0], &buffers[1]]);
                let logprobs = program.execute(&args)?.remove(0);
                buffers.push(logprobs);
            }
            (LearnerState::Sharded(state), BatchInputs::Sharded(arrays)) => {
                let layout: Vec<Sharding> = state.params.iter().map(|p| p.sharding().clone()).collect();
                let program = self.program(shape, Some(layout))?;
                let mut args: Vec<_> = state.params.iter().map(Arg::Borrow).collect();
                args.extend([Arg::Borrow(&arrays[0]), Arg::Borrow(&arrays[1])]);
                let logprobs = program.execute_sharded(&args)?.remove(0);
                arrays.push(logprobs);
            }
            _ => {
                return Err(Error::Config {
                    field: "trainer.parallelism",
                    message: "the weights and the batch of a log-prob program are on different placements".to_string(),
                });
            }
        }
        Ok(())
    }

    /// The program for `shape`, compiled on first use: on one device, or
    /// partitioned with the weights laid out as `layout` says.
    fn program(&mut self, shape: MicroBatchShape, layout: Option<Vec<Sharding>>) -> Result<&Executable> {
        if !self.programs.contains_key(&shape) {
            let (b, t) = (shape.rows as i64, shape.tokens() as i64);
            let (n, c) = (shape.samples() as i64, shape.completion_tokens as i64);
            let graph = Graph::new(&format!("completion_logprobs_{b}x{t}_{n}x{c}"));
            let tensors = self.decoder.parameter_tensors(&graph, ElementType::F32)?;
            let ids = graph.parameter(ElementType::S32, &[b, t])?;
            let attention = graph.parameter(ElementType::Pred, &[b, t])?;
            let slot_layout = (shape.slots as i64, c);
            let (logprobs, _) = completion_logprobs(
                &self.decoder,
                &tensors,
                (&ids, &attention),
                slot_layout,
                self.temperature,
            )?;
            let mut function = graph.build(&[&logprobs])?;
            if let Some(mut inputs) = layout {
                let rows = Sharding::split(0, self.devices);
                inputs.extend([rows.clone(), rows.clone()]);
                function = function.sharded(self.devices, inputs, vec![rows])?;
            }
            let program = function.compile(&self.client)?;
            self.programs.insert(shape, program);
        }
        Ok(&self.programs[&shape])
    }
}
