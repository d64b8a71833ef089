"""Self-check of accelerator_report.py's arithmetic on made-up lines (invented
round values, no measurement). Run: python3 -m unittest discover -s bench -p 'test_*.py'.
"""

import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import accelerator_report  # noqa: E402


def stage(*lines, rc=0):
    return {"ok": rc == 0, "rc": rc, "lines": list(lines)}


STAGES = {
    "env": stage({"tag": "torch-ceilings", "device": "NVIDIA H200", "copy_gbps": 4000.0, "bf16_matmul_tflops": 800.0}),
    "matmul": stage(
        {"tag": "matmul", "dtype": "bf16", "n": 4096, "gflops": 400_000.0},
        {"tag": "matmul", "dtype": "bf16", "n": 8192, "gflops": 600_000.0},
    ),
    "step-135m": stage(
        {"tag": "flops-smollm2-135m", "flops": 30e12},
        {"tag": "grpo-smollm2-135m-bf16", "batch": 16, "seq": 1024, "median_ms": 100.0},
        {"tag": "torch-smollm2-135m-bf16", "median_ms": 150.0},
    ),
    "gen-1b": stage(
        {"tag": "grpo-llama-1b", "batch": 1, "dtype": "bf16", "prefill_tokens_per_s": 1000.0,
         "decode_tokens_per_s": 500.0, "weight_bytes": 2e9},
        {"tag": "torch-llama-1b", "batch": 1, "prefill_tokens_per_s": 500.0, "decode_tokens_per_s": 100.0,
         "greedy_match": True},
    ),
    "run-135m": stage(*[{"tag": "run", "step": s, "step_time": float(s), "time_train": 1.0, "loss": 0.5}
                        for s in (1, 2, 3, 4)]),
    "gen-135m": stage(rc=124),
}


class SummaryTest(unittest.TestCase):
    def test_figures_follow_from_the_lines(self):
        summary = accelerator_report.summarize(STAGES)
        self.assertEqual(summary["ceilings"]["grpo_bf16_tflops"], 600.0)
        self.assertEqual(summary["ceilings"]["datasheet_tflops"]["bf16"], 989.4)
        [step] = summary["model_step"]
        self.assertAlmostEqual(step["grpo_tflops"], 300.0)  # 30 TFLOP in 0.1 s
        self.assertAlmostEqual(step["mfu_of_grpo_matmul"], 0.5)
        self.assertAlmostEqual(step["mfu_of_datasheet"], 300.0 / 989.4)
        self.assertAlmostEqual(step["torch_over_grpo"], 1.5)
        [gen] = summary["generate"]
        self.assertAlmostEqual(gen["bandwidth_limit_tps"], 2000.0)  # 4 TB/s over 2 GB
        self.assertAlmostEqual(gen["bandwidth_fraction"], 0.25)
        self.assertAlmostEqual(gen["decode_grpo_over_torch"], 5.0)
        run = summary["run"]["run-135m"]
        self.assertEqual(run["steps"], 4)
        self.assertEqual(run["step_time"], 3.0)  # the median of steps 2-4
        self.assertEqual(summary["stages_failed"], ["gen-135m"])

    def test_a_cut_off_line_is_skipped_and_the_file_stays_whole(self):
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "accelerator.json")
            lines = os.path.join(tmp, "lines.jsonl")
            with open(lines, "w") as f:
                f.write('{"tag": "matmul", "dtype": "f32", "n": 128, "gflops": 1000.0}\n{"tag": "matm')
            accelerator_report.main([report, "start", "--platform", "cpu", "--quick", "1", "--torch", "0",
                                     "--torch-device", "cpu"])
            accelerator_report.main([report, "stage", "matmul", "--rc", "124", "--seconds", "2.5",
                                     "--lines", lines])
            with open(report) as f:
                data = json.load(f)
            self.assertTrue(data["stages"]["matmul"]["timed_out"])
            self.assertEqual(len(data["stages"]["matmul"]["lines"]), 1)
            self.assertEqual(data["summary"]["ceilings"]["grpo_f32_tflops"], 1.0)


if __name__ == "__main__":
    unittest.main()
