//! The OOCC family of `dmem-occ` (OOCC §II-A, §III–§VII): each protocol is a
//! [`Protocol`](dmem_deploy::Protocol) of that crate, registered here by name.
//!
//! `oocc` is the paper's full system, its adaptive part on: OOCC with the lease manager
//! (§VII-A; [`Policy::default`], from the artifact's 100 µs lease). `oocc:PARAM[+PARAM]`
//! varies it for the figures:
//!
//! | parameter | meaning |
//! |---|---|
//! | `lease=N` | initial lease, µs (default 100) |
//! | `offset=X` | drift offset, µs, fractional allowed (default 1.0) |
//! | `ppm=N` | node clocks drift within ±N ppm (default 100) |
//! | `fixed-lease` | no lease manager: the initial lease holds for the whole run (the lease and offset sweeps, the technique ladder) |
//! | `manager` | the lease manager (on unless `fixed-lease`; kept for older names such as `oocc:lease=2+manager`) |
//! | `period=N` | the lease manager's statistics period, µs (default 200; across processes at least [`PROCESS_PERIOD_NS`](crate::oocc::PROCESS_PERIOD_NS)) |
//! | `no-lease` | no implicit read lease: every read set is validated (Fig. 11 ladder) |
//! | `no-delayed-lock` | write lock at execution instead of the intention lock (Fig. 11) |
//! | `no-one-op-unlock` | value WRITE and unlock WRITE in two round trips (Fig. 11) |
//! | `skip-lease-wait` | planted bug: the writer does not wait for the lease |
//! | `oracle` | the simulator's recovery detects a crash with the oracle instead of heartbeats (recovery measured without detection, a lower bound) |
//!
//! `dslr:skip-roll-forward` is DSLR two-phase locking with a planted recovery bug: a crashed
//! coordinator's redo log is discarded instead of rolled forward; `dslr:oracle` as `oocc:oracle`.

use dmem_deploy::Detection;
use dmem_occ::manager::Policy;
use dmem_occ::{DriftModel, OoccConfig};

use crate::oocc::OoccProtocol;

/// OOCC with the artifact's initial lease (100 µs) and offset (1 µs), every technique on,
/// and the lease manager (§VII-A) adapting the lease while it runs.
#[must_use]
pub fn oocc() -> OoccProtocol {
    OoccProtocol::new("oocc", OoccConfig::default()).with_manager(Policy::default())
}

/// DrTM's lease-based shared locks (OOCC §II-A), lease 400 µs.
#[must_use]
pub fn drtm() -> OoccProtocol {
    OoccProtocol::drtm("drtm", dmem_occ::drtm::DrtmConfig::default())
}

/// DSLR two-phase locking (OOCC §II-A): FAA ticket reader-writer locks, queued.
#[must_use]
pub fn dslr() -> OoccProtocol {
    OoccProtocol::dslr("dslr", dmem_occ::dslr2pl::DslrConfig::default())
}

/// `dslr:PARAMS`: `skip-roll-forward`, the planted bug of
/// [`DslrConfig::bug_skip_roll_forward`](dmem_occ::dslr2pl::DslrConfig::bug_skip_roll_forward)
/// (recovery discards redo logs instead of rolling them forward); `oracle`, the oracle
/// detector in the simulator.
///
/// # Errors
/// An unknown parameter.
pub fn dslr_with(params: &str) -> Result<OoccProtocol, String> {
    let mut cfg = dmem_occ::dslr2pl::DslrConfig::default();
    let mut detection = Detection::Heartbeat;
    for p in params.split('+') {
        match p {
            "skip-roll-forward" => cfg.bug_skip_roll_forward = true,
            "oracle" => detection = Detection::Oracle,
            _ => {
                return Err(format!(
                    "unknown parameter `{p}`: use skip-roll-forward, oracle"
                ));
            }
        }
    }
    Ok(OoccProtocol::dslr(&format!("dslr:{params}"), cfg).with_detection(detection))
}

/// `oocc:PARAMS` (see the module docs).
///
/// # Errors
/// An unknown parameter or a bad number.
pub fn oocc_with(params: &str) -> Result<OoccProtocol, String> {
    let mut cfg = OoccConfig::default();
    let mut drift = DriftModel::default();
    let mut manager = true;
    let mut policy = Policy::default();
    let mut detection = Detection::Heartbeat;
    let num = |v: &str| v.parse::<f64>().map_err(|e| format!("`{v}`: {e}"));
    for p in params.split('+') {
        match p.split_once('=') {
            Some(("lease", v)) => cfg.lease_ns = (num(v)? * 1e3) as u64,
            Some(("offset", v)) => cfg.offset_ns = (num(v)? * 1e3) as u64,
            Some(("ppm", v)) => drift.max_ppm = num(v)? as u64,
            Some(("period", v)) => policy.period_ns = ((num(v)? * 1e3) as u64).max(1),
            None if p == "manager" => manager = true,
            None if p == "fixed-lease" => manager = false,
            None if p == "no-lease" => cfg.implicit_lease = false,
            None if p == "no-delayed-lock" => cfg.delayed_lock = false,
            None if p == "no-one-op-unlock" => cfg.one_op_unlock = false,
            None if p == "skip-lease-wait" => cfg.bug_skip_lease_wait = true,
            None if p == "artifact-rw" => cfg.artifact_rw_rules = true,
            None if p == "oracle" => detection = Detection::Oracle,
            _ => {
                return Err(format!(
                    "unknown parameter `{p}`: use lease=µs, offset=µs, ppm=N, fixed-lease, manager, period=µs, no-lease, no-delayed-lock, no-one-op-unlock, skip-lease-wait, artifact-rw, oracle"
                ));
            }
        }
    }
    let mut p = OoccProtocol::new(&format!("oocc:{params}"), cfg)
        .with_drift(drift)
        .with_detection(detection);
    if manager {
        p = p.with_manager(policy);
    }
    Ok(p)
}
