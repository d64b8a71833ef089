//! The measured dtype choices: the probes run XLA programs and cache their
//! results per shape, `auto` takes a probe's pick or a resumed run's
//! earlier choice, and an explicit setting is never probed.

use grpo_learner::choices::{self, ChoiceRecord, ChoiceRequest, Choices};
use grpo_learner::config::{Dtype, DtypeSetting};
use grpo_learner::probe::{Phase, Probe, ProbeShape};
use grpo_xla::{Client, ClientOptions, Platform};

fn client() -> Client {
    Client::for_platform(
        Platform::Cpu,
        ClientOptions::default().compile_cache_dir(None).cpu_device_count(1),
    )
    .unwrap()
}

fn shape(phase: Phase, rows: usize) -> ProbeShape {
    ProbeShape::new(phase, rows, 64, 128)
}

#[test]
fn a_probe_times_both_dtypes_and_is_read_back_from_the_cache() {
    let client = client();
    let cache = tempfile::tempdir().unwrap();
    for (phase, rows) in [(Phase::Train, 256), (Phase::Engine, 32)] {
        let measured = Probe::run(&client, phase, shape(phase, rows), cache.path()).unwrap();
        assert!(!measured.cached);
        assert!(measured.f32_ms > 0.0 && measured.bf16_ms > 0.0, "{measured:?}");
        let again = Probe::run(&client, phase, shape(phase, rows), cache.path()).unwrap();
        assert!(again.cached, "the second probe of a shape is read from the cache");
        let same = |a: f64, b: f64| (a - b).abs() <= 1e-12 * a.abs();
        assert!(same(again.f32_ms, measured.f32_ms) && same(again.bf16_ms, measured.bf16_ms));
    }
    // Another shape is another measurement.
    let other = Probe::run(&client, Phase::Train, shape(Phase::Train, 512), cache.path()).unwrap();
    assert!(!other.cached);
    let files = std::fs::read_dir(cache.path().join("probes")).unwrap().count();
    assert_eq!(files, 3, "one cache file per phase and shape");
}

#[test]
fn a_damaged_cache_file_is_measured_again() {
    let client = client();
    let cache = tempfile::tempdir().unwrap();
    let shape = shape(Phase::Engine, 16);
    Probe::run(&client, Phase::Engine, shape, cache.path()).unwrap();
    let probes = cache.path().join("probes");
    let file = std::fs::read_dir(&probes).unwrap().next().unwrap().unwrap().path();
    for damage in [
        "{\"phase\": \"engine\"",
        "{\"phase\":\"engine\",\"shape\":{\"rows\":16,\"hidden\":64,\"intermediate\":128},\"f32_ms\":-1,\"bf16_ms\":1}",
    ] {
        std::fs::write(&file, damage).unwrap();
        let probe = Probe::run(&client, Phase::Engine, shape, cache.path()).unwrap();
        assert!(!probe.cached, "{damage}: measured again");
        assert!(probe.f32_ms > 0.0);
    }
}

#[test]
fn the_rule_takes_bf16_only_when_it_is_clearly_faster() {
    let probe = |f32_ms, bf16_ms| Probe {
        phase: Phase::Train,
        shape: shape(Phase::Train, 64),
        f32_ms,
        bf16_ms,
        cached: false,
    };
    assert_eq!(probe(10.0, 5.0).choice(), Dtype::Bf16);
    assert_eq!(probe(10.0, 8.9).choice(), Dtype::Bf16);
    assert_eq!(
        probe(10.0, 9.5).choice(),
        Dtype::F32,
        "within the margin: f32's precision"
    );
    assert_eq!(probe(10.0, 14.0).choice(), Dtype::F32);
}

#[test]
fn a_probe_shape_keeps_one_run_short_for_large_models() {
    let small = ProbeShape::new(Phase::Train, 1024, 576, 1536);
    assert_eq!(small.rows, 1024, "SmolLM2-135M's micro-batch is probed whole");
    let large = ProbeShape::new(Phase::Train, 8192, 4096, 14336);
    assert!(large.rows < 8192 && large.flops(Phase::Train) <= 2.01e10, "{large:?}");
    assert_eq!(ProbeShape::new(Phase::Engine, 1, 64, 128).rows, 16, "at least 16 rows");
}

fn request(compute: DtypeSetting, engine: Option<DtypeSetting>) -> ChoiceRequest {
    ChoiceRequest {
        compute_dtype: compute,
        engine_dtype: engine,
        train: shape(Phase::Train, 128),
        engine: shape(Phase::Engine, 16),
    }
}

#[test]
fn explicit_settings_are_taken_without_a_probe() {
    let client = client();
    let cache = tempfile::tempdir().unwrap();
    let record = ChoiceRecord::decide(
        &client,
        &request(DtypeSetting::Bf16, Some(DtypeSetting::F32)),
        None,
        cache.path(),
    )
    .unwrap();
    assert_eq!(
        record.choices,
        Choices {
            compute_dtype: Dtype::Bf16,
            engine_dtype: Some(Dtype::F32)
        }
    );
    assert!(record.probes.is_empty());
    assert!(!cache.path().join("probes").exists(), "nothing measured");
    // An explicit setting wins over a resumed run's earlier choice.
    let earlier = Choices {
        compute_dtype: Dtype::F32,
        engine_dtype: Some(Dtype::Bf16),
    };
    let record = ChoiceRecord::decide(
        &client,
        &request(DtypeSetting::Bf16, Some(DtypeSetting::F32)),
        Some(earlier),
        cache.path(),
    )
    .unwrap();
    assert_eq!(record.choices.compute_dtype, Dtype::Bf16);
    assert_eq!(record.choices.engine_dtype, Some(Dtype::F32));
}

#[test]
fn auto_takes_the_probes_pick_or_the_runs_earlier_choice() {
    let client = client();
    let cache = tempfile::tempdir().unwrap();
    let auto = request(DtypeSetting::Auto, Some(DtypeSetting::Auto));
    let record = ChoiceRecord::decide(&client, &auto, None, cache.path()).unwrap();
    assert_eq!(record.probes.len(), 2);
    assert_eq!(record.probes[0].phase, Phase::Train);
    assert_eq!(record.choices.compute_dtype, record.probes[0].choice());
    assert_eq!(record.choices.engine_dtype, Some(record.probes[1].choice()));

    // A resumed run keeps what it chose, whatever the probes say now.
    let flip = |d: Dtype| if d == Dtype::F32 { Dtype::Bf16 } else { Dtype::F32 };
    let earlier = Choices {
        compute_dtype: flip(record.choices.compute_dtype),
        engine_dtype: record.choices.engine_dtype.map(flip),
    };
    let resumed = ChoiceRecord::decide(&client, &auto, Some(earlier), cache.path()).unwrap();
    assert_eq!(resumed.choices, earlier);
    assert!(resumed.probes.is_empty());

    // Without in-process engines there is no engine dtype to choose.
    let record = ChoiceRecord::decide(&client, &request(DtypeSetting::Auto, None), None, cache.path()).unwrap();
    assert_eq!(record.choices.engine_dtype, None);
    assert_eq!(record.probes.len(), 1);
}

#[test]
fn a_resumed_run_takes_its_checkpoints_choices_and_older_checkpoints_mean_f32() {
    let out = tempfile::tempdir().unwrap();
    let checkpoint = |state: serde_json::Value| grpo_learner::checkpoint::LoadedCheckpoint {
        dir: out.path().join("checkpoint-2"),
        optimizer: Default::default(),
        state,
    };
    let bf16 = Choices {
        compute_dtype: Dtype::Bf16,
        engine_dtype: None,
    };
    let recorded = |state, resume| choices::recorded(out.path(), Some(&checkpoint(state)), resume).unwrap();
    let with = serde_json::json!({"step": 2, "choices": {"compute_dtype": "bf16", "engine_dtype": null}});
    assert_eq!(recorded(with.clone(), true), Some(bf16));
    assert_eq!(recorded(with, false), None, "a new run records nothing before it");
    assert_eq!(
        recorded(serde_json::json!({"step": 2}), true),
        Some(Choices::F32),
        "written before grpo kept choices: the defaults of then"
    );
    let bad = choices::recorded(
        out.path(),
        Some(&checkpoint(serde_json::json!({"choices": {"compute_dtype": "f64"}}))),
        true,
    )
    .unwrap_err();
    assert!(bad.to_string().contains("trainer_state.json"), "{bad}");

    // Without a checkpoint, the folder's record; none there: nothing.
    assert_eq!(choices::recorded(out.path(), None, true).unwrap(), None);
    let record = ChoiceRecord {
        choices: bf16,
        probes: Vec::new(),
    };
    record.write(out.path()).unwrap();
    assert_eq!(choices::recorded(out.path(), None, true).unwrap(), Some(bf16));
    std::fs::write(out.path().join(choices::CHOICES_FILE), "{").unwrap();
    let bad = choices::recorded(out.path(), None, true).unwrap_err();
    assert!(bad.to_string().contains("choices.json"), "{bad}");
}
