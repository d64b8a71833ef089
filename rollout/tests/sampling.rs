//! The sampler on the real CPU plugin: empirical token frequencies against
//! the exact penalized and filtered distribution computed on the host,
//! greedy rows, raw and processed log-probs, and per-request determinism
//! independent of the batch.

mod common;

use common::cpu_client;
use grpo_rollout::sampling::{SamplerKind, SamplingInputs, TokenHistory, sample};
use grpo_xla::trace::Graph;
use grpo_xla::{Buffer, Client, ElementType, Executable};

const V: i64 = 6;
const LOGITS: [f32; 6] = [1.2, 0.3, -0.4, 2.0, 0.9, -1.5];

fn program(client: &Client, b: i64, kind: SamplerKind) -> Executable {
    let g = Graph::new("sampler");
    let logits = g.parameter(ElementType::F32, &[b, V]).unwrap();
    let p = SamplingInputs::parameters(&g, b).unwrap();
    let inputs = SamplingInputs::from_tensors(&p);
    let h: Vec<_> = (0..3)
        .map(|_| g.parameter(ElementType::F32, &[b, V]).unwrap())
        .collect();
    let history = TokenHistory {
        output_counts: &h[0],
        in_prompt: &h[1],
        stop_tokens: &h[2],
    };
    let (tokens, scored) = sample(&logits, &inputs, Some(&history), kind, None).unwrap();
    let log_probs = scored.gathered_log_probs(&tokens).unwrap();
    g.build(&[&tokens, &log_probs]).unwrap().compile(client).unwrap()
}

/// Settings for every row.
#[derive(Clone, Copy)]
struct Settings {
    temperature: f32,
    top_k: i32,
    top_p: f32,
    min_p: f32,
    penalties: Penalties,
    /// Log-probs of the penalized, tempered distribution instead of the raw one.
    processed: bool,
}

/// Penalty settings and the token history they act on (the same for every row).
#[derive(Clone, Copy)]
struct Penalties {
    repetition: f32,
    frequency: f32,
    presence: f32,
    suppress_stops: bool,
    counts: [f32; 6],
    in_prompt: [f32; 6],
    stops: [f32; 6],
}

const NO_PENALTIES: Penalties = Penalties {
    repetition: 1.0,
    frequency: 0.0,
    presence: 0.0,
    suppress_stops: false,
    counts: [0.0; 6],
    in_prompt: [0.0; 6],
    stops: [0.0; 6],
};

fn settings(temperature: f32, top_k: i32, top_p: f32, min_p: f32) -> Settings {
    Settings {
        temperature,
        top_k,
        top_p,
        min_p,
        penalties: NO_PENALTIES,
        processed: false,
    }
}

fn run(client: &Client, exe: &Executable, s: Settings, seeds: &[u32], steps: &[u32]) -> (Vec<i32>, Vec<f32>) {
    let b = seeds.len();
    let d = client.device(0).unwrap();
    let logits: Vec<f32> = (0..b).flat_map(|_| LOGITS).collect();
    let dims = [b as i64];
    let pen = s.penalties;
    let rows = |row: [f32; 6]| -> Vec<f32> { (0..b).flat_map(|_| row).collect() };
    let buffers: Vec<Buffer> = vec![
        client.buffer_from_host(&logits, &[b as i64, V], d).unwrap(),
        client.buffer_from_host(&vec![pen.repetition; b], &dims, d).unwrap(),
        client.buffer_from_host(&vec![pen.frequency; b], &dims, d).unwrap(),
        client.buffer_from_host(&vec![pen.presence; b], &dims, d).unwrap(),
        client
            .buffer_from_host(&vec![f32::from(u8::from(pen.suppress_stops)); b], &dims, d)
            .unwrap(),
        client.buffer_from_host(&vec![s.temperature; b], &dims, d).unwrap(),
        client.buffer_from_host(&vec![s.top_k; b], &dims, d).unwrap(),
        client.buffer_from_host(&vec![s.top_p; b], &dims, d).unwrap(),
        client.buffer_from_host(&vec![s.min_p; b], &dims, d).unwrap(),
        client.buffer_from_host(seeds, &dims, d).unwrap(),
        client.buffer_from_host(steps, &dims, d).unwrap(),
        client
            .buffer_from_host(&vec![f32::from(u8::from(s.processed)); b], &dims, d)
            .unwrap(),
        client.buffer_from_host(&rows(pen.counts), &[b as i64, V], d).unwrap(),
        client
            .buffer_from_host(&rows(pen.in_prompt), &[b as i64, V], d)
            .unwrap(),
        client.buffer_from_host(&rows(pen.stops), &[b as i64, V], d).unwrap(),
    ];
    let refs: Vec<&Buffer> = buffers.iter().collect();
    let out = exe.execute(&refs).unwrap();
    (out[0].to_host::<i32>().unwrap(), out[1].to_host::<f32>().unwrap())
}

/// The logits after the penalties, in f64 (vLLM's formulas).
fn penalized(p: &Penalties) -> Vec<f64> {
    (0..LOGITS.len())
        .map(|i| {
            let mut z = f64::from(LOGITS[i]);
            let r = f64::from(p.repetition);
            if p.counts[i] + p.in_prompt[i] > 0.0 {
                z = if z > 0.0 { z / r } else { z * r };
            }
            let count = f64::from(p.counts[i]);
            z -= f64::from(p.frequency) * count + f64::from(p.presence) * if count > 0.0 { 1.0 } else { 0.0 };
            if p.suppress_stops && p.stops[i] > 0.0 {
                z = f64::NEG_INFINITY;
            }
            z
        })
        .collect()
}

/// The exact distribution the settings define, in f64.
fn exact(s: Settings) -> Vec<f64> {
    let z: Vec<f64> = penalized(&s.penalties)
        .iter()
        .map(|&x| x / f64::from(s.temperature))
        .collect();
    let m = z.iter().copied().fold(f64::MIN, f64::max);
    let sum: f64 = z.iter().map(|x| (x - m).exp()).sum();
    let p: Vec<f64> = z.iter().map(|x| (x - m).exp() / sum).collect();
    let mut order: Vec<usize> = (0..p.len()).collect();
    order.sort_by(|&a, &b| p[b].partial_cmp(&p[a]).unwrap());
    let mut kept = vec![0.0; p.len()];
    let mut before = 0.0;
    for (rank, &i) in order.iter().enumerate() {
        let within_k = s.top_k <= 0 || (rank as i32) < s.top_k;
        let keep = rank == 0 || (within_k && before < f64::from(s.top_p) && p[i] >= f64::from(s.min_p) * p[order[0]]);
        if keep {
            kept[i] = p[i];
        }
        before += p[i];
    }
    let total: f64 = kept.iter().sum();
    kept.iter().map(|k| k / total).collect()
}

fn log_softmax(z: &[f32]) -> Vec<f64> {
    let m = z.iter().copied().fold(f32::MIN, f32::max) as f64;
    let lse = z.iter().map(|&x| (f64::from(x) - m).exp()).sum::<f64>().ln() + m;
    z.iter().map(|&x| f64::from(x) - lse).collect()
}

#[test]
fn token_frequencies_follow_the_filtered_distribution() {
    let client = cpu_client();
    let n = 8192;
    let plain = program(&client, n, SamplerKind::Plain);
    let filtered = program(&client, n, SamplerKind::Filtered);
    let seeds: Vec<u32> = (0..n as u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let steps = vec![3u32; n as usize];
    let cases = [
        settings(1.0, 0, 1.0, 0.0),
        settings(0.7, 0, 1.0, 0.0),
        settings(1.3, 3, 1.0, 0.0),
        settings(1.0, 0, 0.75, 0.0),
        settings(1.0, 0, 1.0, 0.25),
        settings(0.9, 4, 0.9, 0.05),
        Settings {
            penalties: Penalties {
                repetition: 1.8,
                counts: [0.0, 2.0, 0.0, 1.0, 0.0, 0.0],
                in_prompt: [1.0, 0.0, 1.0, 0.0, 0.0, 0.0],
                ..NO_PENALTIES
            },
            ..settings(1.0, 0, 1.0, 0.0)
        },
        Settings {
            penalties: Penalties {
                frequency: 0.5,
                presence: 0.7,
                counts: [1.0, 0.0, 0.0, 3.0, 0.0, 1.0],
                ..NO_PENALTIES
            },
            ..settings(0.8, 0, 0.95, 0.0)
        },
        Settings {
            penalties: Penalties {
                suppress_stops: true,
                stops: [0.0, 0.0, 0.0, 1.0, 1.0, 0.0],
                ..NO_PENALTIES
            },
            ..settings(1.0, 3, 1.0, 0.0)
        },
        Settings {
            penalties: Penalties {
                stops: [0.0, 0.0, 0.0, 1.0, 1.0, 0.0],
                ..NO_PENALTIES
            },
            ..settings(1.0, 3, 1.0, 0.0)
        },
    ];
    let raw = log_softmax(&LOGITS);
    for s in cases {
        let (tokens, log_probs) = run(&client, &filtered, s, &seeds, &steps);
        if SamplerKind::for_row(s.temperature, s.top_k, s.top_p) == SamplerKind::Plain {
            let (unsorted, _) = run(&client, &plain, s, &seeds, &steps);
            assert_eq!(unsorted, tokens, "both kinds draw a plain row's tokens alike");
        }
        let want = exact(s);
        let mut counts = vec![0usize; V as usize];
        for (&t, &lp) in tokens.iter().zip(&log_probs) {
            counts[t as usize] += 1;
            assert!(
                (f64::from(lp) - raw[t as usize]).abs() < 1e-5,
                "log-prob of {t} is under the raw logits"
            );
        }
        for (token, (&count, &p)) in counts.iter().zip(&want).enumerate() {
            let freq = count as f64 / n as f64;
            let sigma = (p * (1.0 - p) / n as f64).sqrt();
            assert!(
                (freq - p).abs() <= 4.0 * sigma + 1e-9,
                "token {token}: frequency {freq}, exact {p} ({counts:?} vs {want:?})"
            );
            if p == 0.0 {
                assert_eq!(count, 0, "filtered token {token} was drawn");
            }
        }
    }
}

#[test]
fn greedy_rows_take_the_argmax_and_seeds_do_not_depend_on_the_batch() {
    let client = cpu_client();
    let exe = program(&client, 8, SamplerKind::Filtered);
    let greedy = settings(0.0, 0, 1.0, 0.0);
    for kind in [SamplerKind::Greedy, SamplerKind::Plain, SamplerKind::Filtered] {
        let (tokens, log_probs) = run(
            &client,
            &program(&client, 8, kind),
            greedy,
            &[1, 2, 3, 4, 5, 6, 7, 8],
            &[0; 8],
        );
        assert!(tokens.iter().all(|&t| t == 3), "{kind:?}: {tokens:?}");
        assert!((f64::from(log_probs[0]) - log_softmax(&LOGITS)[3]).abs() < 1e-6);
    }
    // A repeated argmax (2.0 / 2 = 1.0 < 1.2) gives way to the next token;
    // its log-prob is still the raw policy's.
    let repeated = Settings {
        penalties: Penalties {
            repetition: 2.0,
            counts: [0.0, 0.0, 0.0, 1.0, 0.0, 0.0],
            ..NO_PENALTIES
        },
        ..greedy
    };
    let (tokens, log_probs) = run(&client, &exe, repeated, &[1; 8], &[0; 8]);
    assert!(tokens.iter().all(|&t| t == 0), "{tokens:?}");
    assert!((f64::from(log_probs[0]) - log_softmax(&LOGITS)[0]).abs() < 1e-6);

    let warm = settings(1.5, 0, 1.0, 0.0);
    let seeds = [11, 22, 33, 44, 55, 66, 77, 88];
    let steps = [0, 1, 2, 3, 4, 5, 6, 7];
    let (first, _) = run(&client, &exe, warm, &seeds, &steps);
    let reversed_seeds: Vec<u32> = seeds.iter().rev().copied().collect();
    let reversed_steps: Vec<u32> = steps.iter().rev().copied().collect();
    let (second, _) = run(&client, &exe, warm, &reversed_seeds, &reversed_steps);
    let second: Vec<i32> = second.into_iter().rev().collect();
    assert_eq!(
        first, second,
        "a request draws the same token wherever it sits in the batch"
    );
}

#[test]
fn processed_log_probs_are_those_of_the_penalized_tempered_distribution() {
    let client = cpu_client();
    let exe = program(&client, 64, SamplerKind::Filtered);
    let seeds: Vec<u32> = (0..64u32).map(|i| i.wrapping_mul(2_654_435_761)).collect();
    let penalties = Penalties {
        repetition: 1.5,
        frequency: 0.3,
        counts: [0.0, 1.0, 0.0, 2.0, 0.0, 0.0],
        in_prompt: [1.0, 0.0, 0.0, 0.0, 0.0, 0.0],
        ..NO_PENALTIES
    };
    // (settings, the temperature the log-probs are at): greedy rows score at 1;
    // top-k does not renormalize them.
    let cases = [
        (settings(0.7, 0, 1.0, 0.0), 0.7),
        (settings(1.3, 0, 1.0, 0.0), 1.3),
        (settings(1.2, 2, 1.0, 0.0), 1.2),
        (settings(0.0, 0, 1.0, 0.0), 1.0),
    ];
    for (s, t) in cases {
        let s = Settings {
            penalties,
            processed: true,
            ..s
        };
        let z: Vec<f32> = penalized(&penalties).iter().map(|&x| (x / t) as f32).collect();
        let want = log_softmax(&z);
        let (tokens, log_probs) = run(&client, &exe, s, &seeds, &[5; 64]);
        for (&token, &lp) in tokens.iter().zip(&log_probs) {
            let want = want[token as usize];
            assert!(
                (f64::from(lp) - want).abs() < 1e-5,
                "T {}: token {token} has log-prob {lp}, the tempered distribution {want}",
                s.temperature
            );
        }
        let (raw_tokens, _) = run(&client, &exe, Settings { processed: false, ..s }, &seeds, &[5; 64]);
        assert_eq!(raw_tokens, tokens, "the log-prob mode does not change the draws");
    }
}

/// The row's uniform, as the sampler's hash of (seed, step) makes it.
fn host_uniform(seed: u32, step: u32) -> f64 {
    let mut x = seed ^ step.wrapping_mul(0x9E37_79B9);
    x = (x ^ (x >> 16)).wrapping_mul(0x7FEB_352D);
    x = (x ^ (x >> 15)).wrapping_mul(0x846C_A68B);
    x ^= x >> 16;
    f64::from(x >> 8) / f64::from(1u32 << 24)
}

#[test]
fn a_large_vocabulary_draws_the_inverse_cdf_of_each_rows_uniform() {
    // 1000 tokens: 7 whole blocks of the two-level running sum and a padded one.
    let (v, b) = (1000i64, 2048usize);
    let client = cpu_client();
    let d = client.device(0).unwrap();
    let g = Graph::new("sampler_large");
    let logits = g.parameter(ElementType::F32, &[b as i64, v]).unwrap();
    let p = SamplingInputs::parameters(&g, b as i64).unwrap();
    let (tokens, _) = sample(
        &logits,
        &SamplingInputs::from_tensors(&p),
        None,
        SamplerKind::Plain,
        None,
    )
    .unwrap();
    let exe = g.build(&[&tokens]).unwrap().compile(&client).unwrap();
    let z: Vec<f32> = (0..v)
        .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 6.0)
        .collect();
    let seeds: Vec<u32> = (0..b as u32)
        .map(|i| i.wrapping_mul(2_654_435_761) ^ 0x5bd1_e995)
        .collect();
    for (temperature, min_p) in [(1.0f32, 0.0f32), (0.6, 0.05)] {
        let column = |x: f32| vec![x; b];
        let dims = [b as i64];
        let all: Vec<f32> = (0..b).flat_map(|_| z.iter().copied()).collect();
        let buffers = vec![
            client.buffer_from_host(&all, &[b as i64, v], d).unwrap(),
            client.buffer_from_host(&column(1.0), &dims, d).unwrap(),
            client.buffer_from_host(&column(0.0), &dims, d).unwrap(),
            client.buffer_from_host(&column(0.0), &dims, d).unwrap(),
            client.buffer_from_host(&column(0.0), &dims, d).unwrap(),
            client.buffer_from_host(&column(temperature), &dims, d).unwrap(),
            client.buffer_from_host(&vec![0i32; b], &dims, d).unwrap(),
            client.buffer_from_host(&column(1.0), &dims, d).unwrap(),
            client.buffer_from_host(&column(min_p), &dims, d).unwrap(),
            client.buffer_from_host(&seeds, &dims, d).unwrap(),
            client.buffer_from_host(&vec![7u32; b], &dims, d).unwrap(),
            client.buffer_from_host(&column(0.0), &dims, d).unwrap(),
        ];
        let refs: Vec<&Buffer> = buffers.iter().collect();
        let drawn = exe.execute(&refs).unwrap()[0].to_host::<i32>().unwrap();
        // The host's inverse CDF in f64 over the kept masses.
        let tempered: Vec<f64> = z.iter().map(|&x| f64::from(x) / f64::from(temperature)).collect();
        let m = tempered.iter().copied().fold(f64::MIN, f64::max);
        let mass: Vec<f64> = tempered
            .iter()
            .map(|&x| (x - m).exp())
            .map(|e| if e >= f64::from(min_p) { e } else { 0.0 })
            .collect();
        let running: Vec<f64> = mass
            .iter()
            .scan(0.0, |sum, e| {
                *sum += e;
                Some(*sum)
            })
            .collect();
        let total = running[running.len() - 1];
        let mut differ = 0;
        for (row, &token) in drawn.iter().enumerate() {
            let mark = host_uniform(seeds[row], 7) * total;
            let want = running.iter().position(|&r| r > mark).unwrap();
            let token = token as usize;
            assert!(mass[token] > 0.0, "row {row}: token {token} has no mass");
            if token != want {
                // Only a mark within rounding of the boundary between them may differ.
                let boundary = running[token.min(want)];
                assert!(
                    (boundary - mark).abs() <= 1e-5 * total,
                    "row {row}: drew {token}, the inverse CDF gives {want}"
                );
                differ += 1;
            }
        }
        assert!(differ <= 2, "{differ} of {b} draws off the host's inverse CDF");
    }
}
