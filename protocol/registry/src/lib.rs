//! Every transaction protocol of dmem, registered once by name.
//!
//! [`registry`] returns a [`Registry`] with
//!
//! * `ford` — FORD with its six bugs fixed (Pandora §2.3, Table 1);
//! * `occ` — OOCC's OCC baseline (OOCC §II-A, Fig. 3): it *is* FORD with rounds (execution
//!   READ / CAS + READ, validation READs, undo log, commit WRITEs, lock release), so it is
//!   registered as fixed FORD under a second name rather than written twice;
//! * `oocc` — OOCC, the paper's full system (implicit read leases, delayed write locks,
//!   one-op write-unlock, and the lease manager adapting the lease, §VII-A; `dmem-occ`);
//!   `oocc:fixed-lease` keeps its initial 100 µs lease instead;
//! * `drtm` — DrTM's lease-based shared locks (OOCC §II-A baseline, lease 400 µs; `dmem-occ`);
//! * `dslr` — two-phase locking on DSLR ticket locks (OOCC §II-A baseline; `dmem-occ`);
//!   `dslr:skip-roll-forward` plants a recovery bug (redo logs discarded, not rolled forward),
//!   `dslr:oracle` detects crashes with the simulator's oracle instead of heartbeats;
//! * `oocc:PARAM[+PARAM]` — OOCC varied for the figures (initial lease, offset, drift, a
//!   fixed lease instead of the manager, techniques off, a planted bug, the oracle
//!   detector; see [`occ_family`]);
//! * `pandora` — PILL, logging after validation, RDMA recovery (Pandora §3);
//! * `pandora-lock-logging` — Pandora with traditional "log before lock" (Pandora §6.1);
//! * `ford:BUG[+BUG]` — FORD with bugs of Table 1 switched on (`ford:covert-locks`);
//! * `ford:artifact` — FORD posting the commit verbs of FORD's public code where dmem's
//!   FORD posts fewer (lock-word WRITE per replica, flush READ of the backups, release on
//!   the backups; `dmem-ford`'s README, "Artifact's verbs"); combines with bugs;
//! * `pandora:restart=US`, `ford:…+restart=US` — crashed CNs come back US µs after their
//!   failure was detected, with new coordinator ids (Pandora §6.3, Fig. 8's second line);
//! * `motor`, `motor-si` — Motor under SR and SI (LOTUS §2.2, §8; `dmem-motor`);
//! * `lotus`, `lotus-si` — LOTUS under SR and SI (lock disaggregation, lock-first MVCC;
//!   `dmem-lotus`); `lotus:FLAG[+FLAG]` with `si`, `no-sharding`, `no-routing` (§8.3);
//!   on real fabrics each CN process serves its own lock table ([`lotus_process`]);
//! * `dnl-4`, `dnl-2`, `dnl-1` — Dandelion's three commit protocols (Dandelion §4.2.3,
//!   Table 4) on symmetric servers with network batching, hashtable batching and local
//!   reads (`dmem-dandelion`);
//! * `fasst` — the FaSST baseline: Dnl-4's commit with one message per packet, one
//!   hashtable request at a time and no local backup reads (Dandelion §7);
//! * `dnl:P[+FLAG]` — Dandelion varied for the ablation (`dnl:4+no-net-batch`, see
//!   [`DandelionProtocol::parse_flags`]);
//! * `motor:FLAG[+FLAG]` — Motor with switches: `si`, `no-cas` (unsafe, for the LOTUS §2.2
//!   motivation only), `skip-newer-abort` and `recovery-releases-only` (planted bugs for the
//!   litmus suite; the second is what Motor's public code recovers), `oracle` (the
//!   simulator's oracle detects crashes instead of heartbeats), `versions=N`, `restart=US`
//!   (a crashed CN comes back US µs after its failure was detected, once recovered, its
//!   coordinators under their old ids with new transaction ids).
//!
//! `dmem bench --protocol X`, `dmem litmus --protocol X` and the tests look protocols up
//! here; a new protocol adds one `register` line.
//!
//! Every protocol's deployment lives here, out of its protocol crate: the
//! [`Protocol`] and [`Deployment`](dmem_deploy::Deployment) that wire
//! it to the simulated cluster and to the processes of a real one (contexts, tasks, link
//! termination, recovery):
//!
//! * [`ford`]: FORD and Pandora (`dmem-ford`);
//! * [`oocc`]: OOCC, DrTM and DSLR (`dmem-occ`); [`occ_family`]: their registered names;
//! * [`motor`]: Motor (`dmem-motor`);
//! * [`lotus`]: LOTUS on the simulator (`dmem-lotus`), [`lotus_process`]: in the CN
//!   processes of a real cluster (`lotus` depends on `lotus_process`, not the reverse);
//! * [`dandelion`]: Dandelion and FaSST (`dmem-dandelion`);
//! * `mvcc_deploy`: Motor's MVCC store deployed, what Motor and LOTUS share;
//! * `common`: pieces every deployment uses alike (a shared placement, its load refusal).
#![forbid(unsafe_code)]

mod common;
pub mod dandelion;
pub mod ford;
pub mod lotus;
pub mod lotus_process;
pub mod motor;
mod mvcc_deploy;
pub mod occ_family;
pub mod oocc;

use std::sync::Arc;

use dmem_deploy::{Protocol, Registry};
use dmem_ford::{BugSet, ProtocolConfig};

pub use dandelion::DandelionProtocol;
pub use ford::FordProtocol;
pub use lotus::LotusProtocol;
pub use motor::MotorProtocol;
pub use oocc::{OoccDeployment, OoccProtocol};

/// The registry of every protocol dmem implements.
#[must_use]
pub fn registry() -> Registry {
    let mut r = Registry::new();
    let fixed = [
        FordProtocol::new("ford", ProtocolConfig::ford_fixed()),
        // OOCC §II-A's OCC baseline is FORD (Fig. 3): the same protocol under its name.
        FordProtocol::new("occ", ProtocolConfig::ford_fixed()),
        FordProtocol::new("pandora", ProtocolConfig::pandora()),
        FordProtocol::new(
            "pandora-lock-logging",
            ProtocolConfig::pandora_lock_logging(),
        ),
    ];
    for p in fixed {
        // The names above are distinct, so registration cannot fail.
        let _ = r.register(p);
    }
    let _ = r.register(occ_family::oocc());
    let _ = r.register(occ_family::drtm());
    let _ = r.register(occ_family::dslr());
    let _ = r.register_family(
        "ford",
        "ford:BUG[+BUG][+restart=US]",
        Box::new(|params: &str| {
            let (rest, restart) = ford::split_restart(params)?;
            // `artifact` is not a bug: FORD's public code's commit verbs.
            let artifact = rest.contains(&"artifact");
            let bugs: Vec<&str> = rest.into_iter().filter(|p| *p != "artifact").collect();
            let bugs = BugSet::parse(&bugs.join(",")).map_err(|e| e.to_string())?;
            let name = format!("ford:{params}");
            let mut config = ProtocolConfig::ford_with(bugs);
            if artifact {
                config = config.with_artifact_verbs();
            }
            let ford = FordProtocol::new(&name, config);
            Ok(Arc::new(match restart {
                Some(after) => ford.restarting(&name, after),
                None => ford,
            }) as Arc<dyn Protocol>)
        }),
    );
    let _ = r.register_family(
        "pandora",
        "pandora:restart=US",
        Box::new(|params: &str| {
            let (rest, restart) = ford::split_restart(params)?;
            let (Some(after), true) = (restart, rest.is_empty()) else {
                return Err(format!(
                    "unknown pandora switch `{params}` (known: restart=US, the µs after a CN's failure is detected that it comes back)"
                ));
            };
            let name = format!("pandora:{params}");
            Ok(
                Arc::new(FordProtocol::new(&name, ProtocolConfig::pandora()).restarting(&name, after))
                    as Arc<dyn Protocol>,
            )
        }),
    );
    let _ = r.register(MotorProtocol::new("motor", dmem_motor::MotorConfig::sr()));
    let _ = r.register(MotorProtocol::new(
        "motor-si",
        dmem_motor::MotorConfig::si(),
    ));
    let _ = r.register_family(
        "motor",
        "motor:FLAG[+FLAG]",
        Box::new(|params: &str| {
            Ok(Arc::new(MotorProtocol::from_flags(params)?) as Arc<dyn Protocol>)
        }),
    );
    let _ = r.register(LotusProtocol::new("lotus", dmem_lotus::LotusConfig::sr()));
    let _ = r.register(LotusProtocol::new(
        "lotus-si",
        dmem_lotus::LotusConfig::si(),
    ));
    let _ = r.register_family(
        "lotus",
        "lotus:FLAG[+FLAG]",
        Box::new(|params: &str| {
            Ok(Arc::new(LotusProtocol::with_flags(params)?) as Arc<dyn Protocol>)
        }),
    );
    for (name, config) in [
        ("dnl-4", dmem_dandelion::DnlConfig::dnl_4()),
        ("dnl-2", dmem_dandelion::DnlConfig::dnl_2()),
        ("dnl-1", dmem_dandelion::DnlConfig::dnl_1()),
        ("fasst", dmem_dandelion::DnlConfig::fasst()),
    ] {
        let _ = r.register(DandelionProtocol::new(name, config));
    }
    let _ = r.register_family(
        "dnl",
        "dnl:P[+FLAG]",
        Box::new(|params: &str| {
            let cfg = DandelionProtocol::parse_flags(params)?;
            Ok(
                Arc::new(DandelionProtocol::new(&format!("dnl:{params}"), cfg))
                    as Arc<dyn Protocol>,
            )
        }),
    );
    let _ = r.register_family(
        "oocc",
        "oocc:PARAM[+PARAM]",
        Box::new(|params: &str| Ok(Arc::new(occ_family::oocc_with(params)?) as Arc<dyn Protocol>)),
    );
    let _ = r.register_family(
        "dslr",
        "dslr:PARAM[+PARAM]",
        Box::new(|params: &str| Ok(Arc::new(occ_family::dslr_with(params)?) as Arc<dyn Protocol>)),
    );
    r
}

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
