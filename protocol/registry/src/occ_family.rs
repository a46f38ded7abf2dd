//! The OOCC family of `dmem-occ` (OOCC §II-A, §III–§VII): each protocol is a
//! [`Protocol`](dmem_deploy::Protocol) of that crate, registered here by name.

use dmem_occ::{OoccConfig, OoccProtocol};

/// OOCC with the artifact's lease (100 µs) and offset (1 µs), every technique on.
#[must_use]
pub fn oocc() -> OoccProtocol {
    OoccProtocol::new("oocc", OoccConfig::default())
}
