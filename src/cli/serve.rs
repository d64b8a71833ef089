//! `grpo serve --model M`: the rollout engine behind a vLLM-compatible
//! OpenAI HTTP server (`/v1/completions`, `/v1/chat/completions`,
//! `/v1/models`, `/health`, `/metrics`, `/tokenize`, the RL control routes).
//! With `--enable-lora` it serves LoRA adapters by name ([`serve_lora`]).
//! Once listening it prints `listening on HOST:PORT`; ctrl-c or SIGTERM
//! stops accepting, lets running requests finish (30 s at most), then exits.
//!
//! [`serve_lora`]: crate::cli::serve_lora

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::pretrained::Pretrained;
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_serving::admission::RequestLimits;
use grpo_serving::auth::ApiKey;
use grpo_serving::{Server, ServerConfig, shutdown_signal};
use grpo_xla::{ElementType, Platform};

use crate::cli::adapter::{AdapterArgs, merged};
use crate::cli::platform::PlatformArgs;
use crate::cli::serve_lora::LoraServeArgs;

/// Arguments of `grpo serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// A model folder, a .gguf file, or `smollm2-135m-instruct`.
    #[arg(long, default_value = "smollm2-135m-instruct")]
    model: String,
    #[command(flatten)]
    adapter: AdapterArgs,
    /// Address to listen on; 0.0.0.0 opens the server to other machines.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    host: IpAddr,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health, /version and /metrics.
    #[arg(long)]
    api_key: Option<String>,
    /// The model name requests use (default: --model).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Sequences decoded together (engine slots).
    #[arg(long, default_value_t = 8)]
    max_num_seqs: usize,
    /// Longest prompt + completion, in tokens (capped at the model's context).
    #[arg(long, default_value_t = 1024)]
    max_model_len: usize,
    /// cpu, cuda, tpu, or the path of a PJRT plugin.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = grpo_serving::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Let /pause, /resume and /update_weights_from_disk answer without an
    /// API key (with --api-key they answer to its holders); only on a
    /// machine whose local users are trusted.
    #[arg(long)]
    enable_control_routes: bool,
    /// Generation requests running or queued at once (at most 65536); one
    /// more gets a 429 with Retry-After.
    #[arg(long, default_value_t = LIMITS.max_concurrent_requests, value_parser = count(1..=65536))]
    max_concurrent_requests: usize,
    /// Prompts in one completions request.
    #[arg(long, default_value_t = LIMITS.max_prompts, value_parser = count(1..))]
    max_prompts_per_request: usize,
    /// Samples one request may ask for, prompts × n.
    #[arg(long, default_value_t = LIMITS.max_samples, value_parser = count(1..))]
    max_samples_per_request: usize,
    /// Stop strings of one request.
    #[arg(long, default_value_t = LIMITS.max_stop_strings)]
    max_stop_strings: usize,
    /// Bytes of one request's stop strings in all.
    #[arg(long, default_value_t = LIMITS.max_stop_bytes)]
    max_stop_bytes: usize,
    /// A chat template file (Jinja) used instead of the tokenizer's, e.g.
    /// model/templates/chatml_tools.jinja for a template that renders tools.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    #[command(flatten)]
    lora: LoraServeArgs,
}

/// The server's default request limits (the flags' defaults).
const LIMITS: RequestLimits = RequestLimits::DEFAULT;

/// A count flag within `range`.
fn count(range: impl std::ops::RangeBounds<u64>) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::new().range(range)
}

impl ServeArgs {
    /// The request limits the flags give.
    fn limits(&self) -> RequestLimits {
        RequestLimits {
            max_concurrent_requests: self.max_concurrent_requests,
            max_prompts: self.max_prompts_per_request,
            max_samples: self.max_samples_per_request,
            max_stop_strings: self.max_stop_strings,
            max_stop_bytes: self.max_stop_bytes,
        }
    }
}

/// The plugin `--device` names.
fn platform(device: &str) -> PlatformArgs {
    let (platform, plugin) = match device.parse::<Platform>() {
        Ok(platform) => (platform, None),
        Err(_) => (Platform::Cpu, Some(PathBuf::from(device))),
    };
    PlatformArgs {
        platform,
        plugin,
        cpu_devices: 1,
    }
}

/// Builds the engine and serves it until ctrl-c or SIGTERM.
pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    let model = Pretrained::open(&args.model)?;
    let adapter = args.adapter.read(&model.config)?;
    let tokenizer = Arc::new(model.tokenizer.context("serving needs a model with a tokenizer")?);
    let client = platform(&args.device).client()?;
    let decoder = Decoder::new(model.config.clone());
    let dtype = ElementType::F32;
    let weights = merged(model.weights.as_ref(), adapter.as_ref());
    let params = upload_parameters(&client, client.device(0)?, &decoder, weights.as_ref(), dtype)?;
    let served = args.served_model_name.clone().unwrap_or_else(|| args.model.clone());
    let lora = args.lora.settings(&served)?;
    let engine_config = EngineConfig {
        max_num_seqs: args.max_num_seqs,
        max_model_len: args.max_model_len.min(model.config.max_positions),
        dtype,
        max_loras: lora.max_loras,
        max_lora_rank: lora.max_lora_rank,
        ..EngineConfig::default()
    };
    let engine = Engine::new(&client, decoder, params, engine_config)?;
    let mut config = ServerConfig::new(served);
    config.model_root = args.model.clone();
    config.api_key = args.api_key.as_deref().map(ApiKey::new);
    config.max_body_bytes = args.max_body_bytes;
    config.enable_control_routes = args.enable_control_routes;
    config.limits = args.limits();
    config.enable_lora = lora.max_loras > 0;
    config.allow_runtime_lora_updating = lora.runtime_updating;
    config.chat_template = args
        .chat_template
        .as_ref()
        .map(|path| {
            std::fs::read_to_string(path).with_context(|| format!("cannot read --chat-template {}", path.display()))
        })
        .transpose()?;
    if !args.host.is_loopback() && args.api_key.is_none() {
        eprintln!(
            "warning: serving on {} without --api-key: anyone who can reach this address can generate with the model",
            args.host
        );
    }
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let server = Server::bind(SocketAddr::new(args.host, args.port), engine, tokenizer, config).await?;
        for module in &lora.modules {
            server
                .load_adapter(&module.name, &module.path)
                .await
                .with_context(|| format!("--lora-modules {}={}", module.name, module.path))?;
        }
        println!("listening on {}", server.local_addr());
        server.serve(shutdown_signal()).await?;
        Ok(())
    })
}
