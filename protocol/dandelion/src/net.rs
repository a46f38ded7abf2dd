//! The networking layer's packet batching (Dandelion §5.1, §5.3), free of any fabric.
//!
//! Messages are inserted with [`Net::try_insert`] (or [`Net::try_insert_mcast`] for the
//! same message to several destinations) into the packet buffered for their destination and
//! flow; [`Net::take_packets`] turns every buffered packet into one `dmem_layout::rpc`
//! frame of up to [`Net::batch_limit`] messages and at most [`Net::packet_limit`] bytes,
//! ready to be sent as one two-sided message each. [`parse`] checks a received frame.
//!
//! `RunIteration` itself (send every packet, poll, dispatch to the request and response
//! handlers) is [`crate::worker::Worker::run_iteration`], which owns a fabric context and
//! a store. Turning batching off (`batch_limit` 1) makes every message its own packet.

use std::collections::HashMap;

use dmem_layout::LayoutError;
use dmem_layout::rpc::{
    RpcFrame, RpcFrameBuilder, RpcMessageHeader, RpcPacketHeader, RpcPacketInfo,
};
use dmem_verbs::Endpoint;

/// A group of messages that may share a packet (§5.1: execution, commit, recovery).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Flow(pub u8);

impl Flow {
    /// Execution-phase Gets.
    pub const EXECUTION: Flow = Flow(0);
    /// Commit-phase messages.
    pub const COMMIT: Flow = Flow(1);
    /// Recovery messages.
    pub const RECOVERY: Flow = Flow(2);
}

/// One message in a packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg {
    /// Its type.
    pub msg_type: u16,
    /// The request slot (echoed by its response).
    pub slot: u32,
    /// Payload.
    pub payload: Vec<u8>,
}

/// A received and checked packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet {
    /// Sending server.
    pub src_node: u16,
    /// Flow.
    pub flow: Flow,
    /// Responses (else requests).
    pub response: bool,
    /// Sender's epoch.
    pub epoch: u64,
    /// Its messages in order.
    pub messages: Vec<Msg>,
}

#[derive(Debug, Default)]
struct Buffered {
    /// Packets being filled: messages and bytes of each (the last one is open).
    packets: Vec<(Vec<Msg>, usize)>,
}

/// Packets buffered per destination and flow.
#[derive(Debug)]
pub struct Net {
    src_node: u16,
    epoch: u64,
    batch_limit: usize,
    packet_limit: usize,
    max_packets: usize,
    out: HashMap<(Endpoint, Flow, bool), Buffered>,
    order: Vec<(Endpoint, Flow, bool)>,
    sent_packets: u64,
    sent_messages: u64,
    sent_bytes: u64,
}

impl Net {
    /// A layer for server `src_node` at `epoch`: packets of at most `batch_limit` messages and
    /// `packet_limit` bytes, at most `max_packets` buffered requests packets per destination
    /// and flow before [`try_insert`](Self::try_insert) says no (responses are never refused).
    #[must_use]
    pub fn new(
        src_node: u16,
        epoch: u64,
        batch_limit: usize,
        packet_limit: usize,
        max_packets: usize,
    ) -> Self {
        Self {
            src_node,
            epoch,
            batch_limit: batch_limit.max(1),
            packet_limit: packet_limit.max(RpcPacketHeader::LEN + RpcMessageHeader::LEN),
            max_packets: max_packets.max(1),
            out: HashMap::new(),
            order: Vec::new(),
            sent_packets: 0,
            sent_messages: 0,
            sent_bytes: 0,
        }
    }

    /// Messages per packet at most.
    #[must_use]
    pub fn batch_limit(&self) -> usize {
        self.batch_limit
    }

    /// Bytes per packet at most.
    #[must_use]
    pub fn packet_limit(&self) -> usize {
        self.packet_limit
    }

    /// The epoch stamped on packets.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }

    /// Packets, messages and packet bytes (frames, without transport headers) handed out
    /// by [`take_packets`](Self::take_packets) so far.
    #[must_use]
    pub fn sent(&self) -> (u64, u64, u64) {
        (self.sent_packets, self.sent_messages, self.sent_bytes)
    }

    /// Whether nothing is buffered.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    fn insert(&mut self, to: Endpoint, flow: Flow, response: bool, msg: Msg) -> bool {
        let size = RpcMessageHeader::LEN + msg.payload.len();
        if RpcPacketHeader::LEN + size > self.packet_limit {
            return false;
        }
        let key = (to, flow, response);
        let (limit, bytes_limit, max_packets) =
            (self.batch_limit, self.packet_limit, self.max_packets);
        let buf = self.out.entry(key).or_default();
        let fits = buf
            .packets
            .last()
            .is_some_and(|(msgs, bytes)| msgs.len() < limit && bytes + size <= bytes_limit);
        if !fits {
            if !response && buf.packets.len() >= max_packets {
                return false;
            }
            buf.packets.push((Vec::new(), RpcPacketHeader::LEN));
        }
        let last = buf.packets.last_mut().expect("a packet is open");
        last.0.push(msg);
        last.1 += size;
        if !self.order.contains(&key) {
            self.order.push(key);
        }
        true
    }

    /// Appends a request to the packet buffered for `to` in `flow` (`TryInsert`, §5.1), or
    /// says no if that destination's buffers are full or the message can never fit a packet.
    pub fn try_insert(&mut self, to: Endpoint, flow: Flow, msg: Msg) -> bool {
        self.insert(to, flow, false, msg)
    }

    /// Appends the same request to the packets of every destination (`TryInsertMcast`):
    /// all or nothing.
    pub fn try_insert_mcast(&mut self, to: &[Endpoint], flow: Flow, msg: &Msg) -> bool {
        let room = to.iter().all(|d| {
            self.out.get(&(*d, flow, false)).is_none_or(|b| {
                b.packets.len() < self.max_packets
                    || b.packets.last().is_some_and(|(m, bytes)| {
                        m.len() < self.batch_limit
                            && bytes + RpcMessageHeader::LEN + msg.payload.len()
                                <= self.packet_limit
                    })
            })
        });
        room && to.iter().all(|d| self.insert(*d, flow, false, msg.clone()))
    }

    /// Appends a response to the packet of responses buffered for `to`; never refused (a
    /// batch of requests produces a batch of responses, §5.3).
    pub fn insert_response(&mut self, to: Endpoint, flow: Flow, msg: Msg) {
        let ok = self.insert(to, flow, true, msg);
        debug_assert!(ok, "responses are never larger than a packet");
    }

    /// Every buffered packet as a frame, in insertion order of destinations.
    ///
    /// # Errors
    /// A [`LayoutError`] if a frame cannot be built (it cannot: sizes are checked on insert).
    pub fn take_packets(&mut self) -> Result<Vec<(Endpoint, Vec<u8>)>, LayoutError> {
        let mut frames = Vec::new();
        for key in std::mem::take(&mut self.order) {
            let Some(buf) = self.out.remove(&key) else {
                continue;
            };
            let (to, flow, response) = key;
            for (msgs, bytes) in buf.packets {
                let mut frame = vec![0u8; bytes];
                let info = RpcPacketInfo {
                    src_node: self.src_node,
                    flow: flow.0,
                    response,
                    epoch: self.epoch,
                };
                let mut b = RpcFrameBuilder::with_limit(&mut frame, info, bytes)?;
                for m in &msgs {
                    b.push(m.msg_type, m.slot, &m.payload)?;
                }
                let len = b.finish().len();
                debug_assert_eq!(len, bytes);
                self.sent_packets += 1;
                self.sent_messages += msgs.len() as u64;
                self.sent_bytes += bytes as u64;
                frames.push((to, frame));
            }
        }
        Ok(frames)
    }
}

/// Checks and reads a received packet.
///
/// # Errors
/// The frame's [`LayoutError`] (truncated, trailing bytes, bad counts or flags).
pub fn parse(bytes: &[u8]) -> Result<Packet, LayoutError> {
    let frame = RpcFrame::new_checked(bytes)?;
    Ok(Packet {
        src_node: frame.src_node(),
        flow: Flow(frame.flow()),
        response: frame.is_response(),
        epoch: frame.epoch(),
        messages: frame
            .messages()
            .map(|m| Msg {
                msg_type: m.msg_type(),
                slot: m.req_slot(),
                payload: m.payload().to_vec(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmem_verbs::{NodeId, Port};

    fn ep(n: u16) -> Endpoint {
        Endpoint {
            node: NodeId(n),
            port: Port(0),
        }
    }

    fn msg(slot: u32, len: usize) -> Msg {
        Msg {
            msg_type: 1,
            slot,
            payload: vec![slot as u8; len],
        }
    }

    #[test]
    fn batches_per_destination_up_to_the_limit() {
        let mut net = Net::new(0, 7, 4, 4096, 8);
        for i in 0..10 {
            assert!(net.try_insert(ep(1 + (i % 2) as u16), Flow::EXECUTION, msg(i, 12)));
        }
        let frames = net.take_packets().unwrap();
        // 5 messages per destination, at most 4 per packet: 2 packets each.
        assert_eq!(frames.len(), 4);
        let first = parse(&frames[0].1).unwrap();
        assert_eq!(
            (first.epoch, first.messages.len(), first.response),
            (7, 4, false)
        );
        assert_eq!(first.messages[1], msg(2, 12));
        assert_eq!(net.sent(), (4, 10, 2 * (16 + 4 * 20) + 2 * (16 + 20)));
        assert!(net.is_empty());
    }

    #[test]
    fn batching_off_is_one_message_per_packet() {
        let mut net = Net::new(0, 0, 1, 4096, 64);
        for i in 0..3 {
            assert!(net.try_insert(ep(1), Flow::COMMIT, msg(i, 30)));
        }
        assert_eq!(net.take_packets().unwrap().len(), 3);
    }

    #[test]
    fn packet_bytes_bound_batches_and_full_buffers_say_no() {
        // 16-byte header + 3 x (8 + 40) = 160 fits 188; a fourth does not.
        let mut net = Net::new(0, 0, 100, 188, 1);
        for i in 0..3 {
            assert!(net.try_insert(ep(1), Flow::COMMIT, msg(i, 40)));
        }
        assert!(
            !net.try_insert(ep(1), Flow::COMMIT, msg(3, 40)),
            "one packet buffered at most"
        );
        assert!(
            !net.try_insert(ep(2), Flow::COMMIT, msg(0, 200)),
            "can never fit"
        );
        net.insert_response(ep(1), Flow::COMMIT, msg(9, 40));
        let frames = net.take_packets().unwrap();
        assert_eq!(frames.len(), 2);
        assert!(frames.iter().all(|(_, f)| f.len() <= 188));
    }

    #[test]
    fn mcast_is_all_or_nothing() {
        let mut net = Net::new(0, 0, 1, 4096, 1);
        assert!(net.try_insert(ep(2), Flow::COMMIT, msg(0, 8)));
        assert!(!net.try_insert_mcast(&[ep(1), ep(2)], Flow::COMMIT, &msg(1, 8)));
        assert!(net.try_insert_mcast(&[ep(1), ep(3)], Flow::COMMIT, &msg(1, 8)));
        assert_eq!(net.take_packets().unwrap().len(), 3);
    }

    #[test]
    fn garbage_is_refused() {
        assert!(parse(&[1, 2, 3]).is_err());
    }
}
