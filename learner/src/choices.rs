//! A run's machine-dependent choices: the train step's compute dtype and
//! the in-process engine's dtype. A setting of `"auto"` (the default) is
//! decided by a measured probe ([`crate::probe`]); an explicit one is
//! taken as it is.
//!
//! The choices are written to the run folder (`choices.json`, with the
//! probes behind them) and into every checkpoint's loop state, and a
//! resumed run takes them back instead of probing again: numerics never
//! change because a probe cache was cleared or the run moved machines.

use std::path::Path;

use grpo_xla::Client;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::LoadedCheckpoint;
use crate::config::{Dtype, DtypeSetting};
use crate::error::{Error, Result};
use crate::probe::{Phase, Probe, ProbeShape};

/// The run folder's record of its choices.
pub const CHOICES_FILE: &str = "choices.json";

/// The key of the choices in a checkpoint's loop state (`LoopState::choices`).
const STATE_KEY: &str = "choices";

/// What a run decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choices {
    /// The train step's forward/backward dtype.
    pub compute_dtype: Dtype,
    /// The in-process engines' weight and KV-cache dtype (`None`: the run
    /// has no in-process engine).
    pub engine_dtype: Option<Dtype>,
}

impl Choices {
    /// Everything in f32 (an in-process engine included).
    pub const F32: Choices = Choices {
        compute_dtype: Dtype::F32,
        engine_dtype: Some(Dtype::F32),
    };
}

/// What a run asks to decide, and the shapes its probes measure.
#[derive(Debug, Clone, Copy)]
pub struct ChoiceRequest {
    /// `[trainer] compute_dtype`.
    pub compute_dtype: DtypeSetting,
    /// `[rollout] dtype`, when the run has in-process engines.
    pub engine_dtype: Option<DtypeSetting>,
    /// The train step's probe: a micro-batch's tokens through the model's MLP.
    pub train: ProbeShape,
    /// The engine's probe: its slots through the model's MLP.
    pub engine: ProbeShape,
}

/// The choices of a run and the probes that made them (`choices.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChoiceRecord {
    /// What was decided.
    #[serde(flatten)]
    pub choices: Choices,
    /// The probes measured (or read from the cache) for the `auto` settings of this start.
    pub probes: Vec<Probe>,
}

impl ChoiceRecord {
    /// Decides `request`: an explicit setting is taken; an `auto` one takes
    /// `recorded` (a resumed run's earlier choice) when there is one, else
    /// its probe's pick (probes cached in `cache`, grpo's cache folder).
    /// An explicit setting that differs from `recorded` wins, with a warning.
    pub fn decide(
        client: &Client,
        request: &ChoiceRequest,
        recorded: Option<Choices>,
        cache: &Path,
    ) -> Result<ChoiceRecord> {
        let mut probes = Vec::new();
        let mut decide = |key: &str, setting: DtypeSetting, earlier: Option<Dtype>, phase, shape| -> Result<Dtype> {
            match (setting.fixed(), earlier) {
                (Some(dtype), Some(earlier)) if dtype != earlier => {
                    tracing::warn!(
                        "{key} = \"{}\" replaces the run's earlier {}",
                        dtype.name(),
                        earlier.name()
                    );
                    Ok(dtype)
                }
                (Some(dtype), _) => Ok(dtype),
                (None, Some(earlier)) => {
                    tracing::info!("{key} = auto: {}, as the run chose before", earlier.name());
                    Ok(earlier)
                }
                (None, None) => {
                    let probe = Probe::run(client, phase, shape, cache)?;
                    tracing::info!("{key} = auto: {}", probe.describe());
                    let dtype = probe.choice();
                    probes.push(probe);
                    Ok(dtype)
                }
            }
        };
        let compute_dtype = decide(
            "trainer.compute_dtype",
            request.compute_dtype,
            recorded.map(|c| c.compute_dtype),
            Phase::Train,
            request.train,
        )?;
        let engine_dtype = request
            .engine_dtype
            .map(|setting| {
                decide(
                    "rollout.dtype",
                    setting,
                    recorded.and_then(|c| c.engine_dtype),
                    Phase::Engine,
                    request.engine,
                )
            })
            .transpose()?;
        Ok(ChoiceRecord {
            choices: Choices {
                compute_dtype,
                engine_dtype,
            },
            probes,
        })
    }

    /// Writes it as `OUT/choices.json`, whole (a temporary file renamed into place).
    pub fn write(&self, out: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("a choice record serializes");
        crate::files::replace(&out.join(CHOICES_FILE), text.as_bytes()).map_err(|e| Error::Output {
            dir: out.to_path_buf(),
            message: format!("cannot write {CHOICES_FILE}: {e}"),
        })
    }
}

/// The choices a resumed run made before: its checkpoint's, else (a run
/// starting over without one) its folder's `choices.json`; `None` for a
/// new run or a run that recorded none. A checkpoint written before grpo
/// recorded choices ran with the defaults of then, f32 throughout. A record
/// that is there but unreadable is refused, naming the file.
pub fn recorded(out: &Path, checkpoint: Option<&LoadedCheckpoint>, resume: bool) -> Result<Option<Choices>> {
    if !resume {
        return Ok(None);
    }
    if let Some(checkpoint) = checkpoint {
        return match checkpoint.state.get(STATE_KEY) {
            None | Some(Value::Null) => Ok(Some(Choices::F32)),
            Some(value) => serde_json::from_value(value.clone())
                .map(Some)
                .map_err(|e| Error::Data {
                    path: checkpoint.dir.join(crate::checkpoint::STATE_FILE),
                    line: 0,
                    message: format!("`{STATE_KEY}` is not a run's choices: {e}"),
                }),
        };
    }
    let path = out.join(CHOICES_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let record: ChoiceRecord = serde_json::from_str(&text).map_err(|e| Error::Data {
        path: path.clone(),
        line: 0,
        message: format!("not a run's choices: {e}; delete it to measure again"),
    })?;
    Ok(Some(record.choices))
}
