//! OOCC's lease manager (§VII-A) across MN and CN processes: a lease change reaches every
//! CN process (every core of one) while transactions run, and the merged history stays
//! strictly serializable.
//!
//! The initial lease is 5 µs, far below a loopback round trip, so more than a fifth of
//! the read-only transactions run out of it in the manager's first period and it raises
//! the lease at least once within the run.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn dmem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_dmem"))
}

/// The CN reports of a `--json` run, in CN order, once it exited 0 (the checker and the
/// invariants were ok: a failed check exits 1).
fn cn_reports(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["role"] == "cn")
        .collect()
}

/// Every CN applied at least one adjustment's both words (the manager writes the commit
/// word only once every coordinator applied the intermediate one, so a CN's second word is
/// the first adjustment's new lease), the first CN's manager finished at least one, and
/// every CN ends holding the leases of the manager's last word.
fn assert_every_cn_followed(cns: &[Value], count: usize) {
    assert_eq!(cns.len(), count, "{cns:?}");
    let counter = |r: &Value, name: &str| r["counters"][name].as_u64();
    let manager = &cns[0];
    let adjustments = counter(manager, "lease_adjustments").unwrap();
    assert!(adjustments >= 1, "{manager}");
    let lease = counter(manager, "lease_ns").unwrap();
    assert_ne!(lease, 5_000, "{manager}");
    for r in cns {
        let updates = counter(r, "lease_updates").unwrap();
        assert!(
            updates >= 2,
            "{} applied {updates} lease words: {r}",
            r["name"]
        );
        assert!(counter(r, "lease_rv_ns").unwrap() <= counter(r, "lease_ww_ns").unwrap());
        assert!(counter(r, "lease_rv_ns").unwrap() > 4_000, "{r}");
    }
}

/// `dmem bench --fabric FABRIC` of tiny SmallBank on `oocc:lease=5+manager`, 2 CN
/// processes × 3 coordinators, 1 s.
fn bench(fabric: &str) -> Output {
    dmem()
        .args([
            "bench",
            "--fabric",
            fabric,
            "--workload",
            "smallbank",
            "--protocol",
            "oocc:lease=5+manager",
            "--scale",
            "tiny",
            "--cns",
            "2",
            "--threads",
            "1",
            "--coroutines",
            "3",
            "--duration-ms",
            "1000",
            "--json",
        ])
        .output()
        .unwrap()
}

#[test]
fn a_lease_change_reaches_every_cn_process_on_tcp() {
    assert_every_cn_followed(&cn_reports(&bench("tcp")), 2);
}

#[test]
fn a_lease_change_reaches_every_cn_process_on_shm() {
    assert_every_cn_followed(&cn_reports(&bench("shm")), 2);
}

/// Two cores per CN process (one executor and one deployment each): each core's follower
/// picks the lease up for its own coordinators. The report shows the first core's; the
/// other core's followed too, or the manager, which waits for every coordinator of the
/// cluster to acknowledge a word, would not have finished an adjustment.
#[test]
fn a_lease_change_reaches_every_core_of_a_cn_process() {
    let dir = std::env::temp_dir().join(format!("dmem-oocc-lease-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file: PathBuf = dir.join("cluster.toml");
    std::fs::write(
        &file,
        format!(
            r#"fabric = "shm"
socket_dir = "{}"
join_timeout_ms = 60000

[workload]
kind = "smallbank"
protocol = "oocc:lease=5+manager"
scale = "tiny"
duration_ms = 1000
clients = 4
threads = 2
executor = "auto"

[[node]]
name = "mn0"
role = "mn"

[[node]]
name = "cn0"
role = "cn"

[[node]]
name = "cn1"
role = "cn"
"#,
            dir.join("sockets").display()
        ),
    )
    .unwrap();
    let out = dmem()
        .args(["cluster", "--cluster"])
        .arg(&file)
        .arg("--json")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let cns = cn_reports(&out);
    assert!(cns.iter().all(|r| r["threads"] == 2), "{cns:?}");
    assert_every_cn_followed(&cns, 2);
}
