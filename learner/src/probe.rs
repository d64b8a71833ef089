//! Measured dtype probes: whether bf16 or f32 runs a phase faster on this
//! machine, timed at the model's own shapes. Which is faster depends on
//! the CPU (bf16 products run at twice f32's rate on one 2-core machine
//! and at 0.7× on another) and the plugin, so a fixed default is wrong
//! somewhere.
//!
//! A probe times one SwiGLU MLP block — the products that make most of a
//! decoder's work — in each dtype: for the train step its forward and
//! backward through f32 master weights cast to the dtype, as the learner
//! casts them (9 products); for the engine its forward with the weights
//! stored in the dtype (3 products), at the rows each runs: a
//! micro-batch's tokens, the engine's slots. Results are cached per
//! machine, plugin and shape in grpo's cache folder (`<cache>/probes/`),
//! so each is measured once.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use grpo_xla::trace::{Graph, grad};
use grpo_xla::{Buffer, Client, ElementType, Executable};
use half::bf16;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::Dtype;
use crate::error::{Error, Result};

/// bf16 is chosen when it takes less than this fraction of f32's time: it
/// costs precision, so it has to win clearly.
pub const BF16_MARGIN: f64 = 0.9;

/// Bumped when what a probe measures changes, so older cached results are not reused.
const PROBE_VERSION: u32 = 1;

/// Most floating-point operations one probe run does: larger models probe
/// fewer rows, so a probe takes about a second whatever the model.
const MAX_PROBE_FLOPS: f64 = 2e10;

/// What a probe measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// The train step: forward and backward, f32 master weights cast to the dtype.
    Train,
    /// The rollout engine: forward, weights stored in the dtype.
    Engine,
}

/// The MLP block a probe times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeShape {
    /// Rows (tokens) through the block.
    pub rows: usize,
    /// The model's hidden size.
    pub hidden: usize,
    /// The MLP's intermediate size.
    pub intermediate: usize,
}

impl ProbeShape {
    /// The block of a model of `hidden` and `intermediate` sizes for
    /// `rows` rows, fewer when one run would pass [`MAX_PROBE_FLOPS`]
    /// (at least 16).
    pub fn new(phase: Phase, rows: usize, hidden: usize, intermediate: usize) -> ProbeShape {
        let one_row = ProbeShape {
            rows: 1,
            hidden,
            intermediate,
        };
        let most = (MAX_PROBE_FLOPS / one_row.flops(phase).max(1.0)) as usize;
        ProbeShape {
            rows: rows.min(most).max(16),
            ..one_row
        }
    }

    /// Floating-point operations of one run of `phase`'s block.
    pub fn flops(&self, phase: Phase) -> f64 {
        2.0 * (self.rows * self.hidden * self.intermediate) as f64 * phase.products() as f64
    }
}

impl Phase {
    /// Products of one run (each `rows × hidden × intermediate`).
    fn products(self) -> usize {
        match self {
            Phase::Train => 9,
            Phase::Engine => 3,
        }
    }
}

/// A probe's result: the median time of the block in each dtype.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    /// What was timed.
    pub phase: Phase,
    /// At which shape.
    pub shape: ProbeShape,
    /// Median milliseconds in f32.
    pub f32_ms: f64,
    /// Median milliseconds in bf16.
    pub bf16_ms: f64,
    /// Whether it came from the cache folder rather than a measurement now.
    #[serde(default, skip_serializing)]
    pub cached: bool,
}

impl Probe {
    /// The dtype it picks: bf16 when faster by [`BF16_MARGIN`], else f32.
    pub fn choice(&self) -> Dtype {
        if self.bf16_ms < BF16_MARGIN * self.f32_ms {
            Dtype::Bf16
        } else {
            Dtype::F32
        }
    }

    /// `phase` at `shape` on `client`'s first device: from `cache` (grpo's
    /// cache folder) when this machine and plugin measured it before, else
    /// measured now and cached there (a cache that cannot be written is
    /// only warned about).
    pub fn run(client: &Client, phase: Phase, shape: ProbeShape, cache: &Path) -> Result<Probe> {
        let path = cache_path(client, phase, shape, cache);
        if let Some(probe) = read_cached(&path, phase, shape) {
            return Ok(Probe { cached: true, ..probe });
        }
        let [f32_ms, bf16_ms] = median_ms(client, phase, shape)?;
        let probe = Probe {
            phase,
            shape,
            f32_ms,
            bf16_ms,
            cached: false,
        };
        if let Err(e) = write_cached(&path, &probe) {
            tracing::warn!("cannot cache the dtype probe at {}: {e}", path.display());
        }
        Ok(probe)
    }

    /// One line saying what was measured and what it picks.
    pub fn describe(&self) -> String {
        let s = self.shape;
        format!(
            "{:?} probe ({}×{}×{} MLP block{}): f32 {:.2} ms, bf16 {:.2} ms → {}",
            self.phase,
            s.rows,
            s.hidden,
            s.intermediate,
            if self.cached { ", cached" } else { "" },
            self.f32_ms,
            self.bf16_ms,
            self.choice().name()
        )
    }
}

/// The cached result of `phase` at `shape` in `path`, if it is there and is one.
fn read_cached(path: &Path, phase: Phase, shape: ProbeShape) -> Option<Probe> {
    let text = std::fs::read_to_string(path).ok()?;
    let probe: Probe = serde_json::from_str(&text).ok()?;
    let sound = probe.phase == phase
        && probe.shape == shape
        && [probe.f32_ms, probe.bf16_ms].iter().all(|t| t.is_finite() && *t > 0.0);
    sound.then_some(probe)
}

/// Writes `probe` to `path` whole (a temporary file renamed into place).
fn write_cached(path: &Path, probe: &Probe) -> std::io::Result<()> {
    std::fs::create_dir_all(path.parent().expect("a cache file has a folder"))?;
    let text = serde_json::to_string_pretty(probe).expect("a probe serializes");
    crate::files::replace(path, text.as_bytes())
}

/// Where `phase` at `shape` is cached in `cache` for this machine and `client`'s plugin.
fn cache_path(client: &Client, phase: Phase, shape: ProbeShape, cache: &Path) -> PathBuf {
    let key = format!(
        "{PROBE_VERSION}|{}|{}|{phase:?}|{}|{}|{}",
        machine(),
        client.fingerprint(),
        shape.rows,
        shape.hidden,
        shape.intermediate
    );
    let digest: String = Sha256::digest(key.as_bytes())[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    cache.join("probes").join(format!("{digest}.json"))
}

/// The host machine as far as it decides code speed: the CPU's model and
/// feature flags, and the cores this process may use.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        cpuinfo
            .lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.split_once(':'))
            .map_or("", |(_, value)| value.trim())
            .to_string()
    };
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{}|{}|{cores}", field("model name"), field("flags"))
}

/// Median milliseconds of `phase`'s block in f32 and in bf16. The two
/// run in turns — one warm-up each, then at least 3 timed rounds and up to
/// 9 within about two seconds — so load from elsewhere on the machine
/// slows both alike.
fn median_ms(client: &Client, phase: Phase, shape: ProbeShape) -> Result<[f64; 2]> {
    let prepare = |dtype| -> Result<(Executable, Vec<Buffer>)> {
        Ok((
            block(client, phase, shape, dtype)?,
            block_inputs(client, phase, shape, dtype)?,
        ))
    };
    let blocks = [prepare(ElementType::F32)?, prepare(ElementType::Bf16)?];
    let run = |(program, inputs): &(Executable, Vec<Buffer>)| -> Result<Duration> {
        let inputs: Vec<&Buffer> = inputs.iter().collect();
        let started = Instant::now();
        for out in program.execute(&inputs)? {
            out.block_until_ready()?;
        }
        Ok(started.elapsed())
    };
    for block in &blocks {
        run(block)?;
    }
    let started = Instant::now();
    let mut times: [Vec<Duration>; 2] = Default::default();
    while times[0].len() < 3 || times[0].len() < 9 && started.elapsed() < Duration::from_secs(2) {
        for (block, times) in blocks.iter().zip(&mut times) {
            times.push(run(block)?);
        }
    }
    Ok(times.map(|mut times| {
        times.sort();
        times[times.len() / 2].as_secs_f64() * 1e3
    }))
}

/// The block's program: `y = (silu(x·Wg) ⊙ (x·Wu))·Wd` on `x` in `dtype`;
/// for the train step with f32 weights cast to `dtype` and the gradients
/// of `Σy` as outputs, for the engine with weights in `dtype` and `y`.
fn block(client: &Client, phase: Phase, shape: ProbeShape, dtype: ElementType) -> Result<Executable> {
    let trace = || -> grpo_xla::Result<Executable> {
        let graph = Graph::new(&format!("dtype_probe_{phase:?}_{dtype}"));
        let (rows, h, i) = (shape.rows as i64, shape.hidden as i64, shape.intermediate as i64);
        let weights_dtype = if phase == Phase::Train { ElementType::F32 } else { dtype };
        let x = graph.parameter(dtype, &[rows, h])?;
        let wg = graph.parameter(weights_dtype, &[h, i])?;
        let wu = graph.parameter(weights_dtype, &[h, i])?;
        let wd = graph.parameter(weights_dtype, &[i, h])?;
        let cast = |w: &grpo_xla::trace::Tensor| {
            if w.dtype() == dtype {
                Ok(w.clone())
            } else {
                w.convert(dtype)
            }
        };
        let hidden = x.matmul(&cast(&wg)?)?.silu()?.mul(&x.matmul(&cast(&wu)?)?)?;
        let y = hidden.matmul(&cast(&wd)?)?;
        let function = match phase {
            Phase::Engine => graph.build(&[&y])?,
            Phase::Train => {
                let loss = y.convert(ElementType::F32)?.sum_all()?;
                let grads = grad(&loss, &[&x, &wg, &wu, &wd])?;
                graph.build(&grads.iter().collect::<Vec<_>>())?
            }
        };
        function.compile(client)
    };
    trace().map_err(|e| Error::Config {
        field: "dtype probe",
        message: format!("cannot build the {phase:?} probe in {dtype}: {e}"),
    })
}

/// The block's inputs on the first device: `x` and the three weights,
/// small deterministic values.
fn block_inputs(client: &Client, phase: Phase, shape: ProbeShape, dtype: ElementType) -> Result<Vec<Buffer>> {
    let (rows, h, i) = (shape.rows, shape.hidden, shape.intermediate);
    let weights_dtype = if phase == Phase::Train { ElementType::F32 } else { dtype };
    let device = client.device(0)?;
    let upload = |dims: [usize; 2], dtype: ElementType| -> Result<Buffer> {
        let values: Vec<f32> = (0..dims[0] * dims[1])
            .map(|k| ((k * 7919 % 1009) as f32 / 1009.0 - 0.5) * 0.1)
            .collect();
        let dims = [dims[0] as i64, dims[1] as i64];
        Ok(match dtype {
            ElementType::Bf16 => {
                let values: Vec<bf16> = values.iter().map(|&v| bf16::from_f32(v)).collect();
                client.buffer_from_host(&values, &dims, device)?
            }
            _ => client.buffer_from_host(&values, &dims, device)?,
        })
    };
    Ok(vec![
        upload([rows, h], dtype)?,
        upload([h, i], weights_dtype)?,
        upload([h, i], weights_dtype)?,
        upload([i, h], weights_dtype)?,
    ])
}
