//! The traced GRPO loss on the real CPU plugin against an f64 host
//! implementation of the formulas, for every loss type, with and without
//! the KL term, under each importance correction: the loss, its clip and
//! KL statistics, and its gradient (host finite differences). Also: two
//! micro-batches add up to the full batch.

use grpo_learner::loss::{GrpoLoss, Importance, LossInputs, LossType, grpo_loss};
use grpo_xla::trace::{Graph, grad};
use grpo_xla::{Client, ClientOptions, ElementType, Executable, Platform};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const B: usize = 3;
const T: usize = 5;

fn client() -> Client {
    Client::for_platform(
        Platform::Cpu,
        ClientOptions::default().compile_cache_dir(None).cpu_device_count(1),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// One batch on the host.
#[derive(Clone)]
struct Batch {
    lp: Vec<f64>,
    old: Vec<f64>,
    behaviour: Vec<f64>,
    reference: Vec<f64>,
    advantages: Vec<f64>,
    mask: Vec<f64>,
}

fn batch(seed: u64) -> Batch {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut uniform = |n: usize, lo: f64, hi: f64| -> Vec<f64> { (0..n).map(|_| rng.random_range(lo..hi)).collect() };
    let lp = uniform(B * T, -3.0, -0.1);
    // Ratios spread across both clip bounds; behaviour off enough to mask some sequences.
    let old: Vec<f64> = lp.iter().zip(uniform(B * T, -0.4, 0.4)).map(|(l, d)| l + d).collect();
    let behaviour: Vec<f64> = old.iter().zip(uniform(B * T, -0.5, 0.5)).map(|(l, d)| l + d).collect();
    let reference: Vec<f64> = lp.iter().zip(uniform(B * T, -0.6, 0.6)).map(|(l, d)| l + d).collect();
    let advantages = uniform(B, -1.5, 1.5);
    let mut mask: Vec<f64> = uniform(B * T, 0.0, 1.0)
        .iter()
        .map(|&u| if u < 0.75 { 1.0 } else { 0.0 })
        .collect();
    for b in 0..B {
        mask[b * T] = 1.0;
    }
    Batch {
        lp,
        old,
        behaviour,
        reference,
        advantages,
        mask,
    }
}

/// The module's formulas in f64: (loss, low clipped, high clipped, KL sum).
fn host(x: &Batch, s: &GrpoLoss, normalizer: f64) -> (f64, f64, f64, f64) {
    let (lo, hi) = (1.0 - f64::from(s.epsilon), 1.0 + f64::from(s.epsilon_high));
    let (mut loss, mut low, mut high, mut kl_sum) = (0.0, 0.0, 0.0, 0.0);
    for b in 0..B {
        let row = b * T..(b + 1) * T;
        let length: f64 = x.mask[row.clone()].iter().sum::<f64>().max(1.0);
        let seq_log_ratio: f64 = row.clone().map(|i| x.mask[i] * (x.old[i] - x.behaviour[i])).sum();
        for i in row {
            let a = x.advantages[b];
            let r = (x.lp[i] - x.old[i]).exp();
            let mut l = -(r * a).min(r.clamp(lo, hi) * a);
            let d = x.reference[i] - x.lp[i];
            let kl = d.exp() - d - 1.0;
            if s.beta != 0.0 {
                l += f64::from(s.beta) * kl;
            }
            let w = match s.importance {
                Importance::Off => 1.0,
                Importance::Token { cap } => (x.old[i] - x.behaviour[i]).exp().min(f64::from(cap)),
                Importance::Sequence { cap } => f64::from(seq_log_ratio.abs() <= f64::from(cap).ln()),
            };
            let n = if s.loss_type == LossType::Grpo {
                1.0 / length
            } else {
                1.0
            };
            loss += x.mask[i] * w * n * l;
            low += x.mask[i] * f64::from(r < lo && a < 0.0);
            high += x.mask[i] * f64::from(r > hi && a > 0.0);
            if s.beta != 0.0 {
                kl_sum += x.mask[i] * kl;
            }
        }
    }
    (loss / normalizer, low, high, kl_sum)
}

/// `(lp, old, behaviour, reference, advantages, mask, normalizer) → (loss, low, high, kl, ∂loss/∂lp)`.
fn program(client: &Client, settings: &GrpoLoss) -> Executable {
    let g = Graph::new("grpo_loss");
    let matrix = |g: &Graph| g.parameter(ElementType::F32, &[B as i64, T as i64]).unwrap();
    let (lp, old, behaviour, reference) = (matrix(&g), matrix(&g), matrix(&g), matrix(&g));
    let advantages = g.parameter(ElementType::F32, &[B as i64]).unwrap();
    let mask = matrix(&g);
    let normalizer = g.parameter(ElementType::F32, &[]).unwrap();
    let inputs = LossInputs {
        logprobs: &lp,
        old_logprobs: &old,
        behaviour_logprobs: Some(&behaviour),
        ref_logprobs: Some(&reference),
        advantages: &advantages,
        mask: &mask,
        normalizer: &normalizer,
    };
    let out = grpo_loss(&inputs, settings).unwrap();
    let d_lp = grad(&out.loss, &[&lp]).unwrap().remove(0);
    g.build(&[&out.loss, &out.low_clipped, &out.high_clipped, &out.kl, &d_lp])
        .unwrap()
        .compile(client)
        .unwrap()
}

fn run(client: &Client, exe: &Executable, x: &Batch, normalizer: f64) -> Vec<Vec<f32>> {
    let d = client.device(0).unwrap();
    let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<f32>>();
    let matrix = |v: &[f64]| client.buffer_from_host(&f32s(v), &[B as i64, T as i64], d).unwrap();
    let buffers = [
        matrix(&x.lp),
        matrix(&x.old),
        matrix(&x.behaviour),
        matrix(&x.reference),
        client.buffer_from_host(&f32s(&x.advantages), &[B as i64], d).unwrap(),
        matrix(&x.mask),
        client.buffer_from_host(&[normalizer as f32], &[], d).unwrap(),
    ];
    let refs: Vec<_> = buffers.iter().collect();
    exe.execute(&refs)
        .unwrap()
        .iter()
        .map(|b| b.to_host::<f32>().unwrap())
        .collect()
}

/// `x` with every value rounded to f32, so host and device see the same inputs.
fn rounded(mut x: Batch) -> Batch {
    for v in [
        &mut x.lp,
        &mut x.old,
        &mut x.behaviour,
        &mut x.reference,
        &mut x.advantages,
    ] {
        for value in v.iter_mut() {
            *value = f64::from(*value as f32);
        }
    }
    x
}

#[test]
fn every_variant_matches_the_host_formulas_and_their_gradient() {
    let client = client();
    // The cases reach both clip bounds, and sequence masking keeps some
    // sequences and drops others (so no branch goes untested).
    let (mut lows, mut highs) = (0.0, 0.0);
    let mut masked = [0usize; 2];
    for seed in 0..3 {
        let x = rounded(batch(seed));
        let (_, low, high, _) = host(
            &x,
            &GrpoLoss {
                epsilon_high: 0.28,
                ..GrpoLoss::default()
            },
            1.0,
        );
        lows += low;
        highs += high;
        for b in 0..B {
            let ratio: f64 = (b * T..(b + 1) * T)
                .map(|i| x.mask[i] * (x.old[i] - x.behaviour[i]))
                .sum();
            masked[usize::from(ratio.abs() <= 1.3f64.ln())] += 1;
        }
    }
    assert!(
        lows > 0.0 && highs > 0.0 && masked[0] > 0 && masked[1] > 0,
        "{lows} {highs} {masked:?}"
    );
    let mut variants = 0;
    for loss_type in [LossType::Dapo, LossType::Grpo, LossType::DrGrpo] {
        for beta in [0.0, 0.1] {
            for importance in [
                Importance::Off,
                Importance::Token { cap: 2.0 },
                Importance::Sequence { cap: 1.3 },
            ] {
                let settings = GrpoLoss {
                    loss_type,
                    epsilon: 0.2,
                    epsilon_high: 0.28,
                    beta,
                    importance,
                    ..GrpoLoss::default()
                };
                let exe = program(&client, &settings);
                for seed in 0..3 {
                    let x = rounded(batch(seed));
                    let tokens = x.mask.iter().sum::<f64>() as usize;
                    let normalizer = f64::from(loss_type.normalizer(tokens, B, T));
                    let out = run(&client, &exe, &x, normalizer);
                    let (loss, low, high, kl) = host(&x, &settings, normalizer);
                    let what = format!("{loss_type:?} beta {beta} {importance:?} seed {seed}");
                    assert!(
                        (f64::from(out[0][0]) - loss).abs() < 1e-5 * loss.abs().max(1.0),
                        "{what}: loss {} vs {loss}",
                        out[0][0]
                    );
                    assert_eq!(
                        (f64::from(out[1][0]), f64::from(out[2][0])),
                        (low, high),
                        "{what}: clip counts"
                    );
                    assert!((f64::from(out[3][0]) - kl).abs() < 1e-5 * kl.max(1.0), "{what}: kl");
                    for (i, &got) in out[4].iter().enumerate() {
                        let h = 1e-6;
                        let at = |delta: f64| {
                            let mut y = x.clone();
                            y.lp[i] += delta;
                            host(&y, &settings, normalizer).0
                        };
                        let fd = (at(h) - at(-h)) / (2.0 * h);
                        let got = f64::from(got);
                        assert!(
                            (got - fd).abs() < 1e-4 * fd.abs().max(0.1),
                            "{what}: d/dlp[{i}] {got} vs {fd}"
                        );
                    }
                }
                variants += 1;
            }
        }
    }
    assert_eq!(variants, 18);
}

#[test]
fn micro_batches_add_up_to_the_full_batch() {
    let client = client();
    let settings = GrpoLoss {
        loss_type: LossType::Dapo,
        ..GrpoLoss::default()
    };
    let x = rounded(batch(7));
    let exe = program(&client, &settings);
    let tokens = x.mask.iter().sum::<f64>() as usize;
    let normalizer = f64::from(LossType::Dapo.normalizer(tokens, B, T));
    let full = run(&client, &exe, &x, normalizer)[0][0];
    // Split by zeroing the mask: rows 0 and 1–2 as two "micro-batches" of the same shape.
    let part = |rows: std::ops::Range<usize>| {
        let mut y = x.clone();
        for b in (0..B).filter(|b| !rows.contains(b)) {
            y.mask[b * T..(b + 1) * T].fill(0.0);
        }
        run(&client, &exe, &y, normalizer)[0][0]
    };
    let sum = part(0..1) + part(1..3);
    assert!((sum - full).abs() < 1e-6, "{sum} vs {full}");
}
