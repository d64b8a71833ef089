//! `grpo run` on a fleet of `grpo worker` processes (tiny random model):
//! weights pushed to workers train as in process (the same samples, weights
//! within 1e-6); a refused token
//! and a fleet with no worker left stop the run naming the worker; a
//! worker killed with SIGKILL, stalled with SIGSTOP or restarted costs
//! nothing but time — its groups go to the others, every (step, group,
//! sample) is logged exactly once, and a worker that comes back gets the
//! current weights before it gets work; workers and the registry over TLS.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{lines, run_ok, tiny_model, tiny_run};

#[path = "../tools/test_python.rs"]
mod test_python;

#[path = "../tools/prometheus_page.rs"]
mod prometheus_page;
use grpo_learner::fleet::{Fleet, FleetConfig, WorkerFleet};
use grpo_learner::record::{RolloutRow, read_rollouts};
use grpo_model::weights::{Safetensors, WeightSource};
use grpo_rollout::output::Completion;
use grpo_rollout::request::{Request, SamplingParams};
use grpo_worker::AuthToken;

/// The largest absolute difference between the tensors of two checkpoints'
/// `file` (`model.safetensors`, `adapter_model.safetensors`), which must
/// hold the same tensors.
fn max_abs_difference(a: &Path, b: &Path, file: &str) -> f32 {
    let open = |dir: &Path| Safetensors::open_files(&[dir.join(file)]).unwrap();
    let (a, b) = (open(a), open(b));
    let names = a.names();
    assert_eq!(names, b.names(), "the same tensors");
    let mut largest = 0.0f32;
    for name in names {
        let (x, y) = (a.tensor(&name).unwrap(), b.tensor(&name).unwrap());
        assert_eq!(x.dims, y.dims, "{name}");
        for (p, q) in x.data.iter().zip(&y.data) {
            largest = largest.max((p - q).abs());
        }
    }
    largest
}

/// A `grpo worker` serving `model` on a free port, killed on drop.
struct Worker {
    child: std::process::Child,
    addr: String,
}

impl Worker {
    fn start(model: &Path, token: &str) -> Worker {
        Worker::start_with(model, token, &["--port", "0"])
    }

    /// With `args` after the model and the engine's size.
    fn start_with(model: &Path, token: &str, args: &[&str]) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_grpo"))
            .args(["worker", "--model", model.to_str().unwrap()])
            .args(["--max-num-seqs", "4", "--max-model-len", "32"])
            .args(if args.contains(&"--dtype") {
                &[][..]
            } else {
                &["--dtype", "f32"][..]
            })
            .args(args)
            .env("GRPO_WORKER_TOKEN", token)
            .stdout(std::process::Stdio::piped())
            .stderr(if args.contains(&"--dtype") {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .spawn()
            .unwrap();
        let addr = common::listening_address(&mut child);
        Worker { child, addr }
    }

    /// Sends `signal` (`STOP`, `CONT`) to the worker process.
    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal}");
    }

    /// Kills it with SIGKILL and waits for it.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_run_on_a_remote_worker_pushes_every_version_and_trains_as_in_process() {
    let trainer = "max_steps = 3\neval_every = 0\n\n[checkpoint]\nevery = 3";
    let (local, remote, config, worker) = in_process_and_on_a_worker(trainer);

    let rows = read_rollouts(&remote.path().join("out/rollouts.parquet")).unwrap();
    assert!(
        rows.iter().all(|r| r.policy_version == r.step - 1),
        "every step sampled with the version pushed after the step before"
    );
    for line in lines(&remote.path().join("out/metrics.jsonl")) {
        assert!(line["weight_sync_gb_per_s"].as_f64().unwrap() > 0.0, "{line}");
    }
    assert_eq!(
        sampled(remote.path()),
        sampled(local.path()),
        "the worker samples what the in-process engine samples"
    );
    // The engines' log-probs may differ in the last bits (XLA's CPU products
    // depend on where a row sits in a batch, and the two engines batch the
    // same requests differently), and so may the updates they weight: the
    // weights must agree far below one step's change (lr 1e-3).
    let checkpoint = |dir: &Path| dir.join("out/checkpoint-3");
    let largest = max_abs_difference(
        &checkpoint(local.path()),
        &checkpoint(remote.path()),
        "model.safetensors",
    );
    assert!(
        largest < 1e-6,
        "f32 weights over gRPC train as the in-process engine: the checkpoints differ by up to {largest}"
    );

    let other = remote.path().join("other");
    let wrong = run_with_worker(&config, &worker, "wrong", &["--out", other.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        !wrong.status.success() && err.contains(&worker.addr),
        "a refused token names the worker: {err}"
    );
}

#[test]
fn a_lora_run_on_a_remote_worker_pushes_the_adapters_alone_and_trains_as_in_process() {
    let trainer = "max_steps = 3\neval_every = 0\n\n[checkpoint]\nevery = 3\n\n[lora]\nrank = 4\nalpha = 8";
    let (local, remote, _, _worker) = in_process_and_on_a_worker(trainer);

    assert_eq!(
        sampled(remote.path()),
        sampled(local.path()),
        "the worker, adapters beside its base, samples what the in-process engine samples"
    );
    let model = std::fs::metadata(remote.path().join("tiny/model.safetensors"))
        .unwrap()
        .len();
    for line in lines(&remote.path().join("out/metrics.jsonl")).iter().skip(1) {
        let sent = line["weight_sync_bytes"].as_u64().unwrap();
        assert!(
            sent > 0 && sent * 10 < model,
            "{sent} B a sync for a {model} B model: {line}"
        );
    }
    let checkpoint = |dir: &Path| dir.join("out/checkpoint-3");
    let largest = max_abs_difference(
        &checkpoint(local.path()),
        &checkpoint(remote.path()),
        "adapter_model.safetensors",
    );
    assert!(
        largest < 1e-6,
        "the adapters trained with a worker differ by up to {largest}"
    );
}

/// The tiny run of `trainer` twice: with its in-process engine, and in a
/// second folder with its rollouts on a worker (token "s3cret"), both
/// succeeding. Returns the two folders, the second's config and the worker.
fn in_process_and_on_a_worker(trainer: &str) -> (tempfile::TempDir, tempfile::TempDir, std::path::PathBuf, Worker) {
    let local = tempfile::tempdir().unwrap();
    run_ok(&["run", tiny_run(local.path(), trainer).to_str().unwrap()]);
    let remote = tempfile::tempdir().unwrap();
    let config = tiny_run(remote.path(), trainer);
    let worker = Worker::start(&remote.path().join("tiny"), "s3cret");
    let out = run_with_worker(&config, &worker, "s3cret", &[]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (local, remote, config, worker)
}

/// `grpo run CONFIG` with its rollouts on `worker`, called with `token`,
/// and `args` added.
fn run_with_worker(config: &Path, worker: &Worker, token: &str, args: &[&str]) -> std::process::Output {
    let workers = format!("rollout.workers=[\"{}\"]", worker.addr);
    Command::new(env!("CARGO_BIN_EXE_grpo"))
        .args(["run", config.to_str().unwrap(), "--set", &workers])
        .args(args)
        .env("GRPO_WORKER_TOKEN", token)
        .output()
        .unwrap()
}

/// The rollouts of the run in `dir`: (step, group, sample, completion text).
fn sampled(dir: &Path) -> Vec<(u64, u32, u32, String)> {
    read_rollouts(&dir.join("out/rollouts.parquet"))
        .unwrap()
        .iter()
        .map(|r| (r.step, r.group, r.sample, r.completion.clone()))
        .collect()
}

/// A `grpo run` in the background, its stderr kept in `dir/run.log`.
struct Run {
    child: std::process::Child,
    log: std::path::PathBuf,
    metrics: std::path::PathBuf,
}

impl Run {
    fn start(config: &Path, sets: &[String]) -> Run {
        let dir = config.parent().unwrap();
        let log = dir.join("run.log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_grpo"));
        command.args(["run", config.to_str().unwrap()]);
        for set in sets {
            command.args(["--set", set]);
        }
        let child = command
            .env("GRPO_WORKER_TOKEN", "s3cret")
            .stderr(std::fs::File::create(&log).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        Run {
            child,
            log,
            metrics: dir.join("out/metrics.jsonl"),
        }
    }

    /// Waits until the run's log holds `needle` (the run must still be going).
    fn wait_for_log(&mut self, needle: &str) {
        self.wait_until(&format!("`{needle}`"), |run| run.log().contains(needle));
    }

    /// Waits until `steps` steps are logged (the run must still be going).
    fn wait_for_steps(&mut self, steps: usize) {
        let metrics = self.metrics.clone();
        self.wait_until(&format!("{steps} steps"), |_| {
            std::fs::read_to_string(&metrics).map_or(0, |m| m.lines().count()) >= steps
        });
    }

    /// Waits up to 5 minutes until `done`, failing if the run ends first.
    fn wait_until(&mut self, what: &str, done: impl Fn(&Self) -> bool) {
        let started = Instant::now();
        while !done(self) {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "the run ended early: {}",
                self.log()
            );
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "no {what} in 5 minutes: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the run to end (at most `limit`), returning whether it succeeded.
    fn finish(&mut self, limit: Duration) -> bool {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            if started.elapsed() > limit {
                let _ = self.child.kill();
                panic!("the run hung: {}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every (step, group, sample) of `steps` steps of `groups` × `samples`, each once.
fn assert_each_sample_once(rows: &[RolloutRow], steps: u64, groups: u32, samples: u32) {
    let mut seen: Vec<(u64, u32, u32)> = rows.iter().map(|r| (r.step, r.group, r.sample)).collect();
    seen.sort_unstable();
    let expected: Vec<(u64, u32, u32)> = (1..=steps)
        .flat_map(|step| (0..groups).flat_map(move |g| (0..samples).map(move |s| (step, g, s))))
        .collect();
    assert_eq!(seen, expected, "each sample of each step logged exactly once");
}

/// Every step's metrics count the requeued groups, a count that never falls.
/// (Whether a fault costs requeued groups depends on when it lands: in
/// generation it does, during training the worker is found down first.)
fn assert_requeued_counted(metrics: &Path, steps: usize) {
    let counts: Vec<u64> = lines(metrics)
        .iter()
        .filter_map(|l| l["fleet_requeued_groups"].as_u64())
        .collect();
    assert_eq!(counts.len(), steps, "{counts:?}");
    assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
}

/// A port free on loopback now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A CA (`dir/ca.pem`) and a certificate for 127.0.0.1 it signed, with its
/// key (`dir/cert.pem`, `dir/key.pem`).
fn test_pki(dir: &Path) -> [std::path::PathBuf; 3] {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    [
        ("ca.pem", ca.pem()),
        ("cert.pem", cert.pem()),
        ("key.pem", key.serialize_pem()),
    ]
    .map(|(name, text)| {
        std::fs::write(dir.join(name), text).unwrap();
        dir.join(name)
    })
}

#[test]
fn a_run_trains_on_a_worker_that_registered_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let [ca, cert, key] = test_pki(dir.path());
    let config = tiny_run(dir.path(), "max_steps = 2\neval_every = 0\n\n[checkpoint]\nevery = 0");
    let registry = format!("127.0.0.1:{}", free_port());
    let quoted = |p: &Path| format!("{:?}", p.to_str().unwrap());
    let sets = [
        format!("rollout.listen=\"{registry}\""),
        format!("rollout.tls_ca={}", quoted(&ca)),
        format!("rollout.tls_cert={}", quoted(&cert)),
        format!("rollout.tls_key={}", quoted(&key)),
    ];
    let mut run = Run::start(&config, &sets);
    run.wait_for_log("taking rollout worker registrations");
    let tls = [cert.to_str().unwrap(), key.to_str().unwrap(), ca.to_str().unwrap()];
    let worker = Worker::start_with(
        &dir.path().join("tiny"),
        "s3cret",
        &[
            "--port",
            "0",
            "--tls-cert",
            tls[0],
            "--tls-key",
            tls[1],
            "--learner",
            &registry,
            "--tls-ca",
            tls[2],
        ],
    );
    assert!(run.finish(Duration::from_secs(300)), "the run failed: {}", run.log());
    let metrics = lines(&dir.path().join("out/metrics.jsonl"));
    assert_eq!(metrics.len(), 2);
    assert!(
        run.log()
            .contains(&format!("rollout worker https://{} registered", worker.addr)),
        "the worker registered with its https address: {}",
        run.log()
    );
}

/// The samples of the page at `addr`, waiting up to a minute for it to answer.
fn scrape(addr: &str) -> Vec<prometheus_page::Sample> {
    let started = Instant::now();
    loop {
        if let Some(page) = prometheus_page::fetch(addr) {
            return prometheus_page::parse_page(&test_python::test_python(), &page);
        }
        assert!(started.elapsed() < Duration::from_secs(60), "nothing answers on {addr}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_run_and_its_worker_serve_prometheus_pages_that_agree_with_the_metrics_log() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(dir.path(), "max_steps = 200\neval_every = 0\n\n[checkpoint]\nevery = 0");
    let worker_page = format!("127.0.0.1:{}", free_port());
    let port = worker_page.rsplit(':').next().unwrap();
    let worker = Worker::start_with(
        &dir.path().join("tiny"),
        "s3cret",
        &["--port", "0", "--metrics-port", port],
    );
    let run_page = format!("127.0.0.1:{}", free_port());
    let sets = [
        format!("rollout.workers=[\"{}\"]", worker.addr),
        format!("logging.prometheus_listen=\"{run_page}\""),
    ];
    let mut run = Run::start(&config, &sets);
    run.wait_for_steps(2);
    let page = scrape(&run_page);
    // The page follows each step once its metrics line is written.
    let log = lines(&dir.path().join("out/metrics.jsonl"));
    let value = |name: &str, labels: &[(&str, &str)]| prometheus_page::value(&page, name, labels);
    let step = value("grpo_step", &[]) as usize;
    assert!(step >= 2 && step <= log.len(), "step {step} of {} logged", log.len());
    let done = &log[..step];
    let last = &done[step - 1];
    assert_eq!(last["step"], step);
    assert_eq!(value("grpo_max_steps", &[]), 200.0);
    let kind = |family: &str| page.iter().find(|s| s.family == family).map(|s| s.kind.as_str());
    assert_eq!(kind("grpo_tokens"), Some("counter"));
    assert_eq!(kind("grpo_step"), Some("gauge"));
    assert_eq!(kind("grpo_step_duration_seconds"), Some("histogram"));
    assert_eq!(value("grpo_reward", &[]), last["reward"].as_f64().unwrap());
    assert_eq!(value("grpo_reward_std", &[]), last["reward_std"].as_f64().unwrap());
    assert_eq!(
        value("grpo_train_metric", &[("name", "loss")]),
        last["loss"].as_f64().unwrap()
    );
    assert_eq!(
        value("grpo_train_metric", &[("name", "completions/mean_length")]),
        last["completions/mean_length"].as_f64().unwrap()
    );
    assert_eq!(value("grpo_tokens_total", &[]), last["num_tokens"].as_f64().unwrap());
    assert_eq!(value("grpo_step_duration_seconds_count", &[]), step as f64);
    assert_eq!(value("grpo_fleet_members", &[]), 1.0);
    assert_eq!(
        value("grpo_fleet_ready_workers", &[]),
        last["fleet_ready"].as_f64().unwrap()
    );
    let synced: Vec<f64> = done.iter().filter_map(|l| l["weight_sync_bytes"].as_f64()).collect();
    assert_eq!(synced.len(), step, "a push after every step");
    assert_eq!(value("grpo_weight_syncs_total", &[]), step as f64);
    assert_eq!(value("grpo_weight_sync_bytes_total", &[]), synced.iter().sum::<f64>());
    let time: f64 = done.iter().filter_map(|l| l["time_weight_sync"].as_f64()).sum();
    assert!((value("grpo_weight_sync_seconds_total", &[]) - time).abs() < 1e-9);
    let tokens_per_second =
        last["num_tokens"].as_f64().unwrap() - done.get(step - 2).map_or(0.0, |l| l["num_tokens"].as_f64().unwrap());
    let expected = tokens_per_second / last["step_time"].as_f64().unwrap();
    assert!((value("grpo_tokens_per_second", &[]) - expected).abs() < 1e-6 * expected);
    drop(run);

    // The worker counts what the learner pushed and sampled.
    let page = scrape(&worker_page);
    let value = |name: &str, labels: &[(&str, &str)]| prometheus_page::value(&page, name, labels);
    let installed = value("grpo_worker_weight_updates_total", &[("outcome", "installed")]);
    assert!(installed >= step as f64, "{installed} updates installed, {step} pushed");
    assert_eq!(
        value("grpo_worker_weight_updates_total", &[("outcome", "rejected")]),
        0.0
    );
    assert_eq!(value("grpo_worker_weight_update_seconds_count", &[]), installed);
    let bytes = value("grpo_worker_weight_update_bytes_total", &[]);
    let push = synced[0];
    assert!(
        bytes >= installed * push && bytes <= (installed + 1.0) * push,
        "{bytes} bytes for {installed} pushes of {push}"
    );
    assert!(value("grpo_engine_weights_version", &[]) >= step as f64);
    let trained: f64 = done.iter().map(|l| l["trained_samples"].as_f64().unwrap()).sum();
    assert!(value("grpo_worker_samples_sent_total", &[]) >= trained);
    assert!(value("grpo_worker_generate_calls_total", &[]) >= 1.0);
    assert!(value("grpo_engine_generated_tokens_total", &[]) > 0.0);
    assert_eq!(value("grpo_engine_slots", &[]), 4.0);
    assert_eq!(value("vllm:num_requests_running", &[]), 0.0);
}

#[test]
fn a_run_whose_only_worker_died_waits_then_stops_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(dir.path(), "max_steps = 200\neval_every = 0\n\n[checkpoint]\nevery = 0");
    let mut worker = Worker::start(&dir.path().join("tiny"), "s3cret");
    let sets = [
        format!("rollout.workers=[\"{}\"]", worker.addr),
        "rollout.worker_wait_s=3".to_string(),
    ];
    let mut run = Run::start(&config, &sets);
    run.wait_for_steps(2);
    worker.kill();
    assert!(
        !run.finish(Duration::from_secs(120)),
        "the run cannot go on without its only worker"
    );
    let log = run.log();
    assert!(
        log.contains("waiting for a rollout worker") && log.contains("no rollout worker is ready"),
        "a status line, then the error: {log}"
    );
    let error = log.lines().find(|l| l.starts_with("error:")).unwrap_or_default();
    assert!(
        error.contains(&worker.addr) && error.contains("down"),
        "the error names the worker: {error}"
    );
}

/// A fleet of the workers at `addrs`, started as version 3 on `model`'s
/// weights (pushed to each), asking for Health every 0.2 s and waiting
/// `timeout` for an answer.
fn fleet_at_version_3(model: &Path, addrs: &[String], timeout: Duration) -> WorkerFleet {
    let token = AuthToken::new("s3cret").unwrap();
    let vocab_size = grpo_model::pretrained::Pretrained::open(model.to_str().unwrap())
        .unwrap()
        .config
        .vocab_size;
    let config = FleetConfig {
        heartbeat: Duration::from_millis(200),
        timeout,
        ..FleetConfig::default()
    };
    let mut fleet = WorkerFleet::new(config, vocab_size).unwrap();
    fleet
        .add_workers(addrs, &token, &grpo_worker::ClientTls::default())
        .unwrap();
    let plugin = grpo_xla::Plugin::find(grpo_xla::Platform::Cpu).unwrap();
    let client = grpo_xla::Client::new(&plugin, grpo_xla::ClientOptions::default()).unwrap();
    let pretrained = grpo_model::pretrained::Pretrained::open(model.to_str().unwrap()).unwrap();
    let decoder = grpo_model::decoder::Decoder::new(pretrained.config.clone());
    let device = client.device(0).unwrap().clone();
    let weights = pretrained.weights.as_ref();
    let buffers =
        grpo_model::load::upload_parameters(&client, &device, &decoder, weights, grpo_xla::ElementType::F32).unwrap();
    let named: Vec<(&str, &grpo_xla::Buffer)> = decoder
        .parameters()
        .iter()
        .map(|p| p.name.as_str())
        .zip(&buffers)
        .collect();
    fleet
        .start_at(3, &|| grpo_learner::learner::host_tensors(&named))
        .unwrap();
    fleet
}

/// What `work` returns, or a failed test if it takes longer than `limit`.
fn within<T: Send + 'static>(limit: Duration, work: impl FnOnce() -> T + Send + 'static) -> T {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || sender.send(work()));
    receiver.recv_timeout(limit).expect("no hang")
}

/// `groups` prompts of two samples each, seeded apart.
fn requests(groups: u32) -> Vec<Request> {
    (0..groups)
        .map(|g| Request {
            prompt: vec![1, 2 + g, 3],
            params: SamplingParams {
                n: 2,
                max_tokens: 4,
                seed: 7 + g,
                ..SamplingParams::default()
            },
        })
        .collect()
}

fn versions(groups: &[Vec<Completion>]) -> Vec<u64> {
    groups.iter().flatten().flat_map(|c| c.versions.clone()).collect()
}

#[test]
fn a_restarted_worker_gets_the_current_weights_before_it_gets_work() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let mut worker = Worker::start(&model, "s3cret");
    let mut fleet = fleet_at_version_3(&model, std::slice::from_ref(&worker.addr), Duration::from_secs(10));
    let before = fleet.generate(&requests(1)).unwrap();
    assert!(
        !versions(&before).is_empty() && versions(&before).iter().all(|&v| v == 3),
        "the pushed version serves"
    );

    let port = worker.addr.rsplit(':').next().unwrap().to_string();
    worker.kill();
    let _restarted = Worker::start_with(&model, "s3cret", &["--port", &port]);
    let after = fleet.generate(&requests(1)).unwrap();
    assert!(
        versions(&after).iter().all(|&v| v == 3),
        "the restarted worker (on version 0) got version 3 pushed before it sampled: {:?}",
        versions(&after)
    );
    assert_eq!(after, before);
}

#[test]
fn a_worker_with_dtype_auto_probes_its_engine_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let mut worker = Worker::start_with(&model, "s3cret", &["--port", "0", "--dtype", "auto"]);
    let mut fleet = fleet_at_version_3(&model, std::slice::from_ref(&worker.addr), Duration::from_secs(10));
    let groups = fleet.generate(&requests(1)).unwrap();
    assert!(versions(&groups).iter().all(|&v| v == 3) && !versions(&groups).is_empty());
    worker.kill();
    let mut log = String::new();
    std::io::Read::read_to_string(&mut worker.child.stderr.take().unwrap(), &mut log).unwrap();
    let said = log
        .lines()
        .find(|l| l.contains("--dtype auto: Engine probe (16×"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(said.ends_with("→ f32") || said.ends_with("→ bf16"), "{said}");
}

#[test]
fn a_stalled_worker_s_groups_go_to_the_other_and_its_late_samples_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let stalled = Worker::start(&model, "s3cret");
    let healthy = Worker::start(&model, "s3cret");
    let addrs = [stalled.addr.clone(), healthy.addr.clone()];
    let mut fleet = fleet_at_version_3(&model, &addrs, Duration::from_secs(2));
    let want = fleet.generate(&requests(6)).unwrap();
    assert_eq!((fleet.health().ready, fleet.health().requeued_groups), (2, 0));

    // Stopped while ready: it is given groups, holds them, and misses its Health calls.
    stalled.signal("STOP");
    let started = Instant::now();
    let (mut fleet, got) = within(Duration::from_secs(120), move || {
        let got = fleet.generate(&requests(6)).unwrap();
        (fleet, got)
    });
    stalled.signal("CONT");
    let health = fleet.health();
    assert!(health.requeued_groups >= 1, "{health:?}");
    assert_eq!(health.ready, 1, "the stalled worker is down");
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "declared down after the timeout, not before"
    );
    assert_eq!(got, want, "every group once, sampled alike by the other worker");

    // Awake again: it answers, rejoins on the weights it holds, and its late
    // samples of the cancelled calls never reach a result.
    let again = fleet.generate(&requests(6)).unwrap();
    assert_eq!(again, want);
    let deadline = Instant::now() + Duration::from_secs(30);
    while fleet.health().ready < 2 {
        assert!(
            Instant::now() < deadline,
            "the worker did not rejoin: {:?}",
            fleet.health()
        );
        fleet.generate(&requests(1)).unwrap();
    }
}

#[test]
fn a_killed_worker_s_groups_go_to_the_others_and_a_restarted_one_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let config = tiny_run(dir.path(), "max_steps = 40\neval_every = 0\n\n[checkpoint]\nevery = 0");
    let registry = format!("127.0.0.1:{}", free_port());
    let sets = [
        format!("rollout.listen=\"{registry}\""),
        "rollout.in_process=false".to_string(),
        "rollout.prompts_per_step=4".to_string(),
        "rollout.heartbeat_s=0.2".to_string(),
        "rollout.worker_timeout_s=5".to_string(),
    ];
    let mut run = Run::start(&config, &sets);
    let join = ["--port", "0", "--learner", registry.as_str()];
    let mut first = Worker::start_with(&model, "s3cret", &join);
    let second = Worker::start_with(&model, "s3cret", &join);
    run.wait_for_steps(3);
    first.kill();
    run.wait_for_steps(6);
    let third = Worker::start_with(&model, "s3cret", &join);
    run.wait_for_log(&format!("rollout worker {} answers", third.addr));
    assert!(run.finish(Duration::from_secs(300)), "{}", run.log());

    let log = run.log();
    assert!(log.contains(&format!("rollout worker {} is down", first.addr)), "{log}");
    for worker in [&first, &second, &third] {
        assert!(
            log.contains(&format!("rollout worker {} registered", worker.addr)),
            "{log}"
        );
    }
    let rejoined = format!("rollout worker {} answers", third.addr);
    assert!(log.contains(&rejoined), "{log}");
    let rows = read_rollouts(&dir.path().join("out/rollouts.parquet")).unwrap();
    assert_each_sample_once(&rows, 40, 4, 2);
    assert_requeued_counted(&dir.path().join("out/metrics.jsonl"), 40);
    assert!(
        rows.iter().all(|r| r.policy_version == r.step - 1),
        "every sample from the version pushed after the step before"
    );
}

#[test]
fn a_stalled_worker_is_declared_down_and_its_late_samples_are_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let config = tiny_run(dir.path(), "max_steps = 30\neval_every = 0\n\n[checkpoint]\nevery = 0");
    let stalled = Worker::start(&model, "s3cret");
    let healthy = Worker::start(&model, "s3cret");
    let sets = [
        format!("rollout.workers=[\"{}\", \"{}\"]", stalled.addr, healthy.addr),
        "rollout.prompts_per_step=4".to_string(),
        "rollout.heartbeat_s=0.2".to_string(),
        "rollout.worker_timeout_s=2".to_string(),
    ];
    let mut run = Run::start(&config, &sets);
    run.wait_for_steps(2);
    stalled.signal("STOP");
    run.wait_for_steps(5);
    stalled.signal("CONT");
    // It answered once at the start; after SIGCONT it answers again (and rejoins) while the run goes on.
    let back = format!("rollout worker {} answers", stalled.addr);
    let started = Instant::now();
    while run.log().matches(&back).count() < 2 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "it never answered again: {}",
            run.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(run.finish(Duration::from_secs(300)), "{}", run.log());

    let log = run.log();
    let down = format!("rollout worker {} is down: no answer to Health", stalled.addr);
    assert!(log.contains(&down), "{log}");
    let rows = read_rollouts(&dir.path().join("out/rollouts.parquet")).unwrap();
    assert_each_sample_once(&rows, 30, 4, 2);
    assert_requeued_counted(&dir.path().join("out/metrics.jsonl"), 30);
    assert!(rows.iter().all(|r| r.policy_version == r.step - 1));
}

#[test]
fn the_in_process_engine_keeps_the_run_going_while_workers_come_and_go() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let config = tiny_run(dir.path(), "max_steps = 60\neval_every = 30\n\n[checkpoint]\nevery = 0");
    let registry = format!("127.0.0.1:{}", free_port());
    let sets = [
        format!("rollout.listen=\"{registry}\""),
        "rollout.in_process=true".to_string(),
        "rollout.prompts_per_step=4".to_string(),
        "rollout.heartbeat_s=0.2".to_string(),
    ];
    let mut run = Run::start(&config, &sets);
    run.wait_for_steps(3);
    let mut worker = Worker::start_with(&model, "s3cret", &["--port", "0", "--learner", registry.as_str()]);
    // The in-process engine alone makes steps fast: wait for the worker to join, not for steps.
    run.wait_for_log(&format!("rollout worker {} answers", worker.addr));
    worker.kill();
    assert!(run.finish(Duration::from_secs(300)), "{}", run.log());

    let log = run.log();
    assert!(log.contains("rollout worker in-process answers"), "{log}");
    assert!(
        log.contains(&format!("rollout worker {} registered", worker.addr)),
        "{log}"
    );
    let rows = read_rollouts(&dir.path().join("out/rollouts.parquet")).unwrap();
    assert_each_sample_once(&rows, 60, 4, 2);
    assert!(rows.iter().all(|r| r.policy_version == r.step - 1));
    let evals = lines(&dir.path().join("out/metrics.jsonl"))
        .iter()
        .filter(|l| l.get("eval_accuracy").is_some())
        .count();
    assert_eq!(evals, 3, "evaluations run on the fleet too");
}

#[test]
fn in_process_engines_on_two_devices_share_the_groups() {
    let dir = tempfile::tempdir().unwrap();
    let config = tiny_run(dir.path(), "max_steps = 4\neval_every = 4\n\n[checkpoint]\nevery = 0");
    let config = config.to_str().unwrap();
    let too_many = common::grpo_installed(&["run", config, "--set", "rollout.engines=2"]);
    let err = String::from_utf8_lossy(&too_many.stderr);
    assert!(
        !too_many.status.success() && err.contains("--cpu-devices 2"),
        "one device for two engines: {err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_grpo"))
        .args(["run", config, "--cpu-devices", "2", "--set", "rollout.engines=2"])
        .args(["--set", "rollout.prompts_per_step=4"])
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    for device in [0, 1] {
        let answered = format!("rollout worker in-process (device {device}) answers");
        assert!(log.contains(&answered), "{log}");
    }
    let rows = read_rollouts(&dir.path().join("out/rollouts.parquet")).unwrap();
    assert_each_sample_once(&rows, 4, 4, 2);
    assert!(rows.iter().all(|r| r.policy_version == r.step - 1));
}

/// SIGTERM: a worker finishes the samples in flight (it used to die with
/// them), takes no new call, and exits cleanly.
#[test]
fn a_worker_told_to_stop_finishes_its_samples_then_exits() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let mut worker = Worker::start(&model, "s3cret");
    let token = AuthToken::new("s3cret").unwrap();
    let endpoint = format!("http://{}", worker.addr);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let request = Request {
        prompt: vec![1, 2, 3],
        params: SamplingParams {
            n: 4,
            max_tokens: 28,
            ignore_eos: true,
            ..SamplingParams::default()
        },
    };
    let samples = runtime.block_on(async {
        let mut client = grpo_worker::WorkerClient::connect(&endpoint, &token, &grpo_worker::ClientTls::default())
            .await
            .unwrap();
        // The first call compiles the engine's programs: the signal lands while it runs.
        let in_flight = client.generate(&request).await.unwrap();
        worker.signal("TERM");
        in_flight.all().await
    });
    let samples = samples.expect("the samples in flight were finished");
    assert_eq!(samples.len(), 4);
    assert!(samples.iter().all(|s| s.tokens.len() == 28), "none cut short");
    let status = within(Duration::from_secs(60), move || worker.child.wait().unwrap());
    assert!(status.success(), "a clean exit: {status}");
    let refused = runtime.block_on(async {
        match grpo_worker::WorkerClient::connect(&endpoint, &token, &grpo_worker::ClientTls::default()).await {
            Ok(mut client) => client.generate(&request).await.map(drop),
            Err(e) => Err(e),
        }
    });
    assert!(refused.is_err(), "nothing serves after it exits");
}
