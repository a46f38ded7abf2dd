//! Recovery's control messages (LOTUS §6): the membership service's notice that a CN
//! failed, on which each survivor fences the CN and releases its locks from its lock
//! states ([`RequestKind::Release`]), and a restarted CN's broadcast that its old
//! transactions are finished, on which each survivor unfences it
//! ([`RequestKind::Rejoin`]). Both are lock-server messages like the lock RPCs: the
//! sender's and receivers' NICs carry them and the receiving cores are charged for them,
//! so the time they take is part of the recovery (or of the restart) that waits for the
//! replies.
//!
//! [`Notice`] is the sender's side as a state machine (what to send, which CNs still owe a
//! reply); [`notify`] is its async shell on a context of its own. The receivers' side is
//! [`crate::serve`].

use dmem_verbs::{Clock, Endpoint, Message, Nanos, Verbs, VerbsError, recv_until};

use crate::LockCluster;
use crate::wire::{Reply, Request, RequestKind};

/// One notice about CN `cn` to the lock server of thread 0 of a set of CNs, as a state
/// machine: [`batch`](Self::batch) says what to (re)send, [`on_message`](Self::on_message)
/// takes what came back, and the notice is over once every CN replied or was declared
/// failed meanwhile. Both kinds are idempotent at the receiver, so a resend is harmless.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    kind: RequestKind,
    cn: u16,
    waiting: Vec<u16>,
}

impl Notice {
    /// `kind` about CN `cn`, to every CN of `to`.
    #[must_use]
    pub fn new(kind: RequestKind, cn: u16, to: &[u16]) -> Self {
        Self {
            kind,
            cn,
            waiting: to.to_vec(),
        }
    }

    /// The messages to send now: one to each CN that has not replied, unless `cluster`
    /// counts it as failed (it is not waited for any more) or names no server for it.
    pub fn batch(&mut self, cluster: &LockCluster) -> Vec<(Endpoint, Vec<u8>)> {
        self.waiting.retain(|&x| !cluster.is_failed(x));
        self.waiting
            .iter()
            .filter_map(|&x| {
                let request = Request {
                    kind: self.kind,
                    cn: self.cn,
                    // The reply names the CN that answers.
                    req: u64::from(x),
                    txn: 0,
                    entries: Vec::new(),
                };
                Some((cluster.server(x, 0)?, request.emit()))
            })
            .collect()
    }

    /// Takes a message received on the notice's context; returns whether it was a reply
    /// to the notice (anything else is the caller's).
    pub fn on_message(&mut self, payload: &[u8]) -> bool {
        let Ok(reply) = Reply::parse(payload) else {
            return false;
        };
        self.waiting.retain(|&x| u64::from(x) != reply.req);
        true
    }

    /// The CNs that have not replied yet.
    #[must_use]
    pub fn waiting(&self) -> &[u16] {
        &self.waiting
    }

    /// Whether every CN replied (or was declared failed).
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// Sends `kind` about CN `cn` to the lock server of thread 0 of every CN of `to` in one
/// batch and waits until each has replied; CNs that have not replied within `timeout` get
/// the message again (messages can be lost; both kinds are idempotent), and a CN declared
/// failed meanwhile is not waited for. `ctx` must be a context of its own (a port whose
/// replies nobody else takes: anything else received there is dropped). Returns the number
/// of messages sent.
///
/// # Errors
/// A failed send.
pub async fn notify<V: Verbs + Clock>(
    ctx: &V,
    cluster: &LockCluster,
    kind: RequestKind,
    cn: u16,
    to: &[u16],
    timeout: Nanos,
) -> Result<u64, VerbsError> {
    notify_passing(ctx, cluster, kind, cn, to, timeout, |_| {}).await
}

/// [`notify`] on a context that others also send to: every message received there that is
/// not a reply to the notice goes to `other` (a failure detector sharing the context counts
/// it as a heartbeat) instead of being dropped.
///
/// # Errors
/// A failed send.
pub async fn notify_passing<V: Verbs + Clock>(
    ctx: &V,
    cluster: &LockCluster,
    kind: RequestKind,
    cn: u16,
    to: &[u16],
    timeout: Nanos,
    mut other: impl FnMut(Message),
) -> Result<u64, VerbsError> {
    let mut notice = Notice::new(kind, cn, to);
    let mut sent = 0;
    while !notice.is_done() {
        let batch = notice.batch(cluster);
        if batch.is_empty() {
            break;
        }
        sent += batch.len() as u64;
        ctx.send_batch(batch).await?;
        let deadline = ctx.now() + timeout;
        while !notice.is_done() {
            // A receive error ends the wait like the deadline.
            let Some(msg) = recv_until(ctx, deadline).await.ok().flatten() else {
                break;
            };
            if !notice.on_message(&msg.payload) {
                other(msg);
            }
        }
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use dmem_verbs::{NodeId, Port};

    use super::*;
    use crate::wire::Status;
    use crate::{CnLocks, Sharding};

    #[test]
    fn a_notice_waits_for_each_reply_and_skips_cns_fenced_meanwhile() {
        let at = |cn: u16| Endpoint {
            node: NodeId(10 + cn),
            port: Port(1000),
        };
        // The view of CN 0's process: its own table, every CN's lock server.
        let own = Arc::new(CnLocks::new(0, 4096));
        let cluster = LockCluster::of_process(
            Arc::clone(&own),
            0,
            4,
            (0..4).map(|cn| vec![at(cn)]).collect(),
            Sharding::new(Vec::new()),
            0,
        );
        let mut notice = Notice::new(RequestKind::Release, 1, &[0, 2, 3]);
        let batch = notice.batch(&cluster);
        assert_eq!(
            batch.iter().map(|(e, _)| *e).collect::<Vec<_>>(),
            vec![at(0), at(2), at(3)]
        );
        let request = Request::parse(&batch[1].1).unwrap();
        assert_eq!(
            (request.kind, request.cn, request.req),
            (RequestKind::Release, 1, 2)
        );
        let reply = |from: u64| {
            Reply {
                req: from,
                status: Status::Granted,
            }
            .emit()
        };
        assert!(
            !notice.on_message(b"dmem-alive"),
            "a heartbeat is not a reply"
        );
        assert!(notice.on_message(&reply(0)));
        assert!(
            notice.on_message(&reply(0)),
            "a duplicate reply changes nothing"
        );
        assert_eq!(notice.waiting(), &[2, 3]);
        // CN 3 failed too (this process's table fenced it): not waited for, not resent.
        own.table.fence(3);
        let again = notice.batch(&cluster);
        assert_eq!(
            again.iter().map(|(e, _)| *e).collect::<Vec<_>>(),
            vec![at(2)]
        );
        assert!(!notice.is_done());
        assert!(notice.on_message(&reply(2)));
        assert!(notice.is_done());
        assert!(notice.batch(&cluster).is_empty());
    }
}
