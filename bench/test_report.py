"""Self-check of report.py, the FLOP counts of train_step_torch.py and
model_step_torch.py, and generate_torch.py's torch-free helpers on made-up lines.

The numbers below are invented round values to check the arithmetic; they are
no measurement. Run: python3 -m unittest discover -s bench -p 'test_*.py'
(needs no torch).
"""

import io
import json
import os
import sys
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import generate_torch  # noqa: E402
import grpo_loop_trl  # noqa: E402
import model_step_torch  # noqa: E402
import report  # noqa: E402
import train_step_torch  # noqa: E402

SAMPLE = """\
building... (a log line that is not JSON)
{"impl": "grpo", "model": "mlp", "median_ms": 100.0, "best_ms": 90.0, "runs": 7}
{"impl": "torch", "model": "mlp", "median_ms": 200.0, "best_ms": 180.0, "runs": 7}
{"impl": "grpo", "model": "mlp", "median_ms": 120.0, "best_ms": 95.0, "runs": 7}
{"impl": "torch", "model": "mlp", "median_ms": 220.0, "best_ms": 170.0, "runs": 7}
{"impl": "grpo", "model": "mlp", "median_ms": 110.0, "best_ms": 99.0, "runs": 7}
{"impl": "torch", "model": "mlp", "median_ms": 210.0, "best_ms": 200.0, "runs": 7}
{"impl": "torch", "model": "block", "median_ms": 400.0, "best_ms": 390.0, "runs": 7}
{"impl": "grpo", "model": "block", "median_ms": 500.0, "best_ms": 450.0, "runs": 7}
{"dtype": "f32", "n": 2048, "median_ms": 100.0, "best_ms": 90.0, "gflops": 500.0}
{"dtype": "f32", "n": 1024, "median_ms": 10.0, "best_ms": 9.0, "gflops": 100.0}
{"broken json
"""


class FlopsTest(unittest.TestCase):
    def test_exact_counts(self):
        self.assertEqual(train_step_torch.train_step_flops("mlp"), 25_769_803_776)
        self.assertEqual(train_step_torch.train_step_flops("block"), 42_681_237_504)

    def test_unknown_model(self):
        with self.assertRaises(ValueError):
            train_step_torch.train_step_flops("gpt")

    def test_flops_flag_needs_no_torch(self):
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(train_step_torch.main(["--flops", "--model", "mlp"]), 0)
        self.assertIn('"flops": 25769803776', out.getvalue())

    def test_result_line(self):
        line = train_step_torch.result_line("mlp", [0.3, 0.1, 0.2])
        self.assertEqual(
            line,
            '{"impl": "torch", "model": "mlp", "median_ms": 200.0, "best_ms": 100.0, "runs": 3}',
        )


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.warnings = []
        self.records = report.parse_lines(SAMPLE.splitlines(), self.warnings.append)

    def test_parse_skips_noise(self):
        self.assertEqual(len(self.records), 10)
        self.assertEqual(len(self.warnings), 1)

    def test_ceiling_is_f32_2048(self):
        self.assertEqual(report.matmul_ceiling(self.records), 500.0)
        self.assertIsNone(report.matmul_ceiling(self.records[:8]))

    def test_aggregate_median_of_medians(self):
        stats = report.aggregate(self.records)
        self.assertEqual(stats[("grpo", "mlp")]["median_ms"], 110.0)
        self.assertEqual(stats[("grpo", "mlp")]["best_ms"], 90.0)
        self.assertEqual(stats[("torch", "mlp")]["median_ms"], 210.0)
        self.assertEqual(stats[("torch", "mlp")]["rounds"], 3)
        self.assertEqual(stats[("torch", "mlp")]["runs"], 21)

    def test_rows(self):
        mlp, block = report.build_rows(self.records)
        self.assertEqual(mlp["model"], "mlp")
        self.assertAlmostEqual(mlp["speedup"], 210.0 / 110.0)
        self.assertAlmostEqual(mlp["grpo_gflops"], 25.769803776 / 0.110)
        self.assertAlmostEqual(mlp["torch_of_ceiling"], 25.769803776 / 0.210 / 500.0)
        self.assertEqual(block["model"], "block")
        self.assertAlmostEqual(block["speedup"], 0.8)

    def test_missing_impl_and_ceiling(self):
        lines = ['{"impl": "torch", "model": "block", "median_ms": 250.0, "best_ms": 240.0, "runs": 3}']
        (row,) = report.build_rows(report.parse_lines(lines))
        self.assertIsNone(row["grpo_ms"])
        self.assertIsNone(row["speedup"])
        self.assertIsNone(row["torch_of_ceiling"])
        table = report.format_table([row])
        self.assertIn("not measured", table)
        self.assertIn("| block | 42.68 | n/a | 250.0 | n/a | n/a | 170.7 | n/a | n/a |", table)

    def test_flops_field_wins(self):
        lines = ['{"impl": "grpo", "model": "tiny", "median_ms": 1.0, "best_ms": 1.0, "runs": 1, "flops": 2e9}']
        (row,) = report.build_rows(report.parse_lines(lines))
        self.assertAlmostEqual(row["grpo_gflops"], 2000.0)

    def test_unknown_model_without_flops(self):
        lines = ['{"impl": "grpo", "model": "tiny", "median_ms": 1.0, "best_ms": 1.0, "runs": 1}']
        (row,) = report.build_rows(report.parse_lines(lines))
        self.assertIsNone(row["flops"])
        self.assertIn("| tiny | n/a | 1.0 |", report.format_table([row]))

    def test_table(self):
        table = report.report(SAMPLE.splitlines())
        self.assertIn("ceiling (grpo bench matmul): 500.0 GFLOP/s", table)
        self.assertIn("| mlp | 25.77 | 110.0 | 210.0 | 1.91x | 234.3 | 122.7 | 47% | 25% |", table)
        self.assertIn("| block | 42.68 | 500.0 | 400.0 | 0.80x | 85.4 | 106.7 | 17% | 21% |", table)
        self.assertIn("rounds (grpo, torch): 1/1, 3/3", table)

    def test_no_train_step_lines(self):
        with self.assertRaises(ValueError):
            report.report(['{"dtype": "f32", "n": 2048, "gflops": 1.0}'])


MODEL_SAMPLE = """\
{"meta": {"commit": "abc1234", "cpus": 2}}
{"impl": "grpo", "model": "smollm2-135m", "dtype": "f32", "batch": 8, "seq": 256, "median_ms": 10000.0, "best_ms": 9000.0, "runs": 3}
{"impl": "torch-eager", "model": "smollm2-135m", "dtype": "f32", "batch": 8, "seq": 256, "median_ms": 16000.0, "best_ms": 15000.0, "runs": 3}
{"impl": "torch-sdpa", "model": "smollm2-135m", "dtype": "f32", "batch": 8, "seq": 256, "median_ms": 15000.0, "best_ms": 14000.0, "runs": 3}
{"impl": "grpo", "model": "smollm2-135m", "dtype": "f32", "batch": 8, "seq": 256, "median_ms": 12000.0, "best_ms": 8000.0, "runs": 3}
{"impl": "torch-eager", "model": "smollm2-135m", "dtype": "f32", "batch": 8, "seq": 256, "median_ms": 20000.0, "best_ms": 15500.0, "runs": 3}
{"impl": "torch-sdpa", "model": "smollm2-135m", "dtype": "f32", "batch": 8, "seq": 256, "median_ms": 17000.0, "best_ms": 14500.0, "runs": 3}
{"impl": "torch-sdpa", "model": "smollm2-135m", "dtype": "bf16", "batch": 8, "seq": 256, "median_ms": 4000.0, "best_ms": 3900.0, "runs": 3}
{"impl": "grpo", "model": "smollm2-135m", "dtype": "bf16", "batch": 8, "seq": 256, "median_ms": 8000.0, "best_ms": 7900.0, "runs": 3}
{"dtype": "f32", "n": 2048, "median_ms": 40.0, "best_ms": 39.0, "gflops": 400.0}
{"dtype": "bf16", "n": 2048, "median_ms": 20.0, "best_ms": 19.0, "gflops": 800.0}
{"dtype": "bf16", "n": 1024, "median_ms": 2.0, "best_ms": 2.0, "gflops": 1000.0}
"""

SMOLLM2_FLOPS = 1_761_205_026_816  # the docstring of model_step_torch.py


class ModelFlopsTest(unittest.TestCase):
    def test_smollm2_counts(self):
        counts = model_step_torch.step_flops(model_step_torch.SMOLLM2_135M)
        self.assertEqual(counts["params"], 134_479_872)
        self.assertEqual(counts["weights"], 6 * 134_479_872 * 2048)
        self.assertEqual(counts["attention"], 108_716_359_680)
        self.assertEqual(counts["flops"], SMOLLM2_FLOPS)
        self.assertEqual(model_step_torch.model_flops("smollm2-135m"), SMOLLM2_FLOPS)
        self.assertIsNone(model_step_torch.model_flops("gpt"))

    def test_shape_scaling(self):
        cfg = model_step_torch.SMOLLM2_135M
        one = model_step_torch.step_flops(cfg, batch=1, seq=256)
        self.assertEqual(one["flops"] * 8, SMOLLM2_FLOPS)
        half = model_step_torch.step_flops(cfg, batch=8, seq=128)
        self.assertEqual(half["weights"] * 2, 6 * 134_479_872 * 2048)
        self.assertEqual(half["attention"] * 4, 108_716_359_680)

    def test_params_override_and_head_dim_default(self):
        cfg = dict(model_step_torch.SMOLLM2_135M)
        del cfg["head_dim"]  # 576 / 9 = 64
        self.assertEqual(model_step_torch.linear_params(cfg), 134_479_872)
        self.assertEqual(model_step_torch.step_flops(cfg, 1, 2, params=1)["weights"], 12)

    def test_design_relation(self):
        # 131 tokens/s (DESIGN's torch eager f32 figure) in GFLOP/s.
        per_token = SMOLLM2_FLOPS / 2048
        self.assertAlmostEqual(131 * per_token / 1e9, 112.66, places=2)
        self.assertAlmostEqual(131 * 6 * 134_479_872 / 1e9, 105.70, places=2)

    def test_flops_flag_needs_no_torch(self):
        out = io.StringIO()
        with redirect_stdout(out):
            self.assertEqual(
                model_step_torch.main(["--flops", "--model-dir", "/nonexistent"]), 0
            )
        self.assertIn('"flops": 1761205026816', out.getvalue())
        self.assertIn('"config": "built-in"', out.getvalue())

    def test_result_line(self):
        line = model_step_torch.result_line("sdpa", "bf16", 8, 256, [3.0, 1.0, 2.0])
        self.assertEqual(
            line,
            '{"impl": "torch-sdpa", "model": "smollm2-135m", "dtype": "bf16", "batch": 8, '
            '"seq": 256, "median_ms": 2000.0, "best_ms": 1000.0, "runs": 3}',
        )


class ModelReportTest(unittest.TestCase):
    def setUp(self):
        self.records = report.parse_lines(MODEL_SAMPLE.splitlines())

    def test_kinds_are_apart(self):
        self.assertEqual(sum(map(report.is_model_step, self.records)), 8)
        self.assertFalse(any(map(report.is_train_step, self.records)))
        self.assertEqual(report.build_rows(self.records), [])

    def test_ceilings_per_dtype(self):
        self.assertEqual(report.matmul_ceilings(self.records), {"f32": 400.0, "bf16": 800.0})

    def test_rows(self):
        rows = report.build_model_rows(self.records)
        self.assertEqual(
            [(r["dtype"], r["impl"]) for r in rows],
            [("f32", "grpo"), ("f32", "torch-eager"), ("f32", "torch-sdpa"),
             ("bf16", "grpo"), ("bf16", "torch-sdpa")],
        )
        grpo, eager, sdpa, bgrpo, bsdpa = rows
        self.assertEqual(grpo["median_ms"], 11000.0)
        self.assertEqual(grpo["best_ms"], 8000.0)
        self.assertEqual(grpo["rounds"], 2)
        self.assertIsNone(grpo["speedup"])
        self.assertAlmostEqual(grpo["tokens_per_s"], 2048 / 11.0)
        self.assertAlmostEqual(grpo["gflops"], SMOLLM2_FLOPS / 11.0 / 1e9)
        self.assertAlmostEqual(grpo["mfu"], SMOLLM2_FLOPS / 11.0 / 1e9 / 400.0)
        self.assertAlmostEqual(eager["speedup"], 18000.0 / 11000.0)
        self.assertAlmostEqual(sdpa["speedup"], 16000.0 / 11000.0)
        self.assertAlmostEqual(bsdpa["speedup"], 0.5)
        self.assertAlmostEqual(bsdpa["mfu"], SMOLLM2_FLOPS / 4.0 / 1e9 / 800.0)

    def test_table(self):
        table = report.report(MODEL_SAMPLE.splitlines())
        self.assertIn("ceilings (grpo bench matmul): f32 400.0 GFLOP/s, bf16 800.0 GFLOP/s", table)
        self.assertIn("| smollm2-135m | 8×256 | f32 | grpo | 1761.2 | 11000.0 | 186.2 | 160.1 | 40% | — |", table)
        self.assertIn("| smollm2-135m | 8×256 | f32 | torch-eager | 1761.2 | 18000.0 | 113.8 | 97.8 | 24% | 1.64x |", table)
        self.assertIn("| smollm2-135m | 8×256 | bf16 | torch-sdpa | 1761.2 | 4000.0 | 512.0 | 440.3 | 55% | 0.50x |", table)
        self.assertIn("rounds per row: 1, 2", table)
        self.assertNotIn("train", table.split("\n")[0].lower())

    def test_torch_only_without_ceiling(self):
        lines = [
            '{"impl": "torch-eager", "model": "smollm2-135m", "dtype": "f32", "batch": 8, '
            '"seq": 256, "median_ms": 15600.0, "best_ms": 15000.0, "runs": 2}'
        ]
        (row,) = report.build_model_rows(report.parse_lines(lines))
        self.assertIsNone(row["speedup"])
        self.assertIsNone(row["mfu"])
        table = report.report(lines)
        self.assertIn("not measured", table)
        self.assertIn("| torch-eager | 1761.2 | 15600.0 | 131.3 | 112.9 | n/a | n/a |", table)

    def test_unknown_model_and_flops_field(self):
        lines = [
            '{"impl": "grpo", "model": "tiny", "dtype": "f32", "batch": 2, "seq": 4, '
            '"median_ms": 1.0, "best_ms": 1.0, "runs": 1}',
            '{"impl": "grpo", "model": "small", "dtype": "f32", "batch": 2, "seq": 4, '
            '"median_ms": 1.0, "best_ms": 1.0, "runs": 1, "flops": 3e9}',
        ]
        small, tiny = report.build_model_rows(report.parse_lines(lines))
        self.assertIsNone(tiny["flops"])
        self.assertIsNone(tiny["gflops"])
        self.assertAlmostEqual(small["gflops"], 3000.0)
        self.assertAlmostEqual(small["tokens_per_s"], 8000.0)

    def test_both_kinds_in_one_report(self):
        table = report.report(MODEL_SAMPLE.splitlines() + SAMPLE.splitlines())
        self.assertIn("| smollm2-135m | 8×256 | f32 | grpo |", table)
        self.assertIn("| mlp | 25.77 | 110.0 | 210.0 | 1.91x |", table)


GENERATE_SAMPLE = """\
{"meta": {"bench": "generate", "commit": "abc1234", "cpus": 2}}
{"impl": "grpo", "bench": "generate", "model": "smollm2-135m", "dtype": "f32", "batch": 1, "prompt_tokens": 64, "new_tokens": 64, "prefill_ms": 100.0, "full_ms": 2100.0, "prefill_tokens_per_s": 640.0, "decode_tokens_per_s": 32.0, "runs": 3, "weight_bytes": 500000000, "copy_gbps": 20.0, "bandwidth_tokens_per_s": 40.0, "load_1m": 0.5, "bandwidth_fraction": 0.8}
{"impl": "transformers", "bench": "generate", "model": "smollm2-135m", "dtype": "f32", "batch": 1, "prompt_tokens": 64, "new_tokens": 64, "prefill_ms": 200.0, "full_ms": 4200.0, "prefill_tokens_per_s": 320.0, "decode_tokens_per_s": 16.0, "runs": 3, "weight_bytes": 500000000, "greedy_match": true}
{"impl": "grpo", "bench": "generate", "model": "smollm2-135m", "dtype": "f32", "batch": 16, "prompt_tokens": 64, "new_tokens": 64, "prefill_ms": 1000.0, "full_ms": 3000.0, "prefill_tokens_per_s": 1024.0, "decode_tokens_per_s": 512.0, "runs": 3, "weight_bytes": 500000000, "copy_gbps": 20.0, "bandwidth_tokens_per_s": 40.0}
{"impl": "transformers", "bench": "generate", "model": "smollm2-135m", "dtype": "f32", "batch": 16, "prompt_tokens": 64, "new_tokens": 64, "prefill_ms": 2000.0, "full_ms": 10000.0, "prefill_tokens_per_s": 512.0, "decode_tokens_per_s": 128.0, "runs": 3, "weight_bytes": 500000000, "greedy_match": true}
{"impl": "grpo", "bench": "generate", "model": "smollm2-135m", "dtype": "f32", "batch": 1, "prompt_tokens": 64, "new_tokens": 64, "prefill_ms": 100.0, "full_ms": 2100.0, "prefill_tokens_per_s": 660.0, "decode_tokens_per_s": 28.0, "runs": 3, "weight_bytes": 500000000, "copy_gbps": 30.0, "bandwidth_tokens_per_s": 60.0, "bandwidth_fraction": 0.467}
{"impl": "transformers", "bench": "generate", "model": "smollm2-135m", "dtype": "f32", "batch": 1, "prompt_tokens": 64, "new_tokens": 64, "prefill_ms": 200.0, "full_ms": 4200.0, "prefill_tokens_per_s": 300.0, "decode_tokens_per_s": 14.0, "runs": 3, "weight_bytes": 500000000, "load_1m": 2.25, "greedy_match": false, "greedy_mismatch_at": 40}
{"impl": "grpo", "bench": "generate", "model": "smollm2-135m", "dtype": "bf16", "batch": 1, "prompt_tokens": 64, "new_tokens": 64, "prefill_ms": 100.0, "full_ms": 1100.0, "prefill_tokens_per_s": 640.0, "decode_tokens_per_s": 50.0, "runs": 3, "weight_bytes": 250000000, "copy_gbps": 30.0, "bandwidth_tokens_per_s": 120.0, "bandwidth_fraction": 0.5}
{"impl": "grpo", "model": "smollm2-135m", "dtype": "f32", "batch": 8, "seq": 256, "median_ms": 10000.0, "best_ms": 9000.0, "runs": 3}
"""


class GenerateReportTest(unittest.TestCase):
    def setUp(self):
        self.records = report.parse_lines(GENERATE_SAMPLE.splitlines())

    def test_kinds_are_apart(self):
        self.assertEqual(sum(map(report.is_generate, self.records)), 7)
        self.assertEqual(sum(map(report.is_model_step, self.records)), 1)
        self.assertFalse(any(map(report.is_train_step, self.records)))
        self.assertFalse(any(report.is_generate(r) for r in report.parse_lines(MODEL_SAMPLE.splitlines())))

    def test_bandwidth_and_weights(self):
        self.assertEqual(report.copy_bandwidth(self.records), 25.0)  # median of 20, 20, 30, 30
        self.assertEqual(report.weight_bytes(self.records, "smollm2-135m", "bf16"), 250_000_000)
        self.assertIsNone(report.weight_bytes(self.records, "smollm2-135m", "f16"))

    def test_rows(self):
        rows = report.build_generate_rows(self.records)
        self.assertEqual([(r["dtype"], r["batch"]) for r in rows], [("f32", 1), ("f32", 16), ("bf16", 1)])
        one, sixteen, bf16 = rows
        self.assertEqual((one["grpo_rounds"], one["transformers_rounds"]), (2, 2))
        self.assertEqual(one["grpo_decode"], 30.0)
        self.assertEqual(one["transformers_decode"], 15.0)
        self.assertEqual(one["grpo_prefill"], 650.0)
        self.assertAlmostEqual(one["decode_ratio"], 2.0)
        self.assertAlmostEqual(one["prefill_ratio"], 650.0 / 310.0)
        self.assertAlmostEqual(one["bandwidth_tokens_per_s"], 50.0)  # 25 GB/s over 500 MB
        self.assertAlmostEqual(one["grpo_of_limit"], 0.6)
        self.assertAlmostEqual(one["transformers_of_limit"], 0.3)
        self.assertEqual(one["greedy"], "no (from token 40)")
        self.assertAlmostEqual(sixteen["decode_ratio"], 4.0)
        self.assertIsNone(sixteen["grpo_of_limit"])
        self.assertEqual(sixteen["greedy"], "yes")
        self.assertIsNone(bf16["transformers_decode"])
        self.assertIsNone(bf16["decode_ratio"])
        self.assertIsNone(bf16["greedy"])
        self.assertAlmostEqual(bf16["grpo_of_limit"], 0.5)

    def test_table(self):
        table = report.report(GENERATE_SAMPLE.splitlines())
        self.assertIn(
            "copy bandwidth 25.0 GB/s (grpo, copy_from_slice, bytes read + written); batch-1 decode limits: "
            "f32 500.0 MB of weights → 50.0 tokens/s, bf16 250.0 MB of weights → 100.0 tokens/s",
            table,
        )
        self.assertIn(
            "| smollm2-135m | f32 | 64+64 | 1 | 650.0 | 310.0 | 2.10x | 30.0 | 15.0 | 2.00x | 60% | 30% "
            "| no (from token 40) |",
            table,
        )
        self.assertIn("| smollm2-135m | f32 | 64+64 | 16 | 1024.0 | 512.0 | 2.00x | 512.0 | 128.0 | 4.00x | — | — | yes |", table)
        self.assertIn("| smollm2-135m | bf16 | 64+64 | 1 | 640.0 | n/a | n/a | 50.0 | n/a | n/a | 50% | n/a | n/a |", table)
        self.assertIn("rounds (grpo, transformers): 1/0, 1/1, 2/2", table)
        self.assertIn("; 1-minute load average 0.50–2.25\n", table)
        self.assertEqual(report.load_range(self.records), (0.5, 2.25))
        self.assertIn("| smollm2-135m | 8×256 | f32 | grpo |", table)  # the model-step table too

    def test_adapters_are_rows_of_their_own(self):
        base = json.loads(GENERATE_SAMPLE.splitlines()[1])
        lines = [json.dumps(base)]
        for impl, decode in (("grpo", 20.0), ("transformers", 5.0)):
            lines.append(json.dumps({**base, "impl": impl, "decode_tokens_per_s": decode, "loras": 4, "lora_rank": 16}))
        rows = report.build_generate_rows(report.parse_lines(lines))
        self.assertEqual([(r["loras"], r["lora_rank"]) for r in rows], [(0, 0), (4, 16)])
        self.assertAlmostEqual(rows[1]["decode_ratio"], 4.0)
        self.assertIsNone(rows[1]["grpo_of_limit"], "no bandwidth limit with adapters")
        self.assertIn("| smollm2-135m + 4 LoRA r16 | f32 | 64+64 | 1 |", report.report(lines))

    def test_sampled_runs_are_rows_of_their_own(self):
        base = json.loads(GENERATE_SAMPLE.splitlines()[1])
        lines = [json.dumps(base)]
        sampled = {"grpo": {"temperature": 1, "loras": 0, "lora_rank": 16}, "transformers": {"temperature": 1.0}}
        for impl, decode in (("grpo", 30.0), ("transformers", 10.0)):
            lines.append(json.dumps({**base, "impl": impl, "decode_tokens_per_s": decode, **sampled[impl]}))
        rows = report.build_generate_rows(report.parse_lines(lines))
        self.assertEqual([r["temperature"] for r in rows], [0.0, 1.0])
        self.assertAlmostEqual(rows[1]["decode_ratio"], 3.0)
        self.assertIn("| smollm2-135m, sampled at T 1 | f32 | 64+64 | 1 |", report.report(lines))

    def test_without_bandwidth(self):
        line = GENERATE_SAMPLE.splitlines()[2]  # a transformers line: no copy_gbps
        (row,) = report.build_generate_rows(report.parse_lines([line]))
        self.assertIsNone(row["bandwidth_tokens_per_s"])
        self.assertIsNone(row["transformers_of_limit"])
        self.assertIn("copy bandwidth not measured\n", report.report([line]))
        self.assertIsNone(report.load_range(report.parse_lines([line])))


class GenerateTorchTest(unittest.TestCase):
    def test_parse_batches(self):
        self.assertEqual(generate_torch.parse_batches("1,16,64"), [1, 16, 64])
        for bad in ("", "0", "1,x", "-1"):
            with self.assertRaises(Exception):
                generate_torch.parse_batches(bad)

    def test_first_mismatch(self):
        self.assertIsNone(generate_torch.first_mismatch([1, 2, 3], [1, 2, 3]))
        self.assertEqual(generate_torch.first_mismatch([1, 2, 3], [1, 5, 3]), 1)
        self.assertEqual(generate_torch.first_mismatch([1, 2], [1, 2, 3]), 2)

    def test_result_line(self):
        line = generate_torch.result_line(
            "f32", 2, 64, 10, [0.5, 0.1, 0.2], [2.2, 1.2, 9.0], 1000, tokens=[4, 5, 6], reference=[4, 5, 7]
        )
        self.assertEqual(
            line,
            '{"impl": "transformers", "bench": "generate", "model": "smollm2-135m", "dtype": "f32", "batch": 2, '
            '"prompt_tokens": 64, "new_tokens": 10, "prefill_ms": 200.0, "full_ms": 2200.0, '
            '"prefill_tokens_per_s": 640.0, "decode_tokens_per_s": 10.0, "runs": 3, "weight_bytes": 1000, '
            '"load_1m": null, "greedy_match": false, "greedy_mismatch_at": 2}',
        )
        (record,) = report.parse_lines([line])
        self.assertTrue(report.is_generate(record))
        plain = generate_torch.result_line("f32", 1, 8, 4, [0.1], [0.5], 1000)
        self.assertNotIn("greedy", plain)
        with self.assertRaises(ValueError):
            generate_torch.result_line("f32", 1, 8, 4, [0.5], [0.5], 1000)

    def test_load_tokens(self):
        import json
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            good = os.path.join(folder, "good.json")
            with open(good, "w", encoding="utf-8") as f:
                json.dump({"prompt_ids": [1, 2], "greedy": {"1": [3]}}, f)
            self.assertEqual(generate_torch.load_tokens(good)["greedy"], {"1": [3]})
            bad = os.path.join(folder, "bad.json")
            with open(bad, "w", encoding="utf-8") as f:
                json.dump({"prompt_ids": []}, f)
            with self.assertRaises(ValueError):
                generate_torch.load_tokens(bad)


GRPO_LOOP_SAMPLE = """\
{"meta": {"bench": "grpo-loop", "commit": "abc1234", "cpus": 2}}
{"bench": "grpo_loop", "system": "trl", "round": 1, "info": {"trl": "1.16.0", "prompts": 8, "samples": 8, "max_tokens": 32}}
{"bench": "grpo_loop", "system": "trl", "round": 1, "eval_step": 0, "eval_accuracy": 0.25, "eval_time": 30.0}
{"bench": "grpo_loop", "system": "trl", "round": 1, "step": 1, "step_time": 90.0, "reward": 0.25}
{"bench": "grpo_loop", "system": "trl", "round": 1, "step": 2, "step_time": 40.0, "reward": 0.5}
{"bench": "grpo_loop", "system": "trl", "round": 1, "step": 3, "step_time": 60.0, "reward": 0.75}
{"bench": "grpo_loop", "system": "trl", "round": 1, "eval_step": 3, "eval_accuracy": 0.5, "eval_time": 30.0}
{"bench": "grpo_loop", "system": "grpo", "round": 1, "step": 1, "step_time": 50.0, "reward": 0.125, "time_generation": 10.0, "time_reward": 0.01, "time_train": 38.0, "time_weight_sync": 1.0}
{"bench": "grpo_loop", "system": "grpo", "round": 1, "step": 2, "step_time": 20.0, "reward": 0.25, "time_generation": 4.0, "time_reward": 0.02, "time_train": 15.0, "time_weight_sync": 0.5}
{"bench": "grpo_loop", "system": "grpo", "round": 1, "step": 3, "step_time": 30.0, "reward": 0.5, "time_generation": 6.0, "time_reward": 0.04, "time_train": 22.0, "time_weight_sync": 1.5}
{"bench": "grpo_loop", "system": "grpo", "round": 1, "eval_step": 0, "eval_accuracy": 0.2, "eval_time": 5.0}
{"bench": "grpo_loop", "system": "trl", "round": 2, "step": 1, "step_time": 80.0, "reward": 0.75}
{"bench": "grpo_loop", "system": "trl", "round": 2, "step": 2, "step_time": 50.0, "reward": 0.5}
{"bench": "grpo_loop", "system": "trl", "round": 2, "step": 3, "step_time": 50.0, "reward": 0.25}
{"bench": "grpo_loop", "system": "grpo", "round": 2, "step": 1, "step_time": 60.0, "reward": 0.375, "time_generation": 12.0, "time_reward": 0.01, "time_train": 45.0, "time_weight_sync": 2.0}
{"bench": "grpo_loop", "system": "grpo", "round": 2, "step": 2, "step_time": 25.0, "reward": 0.25, "time_generation": 5.0, "time_reward": 0.03, "time_train": 19.0, "time_weight_sync": 1.0}
{"bench": "grpo_loop", "system": "grpo", "round": 2, "step": 3, "step_time": 25.0, "reward": 0.0, "time_generation": 5.0, "time_reward": 0.03, "time_train": 19.0, "time_weight_sync": 1.0}
"""


class GrpoLoopReportTest(unittest.TestCase):
    def setUp(self):
        self.records = report.parse_lines(GRPO_LOOP_SAMPLE.splitlines())

    def test_kinds_are_apart(self):
        self.assertEqual(sum(map(report.is_grpo_loop, self.records)), 12)
        self.assertFalse(any(map(report.is_generate, self.records)))
        self.assertFalse(any(map(report.is_train_step, self.records)))
        self.assertFalse(any(map(report.is_model_step, self.records)))
        self.assertFalse(any(report.is_grpo_loop(r) for r in report.parse_lines(GENERATE_SAMPLE.splitlines())))

    def test_summary(self):
        summary = report.build_grpo_loop_summary(self.records)
        trl, grpo = summary["systems"]["trl"], summary["systems"]["grpo"]
        self.assertEqual(trl["median_s"], 50.0)  # steps 2, 3 of both rounds: 40, 60, 50, 50
        self.assertEqual(grpo["median_s"], 25.0)  # 20, 30, 25, 25
        self.assertEqual(trl["first_s"], 85.0)
        self.assertEqual((trl["rounds"], trl["steps"], trl["timed"]), (2, 3, 4))
        self.assertAlmostEqual(summary["ratio"], 2.0)
        self.assertEqual(grpo["split"], {"time_generation": 5.0, "time_reward": 0.03, "time_train": 19.0,
                                         "time_weight_sync": 1.0})
        self.assertEqual(trl["reward_per_step"], {1: 0.5, 2: 0.5, 3: 0.5})
        self.assertEqual(grpo["reward_per_step"], {1: 0.25, 2: 0.25, 3: 0.25})
        self.assertEqual((trl["eval_start"], trl["eval_end"]), (0.25, 0.5))
        self.assertEqual((grpo["eval_start"], grpo["eval_end"]), (0.2, None))
        self.assertIsNone(report.build_grpo_loop_summary(report.parse_lines(SAMPLE.splitlines())))

    def test_table(self):
        table = report.report(GRPO_LOOP_SAMPLE.splitlines())
        self.assertIn("(8 prompts × 8 samples = 64 sequences a step, ≤ 32 new tokens): trl / grpo = 2.00x", table)
        self.assertIn("| trl | 2 | 3 | 50.00 | 85.00 | 0.500 | 25.0% → 50.0% |", table)
        self.assertIn("| grpo | 2 | 3 | 25.00 | 55.00 | 0.250 | 20.0% → n/a |", table)
        self.assertIn("generation 5.00 s (20%), reward 0.03 s (0%), train 19.00 s (76%), weight sync 1.00 s (4%)", table)
        self.assertIn("| 2 | 0.500 | 0.250 |", table)
        self.assertIn("median s/step over steps 2..", table)

    def test_bf16_rows_get_their_own_ratio_and_split(self):
        bf16 = [
            '{"bench": "grpo_loop", "system": "grpo-bf16", "round": 1, "step": %d, "step_time": %s, "reward": 0.5,'
            ' "time_generation": 2.0, "time_reward": 0.01, "time_train": 7.0, "time_weight_sync": 0.5}' % (step, t)
            for step, t in ((1, 30.0), (2, 10.0), (3, 10.0))
        ]
        lines = GRPO_LOOP_SAMPLE.splitlines() + bf16
        summary = report.build_grpo_loop_summary(report.parse_lines(lines))
        self.assertAlmostEqual(summary["ratios"]["grpo-bf16"], 5.0)
        self.assertAlmostEqual(summary["ratio"], 2.0)
        table = report.report(lines)
        self.assertIn("trl / grpo = 2.00x, trl / grpo-bf16 = 5.00x", table)
        self.assertIn("| grpo-bf16 | 1 | 3 | 10.00 | 30.00 | 0.500 | n/a |", table)
        self.assertIn("grpo-bf16 split (medians over the same steps): generation 2.00 s (20%)", table)

    def test_peak_memory_is_the_largest_of_each_system(self):
        lines = [
            '{"bench": "grpo_loop", "system": "%s", "round": 1, "step": %d, "step_time": 10.0, "reward": 0.5,'
            ' "peak_rss_bytes": %d}' % (system, step, peak)
            for system, step, peak in (("trl", 1, 9e9), ("trl", 2, 1.2e10), ("grpo", 1, 4e9), ("grpo", 2, 3e9))
        ]
        summary = report.build_grpo_loop_summary(report.parse_lines(lines))
        self.assertEqual(summary["systems"]["trl"]["peak_rss_gb"], 12.0)
        self.assertEqual(summary["systems"]["grpo"]["peak_rss_gb"], 4.0)
        table = report.report(lines)
        self.assertIn("| trl | 1 | 2 | 10.00 | 10.00 | 0.500 | n/a | 12.00 |", table)
        self.assertIn("| grpo | 1 | 2 | 10.00 | 10.00 | 0.500 | n/a | 4.00 |", table)
        # Lines without it (older runs) report n/a.
        self.assertIn("| grpo | 2 | 3 | 25.00 | 55.00 | 0.250 | 20.0% → n/a | n/a |",
                      report.report(GRPO_LOOP_SAMPLE.splitlines()))

    def test_one_system_one_step(self):
        line = '{"bench": "grpo_loop", "system": "grpo", "round": 1, "step": 1, "step_time": 9.0, "reward": 0.0}'
        summary = report.build_grpo_loop_summary(report.parse_lines([line]))
        self.assertIsNone(summary["ratio"])
        self.assertEqual(summary["systems"]["grpo"]["median_s"], 9.0)
        table = report.report([line])
        self.assertIn("trl / grpo n/a", table)
        self.assertIn("over all steps", table)
        self.assertNotIn("| trl |", table)


class GrpoLoopTrlTest(unittest.TestCase):
    def test_step_line_carries_the_peak(self):
        line = json.loads(grpo_loop_trl.step_line(3, 12.5, 0.25, 2, grpo_loop_trl.peak_rss_bytes()))
        self.assertEqual((line["step"], line["round"], line["step_time"]), (3, 2, 12.5))
        self.assertGreater(line["peak_rss_bytes"], 1 << 20)  # this Python process holds more than 1 MiB
        self.assertNotIn("peak_rss_bytes", json.loads(grpo_loop_trl.step_line(1, 1.0, 0.0)))

    def test_math_score(self):
        self.assertEqual(grpo_loop_trl.math_score("12 + 3 = 15. The answer is 15.", "15"), 1.0)
        self.assertEqual(grpo_loop_trl.math_score("The answer is 15, not 16", "15"), 1.0)
        self.assertEqual(grpo_loop_trl.math_score("97 - 99 = -2", "-2"), 1.0)
        self.assertEqual(grpo_loop_trl.math_score("so 1,050 in all", "1050"), 1.0)
        self.assertEqual(grpo_loop_trl.math_score("It is 7.0", "7"), 1.0)
        self.assertEqual(grpo_loop_trl.math_score("It is 8", "7"), 0.0)
        self.assertEqual(grpo_loop_trl.math_score("no number", "7"), 0.0)
        self.assertEqual(
            grpo_loop_trl.math_reward([[{"role": "assistant", "content": "= 4"}], "5"], answer=["4", "4"]),
            [1.0, 0.0],
        )

    def test_split_is_seeded_and_disjoint(self):
        rows = [{"i": i} for i in range(50)]
        train, held = grpo_loop_trl.split_rows(rows, 10)
        self.assertEqual(len(held), 10)
        self.assertEqual(len(train), 40)
        self.assertFalse({r["i"] for r in train} & {r["i"] for r in held})
        self.assertEqual([r["i"] for r in held], sorted(r["i"] for r in held))  # file order
        self.assertEqual(held, grpo_loop_trl.split_rows(rows, 10)[1])
        self.assertEqual(sorted(grpo_loop_trl.splitmix64_order(50, 0)), list(range(50)))
        with self.assertRaises(ValueError):
            grpo_loop_trl.split_rows(rows, 50)

    def test_batch_layout(self):
        self.assertEqual(grpo_loop_trl.batch_layout(8, 8), (16, 4))
        self.assertEqual(grpo_loop_trl.batch_layout(2, 4), (8, 1))
        self.assertEqual(grpo_loop_trl.batch_layout(3, 2), (2, 3))


if __name__ == "__main__":
    unittest.main()
