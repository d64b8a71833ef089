"""Self-check of report.py and the FLOP counts of train_step_torch.py on made-up lines.

The numbers below are invented round values to check the arithmetic; they are
no measurement. Run: python3 -m unittest discover -s bench -p 'test_*.py'
(needs no torch).
"""

import io
import os
import sys
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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


if __name__ == "__main__":
    unittest.main()
