//! Running the `dmem` binary from the CLI's end-to-end tests.

use std::process::{Command, Output};

/// Runs `dmem ARGS` to the end.
pub fn dmem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dmem"))
        .args(args)
        .output()
        .expect("the dmem binary runs")
}

/// The JSON rows of a `--json` run that succeeded (its stderr shown if it did not), without
/// the summary object.
pub fn json_rows(out: &Output) -> Vec<serde_json::Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("one JSON object per line"))
        .filter(|v| v.get("summary").is_none())
        .collect()
}
