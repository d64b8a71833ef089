//! Log-probs of a micro-batch's completion columns under given weights, by
//! a forward-only program per micro-batch shape. They are the "old"
//! policy of the clipped ratio when a batch gets `μ > 1` optimization
//! passes (TRL's `num_iterations`; [`crate::trainer::OldLogprobs::Input`]),
//! computed before the first, and the frozen reference's of the KL term
//! when β > 0.

use std::collections::HashMap;

use grpo_model::decoder::Decoder;
use grpo_xla::trace::Graph;
use grpo_xla::{Buffer, Client, ElementType, Executable};

use crate::error::Result;
use crate::trainer::MicroBatchShape;

/// Compiles and runs the completion log-prob programs of a decoder.
pub struct CompletionLogprobs {
    client: Client,
    decoder: Decoder,
    programs: HashMap<MicroBatchShape, Executable>,
}

impl CompletionLogprobs {
    /// Programs of `decoder` with f32 parameters.
    pub fn new(client: &Client, decoder: &Decoder) -> CompletionLogprobs {
        CompletionLogprobs {
            client: client.clone(),
            decoder: decoder.clone(),
            programs: HashMap::new(),
        }
    }

    /// `[rows, C]` log-probs of the completion columns of the micro-batch
    /// of `shape` whose token ids and attention mask (the first two inputs
    /// [`crate::batch::MicroBatch::upload`] makes) are `tokens`, under the
    /// f32 weights `params`, all on the client's first device.
    pub fn run(&mut self, params: &[&Buffer], shape: MicroBatchShape, tokens: [&Buffer; 2]) -> Result<Buffer> {
        if !self.programs.contains_key(&shape) {
            let (b, t) = (shape.rows as i64, shape.tokens() as i64);
            let graph = Graph::new(&format!("completion_logprobs_{b}x{t}"));
            let tensors = self.decoder.parameter_tensors(&graph, ElementType::F32)?;
            let ids = graph.parameter(ElementType::S32, &[b, t])?;
            let attention = graph.parameter(ElementType::Pred, &[b, t])?;
            let (logprobs, _) =
                self.decoder
                    .token_logprobs(&tensors, &ids, &attention, shape.completion_tokens as i64)?;
            let program = graph.build(&[&logprobs])?.compile(&self.client)?;
            self.programs.insert(shape, program);
        }
        let mut args = params.to_vec();
        args.extend(tokens);
        let mut out = self.programs[&shape].execute(&args)?;
        Ok(out.remove(0))
    }
}
