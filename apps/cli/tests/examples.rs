//! The sample files under `examples/` load: every profile file on every command that takes
//! `--profile`, every run file through `--config`, and flags override a run file's.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn files(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .expect("examples folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no files in {dir}");
    v
}

fn dmem(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_dmem"))
        .current_dir(root())
        .args(args)
        .output()
        .expect("the dmem binary runs")
}

#[test]
fn every_profile_file_loads() {
    for f in files("examples/profiles") {
        let p = dmem_cli::common::load_profile(f.to_str().unwrap()).expect("a valid profile");
        assert!(p.rw_mops > 0.0);
    }
}

#[test]
fn a_profile_file_works_on_every_command_that_takes_a_profile() {
    let profile = "examples/profiles/cx3-fdr.toml";
    for args in [
        &["perf", "--duration-ms", "1", "--profile", profile][..],
        &[
            "bench",
            "--scale",
            "tiny",
            "--protocol",
            "ford",
            "--cns",
            "1",
            "--threads",
            "1",
            "--coroutines",
            "2",
            "--duration-ms",
            "1",
            "--profile",
            profile,
        ],
        &[
            "bench",
            "locks",
            "--lock",
            "caslock",
            "--cns",
            "2",
            "--clients",
            "2",
            "--locks",
            "100",
            "--duration-ms",
            "1",
            "--profile",
            profile,
        ],
        &[
            "recover",
            "--scale",
            "tiny",
            "--threads",
            "1",
            "--coroutines",
            "2",
            "--crash-at-ms",
            "1",
            "--duration-ms",
            "3",
            "--detect-timeout-us",
            "500",
            "--heartbeat-us",
            "100",
            "--profile",
            profile,
        ],
    ] {
        let out = dmem(args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("cx3-fdr") || args[0] == "recover",
            "{args:?}: {stdout}"
        );
    }
}

#[test]
fn every_run_file_runs() {
    for f in files("examples/runs") {
        let out = dmem(&["--config", f.to_str().unwrap()]);
        let expect = if f.ends_with("litmus.toml") { 3 } else { 0 };
        assert_eq!(
            out.status.code(),
            Some(expect),
            "{}: {}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn flags_override_the_run_file() {
    let out = dmem(&[
        "--config",
        "examples/runs/perf.toml",
        "--op",
        "read",
        "--batch",
        "2",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 2, "one row and the summary");
    assert_eq!(rows[0]["op"], "read");
    assert_eq!(rows[0]["batch"], 2);
    assert_eq!(rows[0]["profile"], "cx3-fdr");
    assert_eq!(rows[1]["summary"], true);
    assert_eq!(rows[1]["config"]["duration_ms"], 1);
}
