//! Table-driven cases for every built-in reward, with GSM8K ground truths
//! from `fixtures/gsm8k_test_sample.jsonl` (rows of GSM8K test, MIT).

use grpo_reward::builtin::countdown::{ArithmeticConfig, CountdownConfig};
use grpo_reward::builtin::length::{LengthConfig, LengthUnit};
use grpo_reward::builtin::matching::{FormatConfig, MatchConfig, MatchMode, RegexConfig};
use grpo_reward::builtin::math::{MathConfig, answers_equal, extract_answer};
use grpo_reward::expr::evaluate;
use grpo_reward::rational::Rational;
use grpo_reward::{Sample, SampleReward};
use serde_json::json;

fn sample(completion: &str, row: serde_json::Value) -> Sample {
    let serde_json::Value::Object(row) = row else {
        panic!("row must be an object")
    };
    Sample {
        completion: completion.into(),
        row,
        ..Sample::default()
    }
}

fn value(reward: &dyn SampleReward, completion: &str, row: serde_json::Value) -> f32 {
    reward.score_sample(&sample(completion, row)).unwrap().value.unwrap()
}

#[test]
fn math_extracts_each_answer_format() {
    let cases = [
        ("so \\boxed{42} is it", Some("42")),
        ("\\boxed{\\frac{1}{2}} and later \\boxed{7}", Some("7")),
        ("\\boxed{x^{2}}", Some("x^{2}")),
        ("work...\n#### 1,234", Some("1,234")),
        ("Therefore, the answer is: $18.", Some("$18.")),
        ("<think>2+2</think><answer> 4 </answer>", Some("4")),
        ("3 apples then 5 apples, 8 in all", Some("8")),
        ("no numbers here", None),
    ];
    for (completion, expected) in cases {
        assert_eq!(extract_answer(completion).as_deref(), expected, "{completion}");
    }
}

#[test]
fn math_normalizes_before_comparing() {
    let equal = [
        ("1,234", "1234"),
        ("$18.", "18"),
        ("18 dollars", "18"),
        ("\\$5", "5"),
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac{3}{4}", "3/4"),
        ("2.50", "5/2"),
        ("-7", "-7"),
        ("\\text{Paris}", "paris"),
        ("70000", "70,000"),
    ];
    for (answer, truth) in equal {
        assert!(answers_equal(answer, truth), "{answer} vs {truth}");
    }
    let different = [
        ("1,235", "1234"),
        ("0.33", "1/3"),
        ("-7", "7"),
        ("London", "Paris"),
        ("12", "1,2"),
    ];
    for (answer, truth) in different {
        assert!(!answers_equal(answer, truth), "{answer} vs {truth}");
    }
}

#[test]
fn math_scores_gsm8k_rows_in_several_formats() {
    let math = MathConfig::default().build();
    let fixture = include_str!("fixtures/gsm8k_test_sample.jsonl");
    for line in fixture.lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let truth = row["answer"]
            .as_str()
            .unwrap()
            .rsplit("####")
            .next()
            .unwrap()
            .trim()
            .replace(',', "");
        let n: i64 = truth.parse().unwrap();
        let with_commas = |n: i64| {
            let digits = n.abs().to_string();
            let grouped: Vec<String> = digits
                .as_bytes()
                .rchunks(3)
                .rev()
                .map(|c| String::from_utf8_lossy(c).into())
                .collect();
            format!("{}{}", if n < 0 { "-" } else { "" }, grouped.join(","))
        };
        for (m, expected) in [(n, 1.0), (n + 1, 0.0)] {
            let formats = [
                format!("Let me think. \\boxed{{{m}}}"),
                format!("step one\nstep two\n#### {}", with_commas(m)),
                format!("So the answer is ${}.", with_commas(m)),
                format!("She ends with {m} dollars."),
                format!("<answer>{m}</answer>"),
            ];
            for completion in formats {
                assert_eq!(
                    value(&math, &completion, row.clone()),
                    expected,
                    "{completion} vs {truth}"
                );
            }
        }
    }
}

#[test]
fn math_without_its_column_is_an_error() {
    let math = MathConfig::default().build();
    assert!(math.score_sample(&sample("42", json!({"question": "?"}))).is_err());
}

#[test]
fn exact_and_contains_match_the_column() {
    let exact = MatchConfig::default().build(MatchMode::Exact);
    let contains = MatchConfig::default().build(MatchMode::Contains);
    let folded = MatchConfig {
        case_sensitive: false,
        ..MatchConfig::default()
    }
    .build(MatchMode::Exact);
    let cases: [(&dyn SampleReward, &str, &str, f32); 7] = [
        (&exact, " Paris\n", "Paris", 1.0),
        (&exact, "paris", "Paris", 0.0),
        (&exact, "It is Paris", "Paris", 0.0),
        (&folded, "PARIS", "paris", 1.0),
        (&contains, "It is Paris.", "Paris", 1.0),
        (&contains, "It is London.", "Paris", 0.0),
        (&contains, "42 is the number", "42", 1.0),
    ];
    for (reward, completion, answer, expected) in cases {
        assert_eq!(
            value(reward, completion, json!({ "answer": answer })),
            expected,
            "{completion}"
        );
    }
    assert_eq!(
        value(&exact, "42", json!({"answer": 42})),
        1.0,
        "number columns compare as text"
    );
}

#[test]
fn regex_and_format_match_the_completion() {
    let regex = RegexConfig {
        pattern: r"^Answer: \d+$".into(),
        dot_all: false,
    }
    .build("re")
    .unwrap();
    let format = FormatConfig::default().build("format").unwrap();
    let custom = FormatConfig {
        pattern: r"<reasoning>.*</reasoning>\s*<answer>\d+</answer>".into(),
    }
    .build("f")
    .unwrap();
    let cases: [(&dyn SampleReward, &str, f32); 9] = [
        (&regex, "Answer: 12", 1.0),
        (&regex, "Answer: twelve", 0.0),
        (&format, "<think>\nstep\n</think>\n<answer>5</answer>", 1.0),
        (&format, "  <think>x</think><answer>5</answer>\n", 1.0),
        (&format, "<think>x</think><answer>5</answer> trailing", 0.0),
        (&format, "<answer>5</answer>", 0.0),
        (&format, "preamble <think>x</think><answer>5</answer>", 0.0),
        (&custom, "<reasoning>r</reasoning><answer>5</answer>", 1.0),
        (&custom, "<reasoning>r</reasoning><answer>five</answer>", 0.0),
    ];
    for (reward, completion, expected) in cases {
        assert_eq!(value(reward, completion, json!({})), expected, "{completion}");
    }
    assert!(
        RegexConfig {
            pattern: "(".into(),
            dot_all: true
        }
        .build("bad")
        .is_err()
    );
}

#[test]
fn length_applies_dapo_overlong_shaping() {
    let dapo = LengthConfig {
        max_tokens: 10,
        overlong_buffer: 4,
        unit: LengthUnit::Tokens,
    }
    .build()
    .unwrap();
    let hard = LengthConfig {
        max_tokens: 10,
        overlong_buffer: 0,
        unit: LengthUnit::Tokens,
    }
    .build()
    .unwrap();
    let chars = LengthConfig {
        max_tokens: 3,
        overlong_buffer: 0,
        unit: LengthUnit::Chars,
    }
    .build()
    .unwrap();
    let cases: [(&dyn SampleReward, usize, f32); 8] = [
        (&dapo, 0, 0.0),
        (&dapo, 6, 0.0),
        (&dapo, 7, -0.25),
        (&dapo, 8, -0.5),
        (&dapo, 10, -1.0),
        (&dapo, 11, -1.0),
        (&hard, 10, 0.0),
        (&hard, 11, -1.0),
    ];
    for (reward, n, expected) in cases {
        let s = Sample {
            completion: "x".repeat(n),
            completion_ids: vec![0; n],
            ..Sample::default()
        };
        assert_eq!(reward.score_sample(&s).unwrap().value, Some(expected), "{n} tokens");
    }
    assert_eq!(value(&chars, "abcd", json!({})), -1.0);
    assert!(
        dapo.score_sample(&sample("no ids", json!({}))).is_err(),
        "token unit needs token ids"
    );
    assert!(
        LengthConfig {
            max_tokens: 2,
            overlong_buffer: 3,
            unit: LengthUnit::Tokens
        }
        .build()
        .is_err()
    );
}

#[test]
fn countdown_checks_value_and_numbers_used() {
    let countdown = CountdownConfig::default().build();
    let loose = CountdownConfig {
        use_all: false,
        ..CountdownConfig::default()
    }
    .build();
    let row = json!({"target": 24, "nums": [4, 6, 1, 5]});
    let cases: [(&dyn SampleReward, &str, f32); 6] = [
        (&countdown, "<think>try</think><answer>6 / (5 / 4 - 1)</answer>", 1.0),
        (&countdown, "<answer>6 / (1 - 5 / 4)</answer>", 0.0),
        (&countdown, "<answer>(5 - 1) * 6 * 1</answer>", 0.0),
        (&countdown, "<answer>(6 - 5 + 1) * 4 * 3</answer>", 0.0),
        (&loose, "<answer>4 * 6</answer>", 1.0),
        (&countdown, "<answer>4 * 6</answer>", 0.0),
    ];
    for (reward, completion, expected) in cases {
        assert_eq!(value(reward, completion, row.clone()), expected, "{completion}");
    }
    let exact_use = [
        (
            "<answer>(6 - 1 - 5 + 4) * 6</answer>",
            json!({"target": 24, "nums": [6, 1, 5, 4, 6]}),
            1.0,
        ),
        (
            "<answer>6 / (1 - 3 / 4)</answer>",
            json!({"target": 24, "nums": [6, 1, 3, 4]}),
            1.0,
        ),
        (
            "last line is the expression:\n(2 + 3) × 4 = 20",
            json!({"target": 20, "nums": [2, 3, 4]}),
            1.0,
        ),
        ("\\boxed{2 * 10 + 3}", json!({"target": 23, "nums": [2, 10, 3]}), 1.0),
        (
            "<answer>2 * 10 + 2</answer>",
            json!({"target": 22, "nums": [2, 10, 3]}),
            0.0,
        ),
        ("<answer>import os</answer>", json!({"target": 1, "nums": [1]}), 0.0),
        ("<answer>(1 + 2</answer>", json!({"target": 3, "nums": [1, 2]}), 0.0),
        ("<answer>1 / 0</answer>", json!({"target": 1, "nums": [1, 0]}), 0.0),
    ];
    for (completion, row, expected) in exact_use {
        assert_eq!(value(&countdown, completion, row), expected, "{completion}");
    }
}

#[test]
fn arithmetic_compares_exact_values() {
    let arithmetic = ArithmeticConfig::default().build();
    let cases = [
        ("The answer is 7", json!({"answer": 7}), 1.0),
        ("3 + 4 = 7", json!({"answer": "3 + 4"}), 1.0),
        ("\\boxed{\\frac{1}{3}}", json!({"answer": "1/3"}), 1.0),
        ("\\boxed{0.3333}", json!({"answer": "1/3"}), 0.0),
        ("\\boxed{2^10}", json!({"answer": 1024}), 1.0),
        ("The answer is 1,000,000", json!({"answer": "10^6"}), 1.0),
        ("The answer is -2.5", json!({"answer": "-5/2"}), 1.0),
        ("The answer is 8", json!({"answer": 7}), 0.0),
        ("nothing", json!({"answer": 7}), 0.0),
    ];
    for (completion, row, expected) in cases {
        assert_eq!(value(&arithmetic, completion, row), expected, "{completion}");
    }
}

#[test]
fn expressions_evaluate_exactly_and_refuse_the_rest() {
    let r = |n, d| Rational::new(n, d).unwrap();
    let cases = [
        ("1 + 2 * 3", r(7, 1)),
        ("(1 + 2) * 3", r(9, 1)),
        ("2 ^ 3 ^ 2", r(512, 1)),
        ("2 ** 3", r(8, 1)),
        ("-3 - -2", r(-1, 1)),
        ("1 / 3 + 1 / 6", r(1, 2)),
        ("0.1 + 0.2", r(3, 10)),
        ("8 ÷ 2 × 3", r(12, 1)),
        ("2 ^ -2", r(1, 4)),
    ];
    for (text, expected) in cases {
        assert_eq!(evaluate(text).unwrap().value, expected, "{text}");
    }
    assert_eq!(
        evaluate("(4 + 6) * 2").unwrap().numbers,
        vec![r(4, 1), r(6, 1), r(2, 1)]
    );
    let refused = [
        "1 / 0",
        "__import__('os')",
        "1 +",
        "(1",
        "1 2",
        "99999999999999999999 * 99999999999999999999",
        "2 ^ 1000",
        "2 ^ 0.5",
        &"(".repeat(200),
        &"1+".repeat(600),
    ];
    for text in refused {
        assert!(evaluate(text).is_err(), "{text}");
    }
}
