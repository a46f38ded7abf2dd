//! Recovery's control messages (LOTUS §6): the membership service's notice that a CN
//! failed, on which each survivor fences the CN and releases its locks from its lock
//! states ([`RequestKind::Release`]), and a restarted CN's broadcast that its old
//! transactions are finished, on which each survivor unfences it
//! ([`RequestKind::Rejoin`]). Both are lock-server messages like the lock RPCs: the
//! sender's and receivers' NICs carry them and the receiving cores are charged for them,
//! so the time they take is part of the recovery (or of the restart) that waits for the
//! replies.
//!
//! [`notify`] is the sender's side; the receivers' is [`crate::serve`].

use dmem_verbs::{Clock, Nanos, Verbs, VerbsError};

use crate::LockCluster;
use crate::txn::recv_until;
use crate::wire::{Reply, Request, RequestKind};

/// Sends `kind` about CN `cn` to the lock server of thread 0 of every CN of `to` in one
/// batch and waits until each has replied; CNs that have not replied within `timeout` get
/// the message again (messages can be lost; both kinds are idempotent), and a CN declared
/// failed meanwhile is not waited for. `ctx` must be a context of its own (a port whose
/// replies nobody else takes). Returns the number of messages sent.
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
    let mut waiting: Vec<u16> = to.to_vec();
    let mut sent = 0;
    while !waiting.is_empty() {
        waiting.retain(|&x| !cluster.is_failed(x));
        let batch: Vec<_> = waiting
            .iter()
            .filter_map(|&x| {
                let request = Request {
                    kind,
                    cn,
                    // The reply names the CN that answers.
                    req: u64::from(x),
                    txn: 0,
                    entries: Vec::new(),
                };
                Some((cluster.server(x, 0)?, request.encode()))
            })
            .collect();
        if batch.is_empty() {
            break;
        }
        sent += batch.len() as u64;
        ctx.send_batch(batch).await?;
        let deadline = ctx.now() + timeout;
        while !waiting.is_empty() {
            let Some(msg) = recv_until(ctx, deadline).await else {
                break;
            };
            if let Ok(reply) = Reply::parse(&msg.payload) {
                waiting.retain(|&x| u64::from(x) != reply.req);
            }
        }
    }
    Ok(sent)
}
