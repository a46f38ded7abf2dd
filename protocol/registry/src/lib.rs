//! Every transaction protocol of dmem, registered once by name.
//!
//! [`registry`] returns a [`Registry`] with
//!
//! * `ford` — FORD with its six bugs fixed (Pandora §2.3, Table 1);
//! * `pandora` — PILL, logging after validation, RDMA recovery (Pandora §3);
//! * `pandora-lock-logging` — Pandora with traditional "log before lock" (Pandora §6.1);
//! * `ford:BUG[+BUG]` — FORD with bugs of Table 1 switched on (`ford:covert-locks`);
//! * `motor`, `motor-si` — Motor under SR and SI (LOTUS §2.2, §8; `dmem-motor`);
//! * `motor:FLAG[+FLAG]` — Motor with switches: `si`, `no-cas` (unsafe, for the LOTUS §2.2
//!   motivation only), `skip-newer-abort` (a planted bug for the litmus suite).
//!
//! `dmem bench --protocol X`, `dmem litmus --protocol X` and the tests look protocols up
//! here; a later protocol (Motor, LOTUS, …) adds one `register` line.
//!
//! [`ford`] holds the FORD/Pandora [`Protocol`](dmem_deploy::Protocol) and
//! [`Deployment`](dmem_deploy::Deployment): the simulator wiring (contexts, tasks, link
//! termination) stays here, out of `dmem-ford`'s protocol modules.
#![forbid(unsafe_code)]

pub mod ford;
pub mod motor;

use std::sync::Arc;

use dmem_deploy::{Protocol, Registry};
use dmem_ford::{BugSet, ProtocolConfig};

pub use ford::FordProtocol;
pub use motor::MotorProtocol;

/// The registry of every protocol dmem implements.
#[must_use]
pub fn registry() -> Registry {
    let mut r = Registry::new();
    let fixed = [
        FordProtocol::new("ford", ProtocolConfig::ford_fixed()),
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
    let _ = r.register_family(
        "ford",
        "ford:BUG[+BUG]",
        Box::new(|params: &str| {
            let bugs = BugSet::parse(&params.replace('+', ",")).map_err(|e| e.to_string())?;
            Ok(Arc::new(FordProtocol::new(
                &format!("ford:{params}"),
                ProtocolConfig::ford_with(bugs),
            )) as Arc<dyn Protocol>)
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
            let cfg = MotorProtocol::parse_flags(params)?;
            Ok(Arc::new(MotorProtocol::new(&format!("motor:{params}"), cfg)) as Arc<dyn Protocol>)
        }),
    );
    r
}

/// The README's example, compiled and run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
