//! Packing rollouts into micro-batches (layout, masks, padding rows, the
//! normalizer) and the learning-rate schedules against hand-computed values.

use grpo_learner::batch::{PromptSharing, TrainSample, pack, pack_sharing, token_bucket};
use grpo_learner::loss::LossType;
use grpo_learner::schedule::{Decay, Schedule};

fn rollout(prompt: &[u32], completion: &[u32], advantage: f32, valid: bool) -> TrainSample {
    TrainSample {
        prompt: prompt.to_vec(),
        completion: completion.to_vec(),
        loss_mask: vec![true; completion.len()],
        behaviour_logprobs: completion.iter().map(|&t| -(t as f32) / 10.0).collect(),
        advantage,
        valid,
    }
}

#[test]
fn prompts_pack_left_padded_and_completions_after_them() {
    let rollouts = [
        rollout(&[1, 2, 3], &[7, 8], 0.5, true),
        rollout(&[4], &[9, 10, 11], -1.0, true),
        rollout(&[5, 6], &[12], 2.0, false),
    ];
    let step = pack(&rollouts, 2, 64, LossType::Dapo, 8).unwrap();
    assert_eq!(step.micro_batches.len(), 2);
    assert_eq!(step.tokens, 5, "the skipped sample's token does not count");
    assert_eq!(step.normalizer, 5.0);
    let first = &step.micro_batches[0];
    let shape = first.shape;
    assert_eq!((shape.rows, shape.prompt_tokens, shape.completion_tokens), (2, 16, 16));
    let t = shape.tokens();
    // Row 0: the prompt ends at column 16, the completion starts there.
    assert!(first.ids[..13].iter().all(|&id| id == 0));
    assert_eq!(first.ids[13..19], [1, 2, 3, 7, 8, 0]);
    assert_eq!(first.attention[12..19], [false, true, true, true, true, true, false]);
    assert_eq!(first.ids[t + 15..t + 19], [4, 9, 10, 11]);
    // Completion columns: row 0 scores 7 and 8, row 1 scores 9–11.
    assert_eq!(first.completion[..3], [1.0, 1.0, 0.0]);
    assert_eq!(first.behaviour[..2], [-0.7, -0.8]);
    assert_eq!(first.completion[16..20], [1.0, 1.0, 1.0, 0.0]);
    assert_eq!(first.advantages, [0.5, -1.0]);
    // The last micro-batch: the skipped sample (no mask, no advantage) and a padding row.
    let last = &step.micro_batches[1];
    assert!(last.completion.iter().all(|&m| m == 0.0));
    assert_eq!(last.advantages, [0.0, 0.0]);
    assert!(last.attention[t..].iter().all(|&a| !a), "the padding row is empty");
    let grpo = pack(&rollouts, 2, 64, LossType::Grpo, 8).unwrap();
    assert_eq!(grpo.normalizer, 2.0, "GRPO normalizes by the valid sequences");
    let dr = pack(&rollouts, 2, 64, LossType::DrGrpo, 8).unwrap();
    assert_eq!(dr.normalizer, 16.0, "Dr. GRPO by sequences × max completion length");
    // DAPO shares the batch's token count out; BNPO gives each micro-batch
    // its own (the step averages the micro-batches: their token means).
    assert_eq!((step.micro_normalizer(0), step.micro_normalizer(1)), (2.5, 2.5));
    let bnpo = pack(&rollouts, 2, 64, LossType::Bnpo, 8).unwrap();
    assert_eq!(bnpo.normalizer, 5.0);
    assert_eq!(bnpo.micro_normalizer(0), 5.0, "the first micro-batch's 5 tokens");
    assert_eq!(
        bnpo.micro_normalizer(1),
        1.0,
        "the second holds no valid token: at least 1"
    );
    let uneven = [
        rollout(&[1], &[7, 8, 9], 1.0, true),
        rollout(&[2], &[7], -1.0, true),
        rollout(&[3], &[7, 8], 1.0, true),
        rollout(&[4], &[9, 9, 9, 9], -1.0, true),
    ];
    let bnpo = pack(&uneven, 2, 64, LossType::Bnpo, 8).unwrap();
    assert_eq!((bnpo.micro_normalizer(0), bnpo.micro_normalizer(1)), (4.0, 6.0));
}

#[test]
fn buckets_and_refusals() {
    assert_eq!(token_bucket(3, 1024), 16);
    assert_eq!(token_bucket(17, 1024), 24);
    assert_eq!(token_bucket(24, 1024), 24);
    assert_eq!(token_bucket(25, 1024), 32);
    assert_eq!(token_bucket(77, 1024), 96);
    assert_eq!(token_bucket(97, 1024), 128);
    assert_eq!(token_bucket(70, 100), 96);
    assert_eq!(token_bucket(99, 100), 100, "never past the maximum");
    let long = [rollout(&[1; 40], &[2; 30], 1.0, true)];
    assert!(
        pack(&long, 1, 64, LossType::Dapo, 8)
            .unwrap_err()
            .to_string()
            .contains("70 tokens")
    );
    let mut broken = rollout(&[1], &[2, 3], 1.0, true);
    broken.behaviour_logprobs.pop();
    assert!(
        pack(&[broken], 1, 64, LossType::Dapo, 8)
            .unwrap_err()
            .to_string()
            .contains("log-probs")
    );
    assert!(pack(&[], 1, 64, LossType::Dapo, 8).is_err());
}

#[test]
fn schedules_match_transformers() {
    let s = |decay| Schedule {
        lr: 1e-3,
        warmup: 10,
        total: 110,
        decay,
    };
    let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    for decay in [Decay::Constant, Decay::Linear, Decay::Cosine] {
        close(s(decay).at(0), 0.0);
        close(s(decay).at(5), 5e-4);
        close(s(decay).at(10), 1e-3);
    }
    close(s(Decay::Constant).at(100), 1e-3);
    close(s(Decay::Linear).at(60), 5e-4);
    close(s(Decay::Linear).at(110), 0.0);
    close(s(Decay::Cosine).at(60), 5e-4);
    close(
        s(Decay::Cosine).at(35),
        1e-3 * 0.5 * (1.0 + (std::f64::consts::PI / 4.0).cos()),
    );
    close(s(Decay::Cosine).at(500), 0.0);
    // A run shorter than its warm-up is cut short, as transformers' are:
    // valid, the rate still ramping at the last step, and said so.
    let short = Schedule {
        warmup: 200,
        ..s(Decay::Constant)
    };
    assert_eq!(short.at(short.total - 1), short.lr * (short.total - 1) as f64 / 200.0);
    let warning = short.cut_short().unwrap();
    assert!(
        warning.contains("200 warm-up steps are more than the run's"),
        "{warning}"
    );
    assert!(s(Decay::Constant).cut_short().is_none());
    // An evaluation-only run (no step) has no schedule to cut.
    let none = Schedule { total: 0, ..short };
    assert!(none.cut_short().is_none());
}

#[test]
fn samples_of_one_prompt_share_rows_when_it_is_cheaper() {
    // A group of three samples of one prompt, then one of another.
    let rollouts = [
        rollout(&[1, 2, 3], &[7, 8], 0.5, true),
        rollout(&[1, 2, 3], &[9], -1.0, true),
        rollout(&[1, 2, 3], &[10, 11, 12], 0.25, false),
        rollout(&[4, 5], &[13], 2.0, true),
    ];
    let free_attention = PromptSharing {
        max_slots: 4,
        attention_width: f64::INFINITY,
        row_multiple: 1,
    };
    let step = pack_sharing(&rollouts, 8, 64, LossType::Dapo, 8, free_attention).unwrap();
    assert_eq!(step.tokens, 4, "the skipped sample's tokens do not count");
    assert_eq!(step.micro_batches.len(), 1);
    let batch = &step.micro_batches[0];
    let shape = batch.shape;
    // Two rows of four slots (160 columns) cost less than four of two (192) or eight of one (256).
    assert_eq!(
        (shape.rows, shape.slots, shape.prompt_tokens, shape.completion_tokens),
        (2, 4, 16, 16)
    );
    // Row 0: the prompt once, right-aligned in 16 columns, then 4 slots of 16.
    let (t, p, c) = (shape.tokens(), 16, 16);
    assert_eq!(t, 16 + 4 * 16);
    assert_eq!(batch.ids[p - 3..p], [1, 2, 3]);
    assert_eq!(batch.ids[p..p + 3], [7, 8, 0]);
    assert_eq!(batch.ids[p + c..p + c + 2], [9, 0]);
    assert_eq!(batch.ids[p + 2 * c..p + 2 * c + 4], [10, 11, 12, 0]);
    assert!(
        batch.attention[p + 3 * c..t].iter().all(|&a| !a),
        "the fourth slot is empty"
    );
    // Row 1: the other prompt, which cannot join the group's row.
    assert_eq!(batch.ids[t + p - 2..t + p + 2], [4, 5, 13, 0]);
    assert_eq!(
        batch.attention[p - 4..p + 3],
        [false, true, true, true, true, true, false]
    );
    // Per-sample tensors are in sample order: row · slots + slot.
    assert_eq!(batch.completion[..3], [1.0, 1.0, 0.0]);
    assert_eq!(batch.completion[c..c + 2], [1.0, 0.0]);
    assert!(
        batch.completion[2 * c..4 * c].iter().all(|&m| m == 0.0),
        "skipped and empty slots count for nothing"
    );
    assert_eq!(batch.completion[4 * c..4 * c + 2], [1.0, 0.0]);
    assert_eq!(batch.behaviour[2 * c..2 * c + 3], [-1.0, -1.1, -1.2]);
    assert_eq!(batch.advantages, [0.5, -1.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0]);

    // The layout (rows, slots) of 8 samples a micro-batch: expensive attention
    // keeps one sample a row, and the rows split over the devices.
    let layout = |sharing| {
        let shape = pack_sharing(&rollouts, 8, 64, LossType::Dapo, 8, sharing)
            .unwrap()
            .micro_batches[0]
            .shape;
        (shape.rows, shape.slots)
    };
    let costly = PromptSharing {
        attention_width: 1.0,
        ..free_attention
    };
    assert_eq!(layout(costly), (8, 1));
    for (devices, rows_and_slots) in [(2, (2, 4)), (4, (4, 2))] {
        let split = PromptSharing {
            row_multiple: devices,
            ..free_attention
        };
        assert_eq!(layout(split), rows_and_slots, "over {devices} devices");
    }
}
