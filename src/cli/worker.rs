//! `grpo worker --model M`: a rollout worker, the engine served over gRPC
//! for a learner (Generate, weight updates, Pause / Resume, Health, Stats).
//!
//! It listens on 127.0.0.1 unless `--host` names another address
//! (`--host 0.0.0.0` listens on every interface), and refuses to start
//! without a shared token: `--token-file PATH`, else the
//! `GRPO_WORKER_TOKEN` environment variable. Once listening it prints
//! `listening on HOST:PORT` on stdout and serves until SIGTERM or ctrl-c;
//! then it drains — takes no new call, finishes the samples in flight (at
//! most [`DRAIN_GRACE`]; the learner gives what is left to other members)
//! — and exits.
//!
//! With `--learner ADDR` it also registers with the learner's registry
//! (`[rollout] listen` of `grpo run`), saying where it serves (`--advertise
//! HOST:PORT`, by default the address it listens on), and announces itself
//! again every few seconds (until it drains); a learner that refuses it
//! (token, protocol) stops it with the learner's reason.
//!
//! `--metrics-port PORT` serves Prometheus metrics over plain HTTP at
//! `/metrics` on the same host ([`WorkerServer::metrics_page`]).
//!
//! `--tls-cert` and `--tls-key` serve over TLS only (PEM files; the
//! certificate must name the host the learner dials); the address it
//! advertises is then `https://…`. `--tls-ca` is the CA file it trusts
//! when it dials the learner's registry over TLS.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use anyhow::{Context, bail};
use grpo_learner::config::DtypeSetting;
use grpo_learner::probe::{Phase, Probe, ProbeShape};
use grpo_model::config::ModelConfig;
use grpo_model::decoder::Decoder;
use grpo_model::load::upload_parameters;
use grpo_model::pretrained::Pretrained;
use grpo_rollout::engine::{Engine, EngineConfig};
use grpo_serving::shutdown_signal;
use grpo_worker::{AuthToken, ClientTls, DEFAULT_PORT, ServerTls, WorkerServer, announce};
use grpo_xla::{Client, ElementType};

use crate::cli::platform::PlatformArgs;

/// Arguments of `grpo worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    platform: PlatformArgs,
    /// A model folder, a .gguf file, or `smollm2-135m-instruct`.
    #[arg(long, default_value = "smollm2-135m-instruct")]
    model: String,
    /// Address to listen on; 0.0.0.0 opens the worker to other machines.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    host: IpAddr,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// A file holding the shared token (surrounding whitespace is ignored);
    /// without it the token comes from GRPO_WORKER_TOKEN.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Sequences decoded together (engine slots).
    #[arg(long, default_value_t = 8)]
    max_num_seqs: usize,
    /// Longest prompt + completion, in tokens (capped at the model's context).
    #[arg(long, default_value_t = 1024)]
    max_model_len: usize,
    /// Parameter and KV-cache dtype: f32, bf16, or auto (the faster on this
    /// machine: a probe at the model's shapes and --max-num-seqs, cached in
    /// grpo's cache folder).
    #[arg(long, default_value = "auto")]
    dtype: DtypeSetting,
    /// The learner's registry (`host:port` of `[rollout] listen`) to
    /// register with.
    #[arg(long)]
    learner: Option<String>,
    /// The `host:port` the learner dials to reach this worker; default the
    /// address it listens on (required with `--host 0.0.0.0`).
    #[arg(long, requires = "learner")]
    advertise: Option<String>,
    /// The certificate chain (PEM) to serve over TLS with; needs --tls-key.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serves Prometheus metrics at `http://HOST:PORT/metrics` on --host:
    /// the engine's gauges (vLLM's names), weight updates and samples sent.
    #[arg(long)]
    metrics_port: Option<u16>,
    /// The CA certificate (PEM) that the learner's registry certificate must
    /// chain to; the learner's address is then dialled over TLS (`https://`).
    #[arg(long, requires = "learner")]
    tls_ca: Option<PathBuf>,
}

/// The engine's dtype: `setting`'s, or for `auto` the engine probe's pick at
/// the model's sizes and `slots` rows.
fn engine_dtype(
    client: &Client,
    setting: DtypeSetting,
    config: &ModelConfig,
    slots: usize,
) -> anyhow::Result<ElementType> {
    let dtype = match setting.fixed() {
        Some(dtype) => dtype,
        None => {
            let shape = ProbeShape::new(Phase::Engine, slots, config.hidden_size, config.intermediate_size);
            let probe = Probe::run(client, Phase::Engine, shape, &grpo_xla::pjrt::cache_dir())?;
            tracing::info!("--dtype auto: {}", probe.describe());
            probe.choice()
        }
    };
    Ok(dtype.element_type())
}

/// How long a worker told to stop (SIGTERM, ctrl-c) finishes its samples
/// in flight before it exits anyway.
const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

/// Builds the engine and serves it until SIGTERM or ctrl-c, then drains.
pub fn run(args: &WorkerArgs) -> anyhow::Result<()> {
    let token = AuthToken::from_file_or_env(args.token_file.as_deref(), "--token-file")?;
    let server_tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(ServerTls::from_pem_files(cert, key)?),
        _ => None,
    };
    let learner_tls = match &args.tls_ca {
        Some(ca) => ClientTls::from_ca_file(ca)?,
        None => ClientTls::default(),
    };
    let model = Pretrained::open(&args.model)?;
    let client = args.platform.client()?;
    let decoder = Decoder::new(model.config.clone());
    let dtype = engine_dtype(&client, args.dtype, &model.config, args.max_num_seqs)?;
    let params = upload_parameters(&client, client.device(0)?, &decoder, model.weights.as_ref(), dtype)?;
    let config = EngineConfig {
        max_num_seqs: args.max_num_seqs,
        max_model_len: args.max_model_len.min(model.config.max_positions),
        dtype,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(&client, decoder, params, config)?;
    if let Some(tokenizer) = model.tokenizer {
        engine = engine.with_tokenizer(std::sync::Arc::new(tokenizer));
    }
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        let mut server = WorkerServer::bind(SocketAddr::new(args.host, args.port), engine, token.clone()).await?;
        if let Some(tls) = server_tls {
            server = server.with_tls(tls);
        }
        let (bound, tls) = (server.local_addr(), server.is_tls());
        println!("listening on {bound}");
        if let Some(port) = args.metrics_port {
            let addr = SocketAddr::new(args.host, port);
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--metrics-port: cannot listen on {addr}"))?;
            eprintln!("Prometheus metrics at http://{}/metrics", listener.local_addr()?);
            let page = server.metrics_page();
            tokio::spawn(async move {
                if let Err(error) = grpo_metrics::endpoint::serve(listener, page, std::future::pending()).await {
                    tracing::error!("the /metrics endpoint stopped: {error}");
                }
            });
        }
        let (drain, draining) = tokio::sync::watch::channel(false);
        let signal = async move {
            shutdown_signal().await;
            eprintln!("draining: taking no new work, finishing the samples in flight (at most {DRAIN_GRACE:?})");
            let _ = drain.send(true);
        };
        let drained = |mut draining: tokio::sync::watch::Receiver<bool>| async move {
            if draining.wait_for(|d| *d).await.is_err() {
                std::future::pending::<()>().await; // the server ended first
            }
        };
        let grace = drained(draining.clone());
        let serving = async {
            tokio::select! {
                served = server.serve_until(signal) => served.map_err(anyhow::Error::from),
                () = async { grace.await; tokio::time::sleep(DRAIN_GRACE).await } => {
                    eprintln!("stopping with samples still in flight: the learner gives their groups to other members");
                    Ok(())
                }
            }
        };
        let Some(learner) = &args.learner else {
            return serving.await;
        };
        let advertised = match &args.advertise {
            Some(address) => address.clone(),
            None if bound.ip().is_unspecified() => {
                bail!(
                    "--host {} needs --advertise HOST:PORT: the address the learner dials",
                    bound.ip()
                )
            }
            None => bound.to_string(),
        };
        let advertised = match (tls, advertised.contains("://")) {
            (true, false) => format!("https://{advertised}"),
            _ => advertised,
        };
        let announcing = async {
            tokio::select! {
                refused = announce(learner, &advertised, &token, &learner_tls, |state| match state {
                    Ok(()) => eprintln!("registered with the learner at {learner} as {advertised}"),
                    Err(e) => eprintln!("the learner at {learner} does not answer ({e}); trying again"),
                }) => Some(refused),
                // A draining worker stops announcing, so the learner does not take it back.
                () = drained(draining) => None,
            }
        };
        tokio::pin!(serving);
        tokio::select! {
            served = &mut serving => served?,
            refused = announcing => match refused {
                Some(refused) => bail!("the learner at {learner} refused this worker: {refused}"),
                None => serving.await?,
            },
        }
        Ok(())
    })
}
