//! Log-probs of a micro-batch's completion columns under given weights, by
//! a forward-only program per micro-batch shape. They are the "old"
//! policy of the clipped ratio when a batch gets `μ > 1` optimization
//! passes (TRL's `num_iterations`; [`crate::objective::grpo::OldLogprobs::Input`]),
//! computed before the first, and the frozen reference's of the KL term
//! when β > 0 — both at the sampling temperature, as the policy's are.
//!
//! On a mesh of several devices the program is partitioned like the train step:
//! the weights in their layout (FSDP shards stay shards), the micro-batch's
//! rows split over the devices, and the `[rows, C]` output split the same
//! way, so it joins the batch's inputs where it is.

use std::collections::HashMap;

use grpo_model::decoder::{Decoder, TokenScores};
use grpo_xla::trace::{Graph, Mesh, Tensor};
use grpo_xla::{Arg, Client, ElementType, Executable, ShardedBuffer, Sharding, TensorType};

use crate::batch::MicroBatchShape;
use crate::error::Result;
use crate::learner::in_dtype;

/// Log-probs and entropies `[R·K, C]` of the `slots` (`K`) completion slots
/// of `c` columns in token `ids` `[R, P + K·C]` with `attention` (and the
/// sparse layers' load-balancing loss over the rows' real tokens): one
/// sample a row through [`Decoder::token_logprobs`], shared prompts through
/// [`Decoder::shared_prompt_logprobs`].
pub fn completion_logprobs(
    decoder: &Decoder,
    params: &[Tensor],
    (ids, attention): (&Tensor, &Tensor),
    (slots, c): (i64, i64),
    temperature: f64,
) -> grpo_xla::Result<TokenScores> {
    if slots == 1 {
        return decoder.token_logprobs(params, ids, attention, c, temperature);
    }
    let prompt = ids.dims()[1] - slots * c;
    decoder.shared_prompt_logprobs(params, ids, attention, prompt, slots, temperature)
}

/// Compiles and runs the completion log-prob programs of a decoder.
pub struct LogprobPrograms {
    client: Client,
    decoder: Decoder,
    mesh: Mesh,
    /// The logits are divided by it (the rollouts' sampling temperature).
    temperature: f64,
    programs: HashMap<MicroBatchShape, Executable>,
}

impl LogprobPrograms {
    /// Programs of `decoder` with f32 parameters, for weights and batches
    /// on `mesh`, scoring at `temperature`.
    pub fn new(client: &Client, decoder: &Decoder, mesh: &Mesh, temperature: f32) -> LogprobPrograms {
        LogprobPrograms {
            client: client.clone(),
            decoder: decoder.clone(),
            mesh: mesh.clone(),
            temperature: f64::from(temperature),
            programs: HashMap::new(),
        }
    }

    /// Appends to `inputs` (a micro-batch of `shape`, as
    /// [`crate::batch::MicroBatch::upload`] makes it: token ids and
    /// attention first) the `[samples, C]` log-probs of its completion slots
    /// under the f32 weights `policy` (laid out as the learner's), laid out
    /// as the batch is.
    pub fn append(
        &mut self,
        policy: &[&ShardedBuffer],
        shape: MicroBatchShape,
        inputs: &mut Vec<ShardedBuffer>,
    ) -> Result<()> {
        let layout: Vec<(TensorType, Sharding)> = policy
            .iter()
            .map(|p| (p.tensor_type().clone(), p.sharding().clone()))
            .collect();
        let program = self.program(shape, layout)?;
        let mut args: Vec<_> = policy.iter().map(|&p| Arg::Borrow(p)).collect();
        args.extend([Arg::Borrow(&inputs[0]), Arg::Borrow(&inputs[1])]);
        let logprobs = program.execute_sharded(&args)?.remove(0);
        inputs.push(logprobs);
        Ok(())
    }

    /// The program for `shape`, compiled on first use, with the weights of
    /// the types and layout `layout` gives (partitioned on a mesh of several
    /// devices; a bf16 frozen base is read in f32).
    fn program(&mut self, shape: MicroBatchShape, layout: Vec<(TensorType, Sharding)>) -> Result<&Executable> {
        if !self.programs.contains_key(&shape) {
            let (b, t) = (shape.rows as i64, shape.tokens() as i64);
            let (n, c) = (shape.samples() as i64, shape.completion_tokens as i64);
            let graph = Graph::new(&format!("completion_logprobs_{b}x{t}_{n}x{c}"));
            let (types, mut layout): (Vec<TensorType>, Vec<Sharding>) = layout.into_iter().unzip();
            let inputs = types
                .iter()
                .map(|ty| graph.parameter(ty.dtype, &ty.dims))
                .collect::<grpo_xla::Result<Vec<Tensor>>>()?;
            let tensors = in_dtype(&inputs, ElementType::F32)?;
            let ids = graph.parameter(ElementType::S32, &[b, t])?;
            let attention = graph.parameter(ElementType::Pred, &[b, t])?;
            let slot_layout = (shape.slots as i64, c);
            let scores = completion_logprobs(
                &self.decoder,
                &tensors,
                (&ids, &attention),
                slot_layout,
                self.temperature,
            )?;
            let rows = Sharding::split(0, self.mesh.size());
            layout.extend([rows.clone(), rows.clone()]);
            let function = self
                .mesh
                .partition(graph.build(&[&scores.logprobs])?, layout, vec![rows])?;
            let program = function.compile(&self.client)?;
            self.programs.insert(shape, program);
        }
        Ok(&self.programs[&shape])
    }
}
