//! No input panics the front end: random token soups and mutations of the examples
//! (deleted, duplicated and swapped spans of text, inserted tokens) are checked on both
//! targets, and the verifier must accept every graph that comes out.

use est::elab::Target;
use est::{check, CheckOptions, Program};
use proptest::prelude::*;

const EXAMPLES: &[&str] = &[
    include_str!("../examples/mnist_cnn.est"),
    include_str!("../examples/fc_mnist.est"),
    include_str!("../examples/digits_mlp.est"),
    include_str!("../examples/linear_regression.est"),
];

const TOKENS: &[&str] = &[
    "use",
    "params",
    "fn",
    "input",
    "model",
    "estimator",
    "let",
    "for",
    "in",
    "if",
    "else",
    "train",
    "eval",
    "predict",
    "minimize",
    "with",
    "metric",
    "parse",
    "{",
    "}",
    "(",
    ")",
    "[",
    "]",
    ",",
    ":",
    ";",
    ".",
    "..",
    "=",
    "==",
    "<",
    "+",
    "-",
    "*",
    "/",
    "|>",
    "|",
    "&&",
    "!",
    "x",
    "B",
    "f32",
    "i64",
    "params.batch_size",
    "dense",
    "relu",
    "0",
    "1",
    "-1",
    "3.5",
    "\"s\"",
    "\"{x}\"",
    "#",
    "mode",
    "reshape",
    "batch",
    "repeat",
    "range(4)",
    "99999999999999999999",
];

fn run(text: &str) {
    for target in [Target::Host, Target::Wafer] {
        let program = Program::from_source("prop.est", text, None);
        // A small step budget keeps every case fast; the budget itself is under test.
        let opts = CheckOptions {
            target,
            verify: true,
            max_steps: 200_000,
            ..CheckOptions::default()
        };
        let checked = check(&program, &opts);
        assert!(
            checked.bug.is_none(),
            "compiler bug {:?} on:\n{text}",
            checked.bug
        );
        for d in &checked.diags {
            let file = program.sources.get(d.primary.span.file);
            assert!(
                d.primary.span.hi as usize <= file.text.len(),
                "span past the end of {} on:\n{text}",
                file.name
            );
        }
    }
}

#[derive(Debug, Clone)]
enum Edit {
    Delete(usize, usize),
    Duplicate(usize, usize),
    Insert(usize, usize),
    Swap(usize, usize, usize),
}

fn apply(src: &str, edits: &[Edit]) -> String {
    let mut s: Vec<char> = src.chars().collect();
    for e in edits {
        let n = s.len().max(1);
        match *e {
            Edit::Delete(at, len) => {
                let a = at % n;
                let b = (a + len % 40).min(s.len());
                s.drain(a..b);
            }
            Edit::Duplicate(at, len) => {
                let a = at % n;
                let b = (a + len % 60).min(s.len());
                let piece: Vec<char> = s[a..b].to_vec();
                s.splice(b..b, piece);
            }
            Edit::Insert(at, tok) => {
                let a = at % (s.len() + 1);
                let t: Vec<char> = format!(" {} ", TOKENS[tok % TOKENS.len()])
                    .chars()
                    .collect();
                s.splice(a..a, t);
            }
            Edit::Swap(a, b, len) => {
                let (a, b) = (a % n, b % n);
                let l = len % 20;
                if a + l <= s.len() && b + l <= s.len() && (a + l <= b || b + l <= a) {
                    for i in 0..l {
                        s.swap(a + i, b + i);
                    }
                }
            }
        }
    }
    s.into_iter().collect()
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), any::<usize>()).prop_map(|(a, l)| Edit::Delete(a, l)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, l)| Edit::Duplicate(a, l)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, t)| Edit::Insert(a, t)),
        (any::<usize>(), any::<usize>(), any::<usize>()).prop_map(|(a, b, l)| Edit::Swap(a, b, l)),
    ]
}

fn cases() -> u32 {
    std::env::var("EST_PROP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn token_soup_never_panics(toks in proptest::collection::vec(0..TOKENS.len(), 0..80)) {
        let text: Vec<&str> = toks.iter().map(|&i| TOKENS[i]).collect();
        run(&text.join(" "));
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,300}") {
        run(&text);
    }
}

// Mutated examples in two tests that run side by side, each with half the cases: as many
// programs as one test of all the cases.
proptest! {
    #![proptest_config(ProptestConfig { cases: cases().div_ceil(2), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_examples_never_panic(which in 0..EXAMPLES.len(), edits in proptest::collection::vec(edit(), 1..6)) {
        run(&apply(EXAMPLES[which], &edits));
    }

    #[test]
    fn more_mutated_examples_never_panic(which in 0..EXAMPLES.len(), edits in proptest::collection::vec(edit(), 1..6)) {
        run(&apply(EXAMPLES[which], &edits));
    }
}
