//! The control plane of a cluster run: every message that `dmem cluster`, the MN, CN and
//! server processes exchange, as one [`Control`] enum with [`Control::parse`] and
//! [`Control::emit`], and the `ready NAME` line a node prints on stdout for `dmem cluster`.
//!
//! The messages travel the fabric's two-sided messages, whose payloads come from the
//! network: [`Control::parse`] checks them and says what is wrong in a [`ControlError`]
//! (a node ignores a message it cannot parse, or counts it as a heartbeat where any message
//! from a CN is one). The recovery messages of `dmem-deploy` (heartbeats, link-termination
//! requests and their answers: `dmem_deploy::process`) are that crate's wire and are parsed
//! there.

use dmem_layout::bytes::{ByteReader, ByteSink};

/// A control message of a cluster run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Control {
    /// CN → each MN (`faa` workload) or CN → the first CN (transaction workloads): the CN's
    /// workload is over, with its tally (`faa`: its completed post lists; transactions: its
    /// committed delta of the workload's conserved quantity, see [`Control::cn_done_delta`]).
    CnDone {
        /// The tally's 8 bytes as a `u64` (little-endian on the wire).
        tally: u64,
    },
    /// First CN → every other CN: every CN has joined (its message endpoints are up): the
    /// coordinators may start.
    Go,
    /// First CN → every other CN: every CN finished (or was recovered), so nobody needs the
    /// receiver's services any more: it may exit.
    RunOver,
    /// The first CN or `dmem cluster` → MN: the run is over.
    Quit,
}

/// Why a payload is not a [`Control`] message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ControlError {
    /// The payload starts with no known message tag.
    #[error("not a control message ({len} bytes)")]
    Unknown {
        /// The payload's length.
        len: usize,
    },
    /// The payload has a known tag but not the length of that message.
    #[error("control message `{tag}` of {got} bytes, expected {expected}")]
    BadLength {
        /// The message's tag.
        tag: &'static str,
        /// The length it has.
        got: usize,
        /// The length it must have.
        expected: usize,
    },
}

const CN_DONE: &[u8] = b"dmem-cn-done";
const GO: &[u8] = b"dmem-go";
const RUN_OVER: &[u8] = b"dmem-run-over";
const QUIT: &[u8] = b"dmem-quit";

impl Control {
    /// A transaction CN's [`Control::CnDone`]: its committed `delta` (an `i64`, carried as
    /// its two's-complement bits).
    pub(crate) fn cn_done_delta(delta: i64) -> Self {
        Control::CnDone {
            tally: delta.cast_unsigned(),
        }
    }

    /// The tag a payload of this message starts with.
    fn tag(self) -> &'static [u8] {
        match self {
            Control::CnDone { .. } => CN_DONE,
            Control::Go => GO,
            Control::RunOver => RUN_OVER,
            Control::Quit => QUIT,
        }
    }

    /// The message's payload.
    pub(crate) fn emit(self) -> Vec<u8> {
        let mut payload = Vec::with_capacity(self.tag().len() + 8);
        payload.put_bytes(self.tag());
        if let Control::CnDone { tally } = self {
            payload.put_u64(tally);
        }
        payload
    }

    /// The message `payload` carries.
    ///
    /// # Errors
    /// [`ControlError`] for a payload that is no control message, or one of the wrong
    /// length.
    pub(crate) fn parse(payload: &[u8]) -> Result<Self, ControlError> {
        let exact = |message: Control| {
            let tag = message.tag();
            if payload == tag {
                Ok(message)
            } else {
                Err(ControlError::BadLength {
                    tag: tag_name(tag),
                    got: payload.len(),
                    expected: tag.len(),
                })
            }
        };
        if let Some(tally) = payload.strip_prefix(CN_DONE) {
            let mut r = ByteReader::new(tally);
            let tally = r
                .u64()
                .and_then(|tally| r.finish().map(|()| tally))
                .map_err(|_| ControlError::BadLength {
                    tag: tag_name(CN_DONE),
                    got: payload.len(),
                    expected: CN_DONE.len() + 8,
                })?;
            return Ok(Control::CnDone { tally });
        }
        // `dmem-go` is no prefix of another tag, nor is any other tag of one.
        if payload.starts_with(RUN_OVER) {
            exact(Control::RunOver)
        } else if payload.starts_with(QUIT) {
            exact(Control::Quit)
        } else if payload.starts_with(GO) {
            exact(Control::Go)
        } else {
            Err(ControlError::Unknown { len: payload.len() })
        }
    }
}

/// A tag as text.
fn tag_name(tag: &'static [u8]) -> &'static str {
    // Every tag above is ASCII.
    std::str::from_utf8(tag).unwrap_or("(not text)")
}

/// Tells `dmem cluster` that this node is up (its kill timer and the CNs' start wait for
/// this line on the node's stdout).
pub(crate) fn print_ready(name: &str) {
    println!("ready {name}");
}

/// Whether a node's stdout `line` is its [`print_ready`] line.
pub(crate) fn is_ready_line(line: &str) -> bool {
    line.starts_with("ready ")
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVERY_VARIANT: [Control; 6] = [
        Control::CnDone { tally: 0 },
        Control::CnDone {
            tally: 0x0102_0304_0506_0708,
        },
        Control::CnDone { tally: u64::MAX },
        Control::Go,
        Control::RunOver,
        Control::Quit,
    ];

    #[test]
    fn every_variant_round_trips() {
        for message in EVERY_VARIANT {
            assert_eq!(Control::parse(&message.emit()), Ok(message), "{message:?}");
        }
        let delta = Control::cn_done_delta(-42);
        let Ok(Control::CnDone { tally }) = Control::parse(&delta.emit()) else {
            panic!("a delta round-trips");
        };
        assert_eq!(tally.cast_signed(), -42);
    }

    #[test]
    fn the_wire_is_the_one_of_before() {
        assert_eq!(Control::Quit.emit(), b"dmem-quit");
        assert_eq!(Control::Go.emit(), b"dmem-go");
        assert_eq!(Control::RunOver.emit(), b"dmem-run-over");
        let mut done = b"dmem-cn-done".to_vec();
        done.extend_from_slice(&7u64.to_le_bytes());
        assert_eq!(Control::CnDone { tally: 7 }.emit(), done);
    }

    #[test]
    fn truncations_and_extensions_are_refused() {
        for message in EVERY_VARIANT {
            let payload = message.emit();
            for len in 0..payload.len() {
                assert!(
                    Control::parse(&payload[..len]).is_err(),
                    "{message:?} cut to {len} bytes"
                );
            }
            let mut longer = payload.clone();
            longer.push(0);
            assert!(Control::parse(&longer).is_err(), "{message:?} + 1 byte");
        }
        assert_eq!(
            Control::parse(b"dmem-cn-done\x01\x02"),
            Err(ControlError::BadLength {
                tag: "dmem-cn-done",
                got: 14,
                expected: 20,
            })
        );
    }

    #[test]
    fn garbage_and_other_messages_are_refused() {
        for payload in [
            &b""[..],
            b"\xff\x00\x13",
            b"dmem-alive",
            b"dmem-terminate\x01\x00",
            b"dmem-terminated\x01\x00",
            b"DMEM-QUIT",
            b"ready cn0",
        ] {
            assert_eq!(
                Control::parse(payload),
                Err(ControlError::Unknown { len: payload.len() }),
                "{payload:?}"
            );
        }
        assert!(
            Control::parse(b"dmem-go!")
                .unwrap_err()
                .to_string()
                .contains("dmem-go")
        );
    }

    #[test]
    fn the_ready_line_is_recognized() {
        assert!(is_ready_line("ready mn0"));
        assert!(!is_ready_line("{\"role\":\"cn\"}"));
    }
}
