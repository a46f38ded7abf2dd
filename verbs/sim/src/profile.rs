//! NIC cost-model profiles.
//!
//! Every parameter is an input taken from a hardware figure, with its source next to it.
//! They are never tuned to make a paper's result appear. Figures the papers do not
//! give are marked *estimate*; measure your own NIC with perftest and load the result with
//! [`NicProfile::from_toml`] to replace them.

use dmem_verbs::Nanos;
use serde::{Deserialize, Serialize};

/// The cost model of one RDMA NIC and of the CPU work around it.
///
/// All nodes of a simulated cluster share one profile (homogeneous clusters, as in every
/// paper's testbed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicProfile {
    /// Profile name (`cx3`, ...).
    pub name: String,
    /// Link bandwidth per direction, Gbit/s.
    pub link_gbps: f64,
    /// Packets per second the NIC sends or receives per direction, millions. Bounds message
    /// rate and small one-sided ops alike.
    pub packet_rate_mpps: f64,
    /// Responder capacity for READ and WRITE, million ops/s (8-byte ops).
    pub rw_mops: f64,
    /// Processing units that serve READ and WRITE in parallel; each takes
    /// `processing_units / rw_mops` µs per op, so together they serve `rw_mops`. Requests of
    /// different queue pairs overlap, which is why a READ can observe a WRITE that is only
    /// partly in memory (FaRM's and LOTUS §7.1's reason for cacheline versions).
    pub processing_units: u32,
    /// Responder capacity of the atomic unit over all addresses, million ops/s.
    pub atomic_mops: f64,
    /// Atomics on one 8-byte word, million ops/s: the NIC serialises them per address.
    pub same_address_atomic_mops: f64,
    /// One-way latency (NIC pipeline, wire, switch) of a packet, ns.
    pub one_way_latency_ns: Nanos,
    /// Requester CPU per work request (building the work-queue entry), ns.
    pub wr_cpu_ns: Nanos,
    /// Requester CPU per doorbell (the MMIO write that hands a post list to the NIC), ns.
    pub doorbell_cpu_ns: Nanos,
    /// Requester CPU per completion polled from the completion queue, ns.
    pub cqe_cpu_ns: Nanos,
    /// Receiver CPU per two-sided message handled, ns.
    pub msg_rx_cpu_ns: Nanos,
    /// Largest WRITE/SEND payload carried inline in the work-queue entry, bytes.
    pub inline_threshold: u32,
    /// Extra requester-NIC time to DMA-read a payload that is not inline, ns.
    pub payload_fetch_ns: Nanos,
    /// Transport headers per packet, bytes.
    pub header_bytes: u32,
    /// Largest packet payload, bytes (larger ops are split into packets).
    pub mtu: u32,
    /// Time after which a request to a node that does not answer completes with
    /// `ConnectionLost`, ns (the RC retry timeout).
    pub transport_timeout_ns: Nanos,
    /// Largest two-sided message payload, bytes.
    pub max_message_bytes: u32,
    /// Relative jitter `j` of service and wire times, `0 <= j <= 0.5`; 0 (the default) turns
    /// it off. When on, each one-sided op's service time at the responder (READ/WRITE unit,
    /// atomic unit, per-address gap) and each packet's one-way latency (request, response,
    /// message) is multiplied by a factor drawn uniformly from `[1 - j, 1 + j]`: the mean,
    /// hence every throughput ceiling, is unchanged; the standard deviation is `j / √3` of
    /// the mean. Draws come from their own stream seeded by the cluster's seed, so a run stays
    /// a function of its seed and turning jitter on moves no message-fault draw.
    ///
    /// Not a hardware figure but a model option: without it every op of a kind takes exactly
    /// the same time, so closed-loop clients stay phase-locked (p50 = p99). Real NICs vary by
    /// a few percent on an idle network: `ib_send_lat` between two hosts shows a standard
    /// deviation of ≈0.03 µs on ≈1 µs (NVIDIA developer forum, "How does ib_send_lat measure
    /// the latency?", 2023), which `j = 0.05` matches (2.9 %). See the crate README for what
    /// it changes.
    #[serde(default)]
    pub jitter: f64,
}

/// Why a profile was refused.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// No built-in profile has that name.
    #[error("unknown NIC profile `{0}`; known profiles: cx3, cx4, cx5, cx6 (or pass a TOML file)")]
    Unknown(String),
    /// The profile file cannot be read.
    #[error("cannot read NIC profile file {0}")]
    Io(String),
    /// The TOML text does not describe a profile.
    #[error("invalid NIC profile file: {0}")]
    Toml(String),
    /// A parameter is out of range.
    #[error("invalid NIC profile: {0} must be positive")]
    NonPositive(&'static str),
    /// A rate is positive but outside what any NIC does (a run would stall or overflow).
    #[error("invalid NIC profile: {name} = {value} is outside {min}..={max}")]
    OutOfRange {
        /// The parameter.
        name: &'static str,
        /// Its value.
        value: f64,
        /// Smallest value accepted.
        min: f64,
        /// Largest value accepted.
        max: f64,
    },
}

impl NicProfile {
    /// Names of the built-in profiles.
    pub const BUILT_IN: [&'static str; 4] = ["cx3", "cx4", "cx5", "cx6"];

    /// ConnectX-3, 56 Gbit/s FDR InfiniBand: LOTUS's testbed (§8.1).
    ///
    /// Sources: 35 Mops 8-byte WRITE and 2.5 Mops CAS at one responder, perftest, LOTUS §2.2.
    /// ConnectX-3 serialises all atomics in one unit (Kalia et al., ATC'16 §3), so the
    /// same-address rate equals the total. The NIC serves requests on several processing units
    /// (Kalia et al. describe them); their number is an *estimate*. Latency: ≈1.8 µs READ round trip on FDR (Kalia et
    /// al.; *estimate* split into two one-way halves). CPU costs: *estimates* from Kalia et
    /// al.'s PCIe analysis (a doorbell is an uncached MMIO write of a few hundred ns; a WQE a
    /// few tens). eRPC (NSDI'19): ≈10 M small RPCs/s per core ⇒ ≈100 ns per message handled.
    #[must_use]
    pub fn cx3() -> Self {
        Self {
            name: "cx3".into(),
            link_gbps: 56.0,
            packet_rate_mpps: 35.0,
            rw_mops: 35.0,
            processing_units: 4,
            atomic_mops: 2.5,
            same_address_atomic_mops: 2.5,
            one_way_latency_ns: 900,
            wr_cpu_ns: 40,
            doorbell_cpu_ns: 250,
            cqe_cpu_ns: 30,
            msg_rx_cpu_ns: 100,
            inline_threshold: 188,
            payload_fetch_ns: 300,
            header_bytes: 32,
            mtu: 4096,
            transport_timeout_ns: 1_000_000,
            max_message_bytes: 4096,
            jitter: 0.0,
        }
    }

    /// ConnectX-4, 100 Gbit/s EDR InfiniBand: DecLock's testbed (§6).
    ///
    /// Sources: message rate from the vendor brief (150 M msg/s, halved per direction);
    /// atomics: *estimate* — newer NICs spread atomics over several units so different
    /// addresses scale to tens of Mops, while one address stays serialised at ≈2.5 Mops
    /// (Kalia et al., ATC'16, Connect-IB). Other figures as [`cx3`](Self::cx3).
    #[must_use]
    pub fn cx4() -> Self {
        Self {
            name: "cx4".into(),
            link_gbps: 100.0,
            packet_rate_mpps: 75.0,
            rw_mops: 75.0,
            processing_units: 8,
            atomic_mops: 25.0,
            same_address_atomic_mops: 2.5,
            one_way_latency_ns: 800,
            ..Self::cx3()
        }
    }

    /// ConnectX-5, 100 Gbit/s Ethernet (RoCE): Dandelion's testbed (§7).
    ///
    /// Sources: inline limit 188 B (Dandelion §5, footnote, queried from the driver); message
    /// rate from the vendor brief (200 M msg/s, halved per direction); RoCE headers
    /// (Ethernet+IP+UDP+BTH) ≈58 B; atomics *estimate* as [`cx4`](Self::cx4).
    #[must_use]
    pub fn cx5() -> Self {
        Self {
            name: "cx5".into(),
            packet_rate_mpps: 100.0,
            rw_mops: 100.0,
            atomic_mops: 50.0,
            same_address_atomic_mops: 3.0,
            one_way_latency_ns: 700,
            header_bytes: 58,
            ..Self::cx4()
        }
    }

    /// ConnectX-6, 200 Gbit/s: OOCC's testbed (§VI; Pandora uses the 100 Gbit/s part).
    ///
    /// Sources: message rate from the vendor brief (215 M msg/s, halved per direction);
    /// other figures as [`cx5`](Self::cx5) (*estimate*).
    #[must_use]
    pub fn cx6() -> Self {
        Self {
            name: "cx6".into(),
            link_gbps: 200.0,
            packet_rate_mpps: 107.0,
            rw_mops: 107.0,
            atomic_mops: 60.0,
            ..Self::cx5()
        }
    }

    /// A built-in profile by name.
    ///
    /// # Errors
    /// [`ProfileError::Unknown`] for a name that is not built in.
    pub fn named(name: &str) -> Result<Self, ProfileError> {
        match name {
            "cx3" => Ok(Self::cx3()),
            "cx4" => Ok(Self::cx4()),
            "cx5" => Ok(Self::cx5()),
            "cx6" => Ok(Self::cx6()),
            other => Err(ProfileError::Unknown(other.into())),
        }
    }

    /// A built-in profile by name, or else a profile read from the TOML file at that path.
    ///
    /// # Errors
    /// [`ProfileError::Unknown`] for a name that is neither built in nor an existing file,
    /// [`ProfileError::Io`] if the file cannot be read, or the errors of
    /// [`from_toml`](Self::from_toml).
    pub fn load(name_or_path: &str) -> Result<Self, ProfileError> {
        if let Ok(profile) = Self::named(name_or_path) {
            return Ok(profile);
        }
        let path = std::path::Path::new(name_or_path);
        if !path.exists() {
            return Err(ProfileError::Unknown(name_or_path.into()));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| ProfileError::Io(format!("{name_or_path}: {e}")))?;
        Self::from_toml(&text).map_err(|e| match e {
            ProfileError::Toml(msg) => ProfileError::Toml(format!("{name_or_path}: {msg}")),
            other => other,
        })
    }

    /// Parses a profile from TOML (every field required), e.g. one written from your own
    /// perftest measurements.
    ///
    /// # Errors
    /// [`ProfileError::Toml`] on malformed text, [`ProfileError::NonPositive`] on a rate or
    /// size of zero.
    pub fn from_toml(text: &str) -> Result<Self, ProfileError> {
        let profile: Self = toml::from_str(text).map_err(|e| {
            // One line: toml's Display draws the offending line under the message.
            let at = e
                .span()
                .map_or(String::new(), |span| format!(" at byte {}", span.start));
            ProfileError::Toml(format!("{}{at}", e.message().trim_end()))
        })?;
        profile.validate()?;
        Ok(profile)
    }

    /// Checks that every rate and size is positive.
    ///
    /// # Errors
    /// [`ProfileError::NonPositive`] naming the first offending parameter.
    pub fn validate(&self) -> Result<(), ProfileError> {
        let rates = [
            ("link_gbps", self.link_gbps),
            ("packet_rate_mpps", self.packet_rate_mpps),
            ("rw_mops", self.rw_mops),
            ("atomic_mops", self.atomic_mops),
            ("same_address_atomic_mops", self.same_address_atomic_mops),
        ];
        for (name, value) in rates {
            if !(value > 0.0 && value.is_finite()) {
                return Err(ProfileError::NonPositive(name));
            }
            // From a 1 Mbit/s, 1000-ops/s device to 1000x today's NICs: outside that, a
            // work request takes longer than any run or the cost model's nanoseconds round
            // to nothing.
            let (min, max) = (1e-3, 1e6);
            if !(min..=max).contains(&value) {
                return Err(ProfileError::OutOfRange {
                    name,
                    value,
                    min,
                    max,
                });
            }
        }
        if self.processing_units == 0 {
            return Err(ProfileError::NonPositive("processing_units"));
        }
        if self.mtu == 0 {
            return Err(ProfileError::NonPositive("mtu"));
        }
        if self.max_message_bytes == 0 {
            return Err(ProfileError::NonPositive("max_message_bytes"));
        }
        if !(0.0..=0.5).contains(&self.jitter) {
            return Err(ProfileError::OutOfRange {
                name: "jitter",
                value: self.jitter,
                min: 0.0,
                max: 0.5,
            });
        }
        Ok(())
    }

    /// Time one packet of `payload` bytes occupies a link direction: the larger of its
    /// serialisation time and the packet-rate slot.
    pub(crate) fn wire_ns(&self, payload: u64) -> f64 {
        let packets = payload.div_ceil(u64::from(self.mtu)).max(1);
        let bytes = payload + packets * u64::from(self.header_bytes);
        let serialise = bytes as f64 * 8.0 / self.link_gbps;
        let slots = packets as f64 * 1e3 / self.packet_rate_mpps;
        serialise.max(slots)
    }

    /// Time one processing unit spends on a READ or WRITE, ns.
    pub(crate) fn pu_service_ns(&self) -> f64 {
        f64::from(self.processing_units) * 1e3 / self.rw_mops
    }

    pub(crate) fn atomic_service_ns(&self) -> f64 {
        1e3 / self.atomic_mops
    }

    pub(crate) fn same_address_gap_ns(&self) -> f64 {
        1e3 / self.same_address_atomic_mops
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cx3_write_ceiling_is_an_order_of_magnitude_above_cas() {
        let p = NicProfile::cx3();
        let ratio = p.atomic_service_ns() * p.rw_mops / 1e3;
        assert!(ratio > 10.0, "{ratio}");
    }

    #[test]
    fn profiles_round_trip_through_toml() {
        for name in NicProfile::BUILT_IN {
            let p = NicProfile::named(name).unwrap();
            let text = toml::to_string(&p).unwrap();
            assert_eq!(NicProfile::from_toml(&text).unwrap(), p);
        }
    }

    #[test]
    fn load_takes_a_name_or_a_file() {
        assert_eq!(NicProfile::load("cx4").unwrap(), NicProfile::cx4());
        assert!(matches!(
            NicProfile::load("/no/such/profile.toml"),
            Err(ProfileError::Unknown(_))
        ));
        let dir = std::env::temp_dir().join(format!("dmem-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut mine = NicProfile::cx5();
        mine.name = "my-nic".into();
        mine.rw_mops = 42.0;
        let good = dir.join("good.toml");
        std::fs::write(&good, toml::to_string(&mine).unwrap()).unwrap();
        assert_eq!(NicProfile::load(good.to_str().unwrap()).unwrap(), mine);
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "name = \"x\"\n").unwrap();
        let err = NicProfile::load(bad.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("bad.toml") && !err.contains('\n'), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn jitter_is_optional_and_bounded() {
        let mut p = NicProfile::cx5();
        let text = toml::to_string(&p).unwrap().replace("jitter = 0.0\n", "");
        assert!(!text.contains("jitter"));
        assert_eq!(NicProfile::from_toml(&text).unwrap(), p);
        p.jitter = 0.05;
        assert_eq!(p.validate().map_err(|e| e.to_string()), Ok(()));
        p.jitter = 0.6;
        assert!(matches!(
            p.validate(),
            Err(ProfileError::OutOfRange { name: "jitter", .. })
        ));
    }

    #[test]
    fn bad_profiles_are_refused() {
        assert!(matches!(
            NicProfile::named("cx9"),
            Err(ProfileError::Unknown(_))
        ));
        let mut p = NicProfile::cx3();
        p.rw_mops = 0.0;
        let text = toml::to_string(&p).unwrap();
        assert!(matches!(
            NicProfile::from_toml(&text),
            Err(ProfileError::NonPositive("rw_mops"))
        ));
        assert!(matches!(
            NicProfile::from_toml("name = 3"),
            Err(ProfileError::Toml(_))
        ));
    }
}
