//! `dmem bench hashtable` end to end: `--hasher` both ways and mixed rows with writers, as
//! JSON rows (the bad values are in `bad_inputs.rs`).

#[path = "support/run.rs"]
mod run;

/// The JSON rows of a `dmem bench hashtable --json` run that succeeded.
fn json_rows(args: &[&str]) -> Vec<serde_json::Value> {
    run::json_rows(&run::dmem(args))
}

#[test]
fn hasher_both_ways_and_mixed_rows_with_writers() {
    let rows = json_rows(&[
        "bench",
        "hashtable",
        "--keys",
        "20k",
        "--table",
        "dlht,hashbrown,dashmap,papaya,limit",
        "--threads",
        "1,2",
        "--batch",
        "1,8",
        "--op",
        "get,mixed",
        "--put-pct",
        "50",
        "--hasher",
        "default,mix64",
        "--secs",
        "0.02",
        "--json",
    ]);
    let count = |table: &str, op: &str, hasher: &str, threads: u64| {
        rows.iter()
            .filter(|r| {
                r["table"] == table
                    && r["op"] == op
                    && r["hasher"] == hasher
                    && r["threads"] == threads
            })
            .count()
    };
    // DLHT: one hasher (its own), both batch sizes, both ops, both thread counts.
    assert_eq!(count("dlht", "mixed", "mix64", 2), 2);
    assert_eq!(count("dlht", "get", "default", 1), 0);
    // The comparison tables run once per hasher; hashbrown single-threaded only.
    for hasher in ["default", "mix64"] {
        assert_eq!(count("hashbrown", "mixed", hasher, 1), 1);
        assert_eq!(count("hashbrown", "mixed", hasher, 2), 0);
        for table in ["dashmap", "papaya"] {
            assert_eq!(count(table, "mixed", hasher, 2), 1, "{table} {hasher}");
            assert_eq!(count(table, "get", hasher, 1), 1, "{table} {hasher}");
        }
    }
    // limit: Gets only, DLHT's hash.
    assert_eq!(count("limit", "get", "mix64", 1), 2);
    assert_eq!(count("limit", "mixed", "mix64", 1), 0);
    assert!(rows.iter().all(|r| r["mops"].as_f64().unwrap() > 0.0));
}
