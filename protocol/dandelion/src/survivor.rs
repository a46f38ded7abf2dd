//! A surviving server's side of recovery (§4.4): what it answers to the leader's `GATHER`
//! (its own state, page by page) and `QUERY` (its coordinators' decisions, its store's
//! versions) — from its own store and coordinators only.

use std::collections::BTreeSet;

use dmem_layout::rpc::{RpcMessageHeader, RpcPacketHeader};
use dmem_txn::TxnId;

use crate::cluster::Cluster;
use crate::store::ServerStore;
use crate::wire::{CoordinatorState, GatheredTxn, Response};

/// What one survivor is asked by a `QUERY`: transactions of its coordinators, keys.
pub type Query = (Vec<TxnId>, Vec<(TxnId, u32, u64)>);

/// The survivor `server`'s answer to a `QUERY` (its coordinators' decisions from
/// `Cluster::decided`, its own store's records) within `budget` bytes: every key, and as
/// many decisions as fit (at least one).
#[must_use]
pub fn answer(
    cluster: &Cluster,
    server: u16,
    store: &ServerStore,
    (txns, keys): &Query,
    budget: usize,
) -> Response {
    let coordinators = cluster.coordinator_server.borrow();
    let decided = cluster.decided.borrow();
    let mut used = 4 + keys.len();
    let mut decisions = Vec::new();
    for txn in txns {
        let d = if coordinators.get(&txn.coordinator.0) == Some(&server) {
            decided.get(txn).map_or(CoordinatorState::Undecided, |w| {
                CoordinatorState::Committed(w.clone())
            })
        } else {
            CoordinatorState::Unknown
        };
        let len = crate::wire::coordinator_len(&d);
        if !decisions.is_empty() && used + len > budget {
            break;
        }
        used += len;
        decisions.push(d);
    }
    Response::Answered {
        decisions,
        written: keys
            .iter()
            .map(|(txn, t, k)| store.written_by(*txn, *t, *k))
            .collect(),
    }
}

/// A survivor's share of recovery (what its `GATHER` replies carry): every transaction it
/// holds log entries of, and every transaction its coordinators are committing
/// (`Cluster::in_commit`) with their decisions — its own store and coordinators only.
#[must_use]
pub fn survivor_state(cluster: &Cluster, server: u16, store: &ServerStore) -> Vec<GatheredTxn> {
    let in_commit = cluster.in_commit[usize::from(server)].borrow();
    let decided = cluster.decided.borrow();
    let txns: BTreeSet<TxnId> = store.log.keys().chain(in_commit.keys()).copied().collect();
    txns.into_iter()
        .map(|txn| GatheredTxn {
            txn,
            coordinator: if in_commit.contains_key(&txn) {
                decided.get(&txn).map_or(CoordinatorState::Undecided, |w| {
                    CoordinatorState::Committed(w.clone())
                })
            } else {
                CoordinatorState::Unknown
            },
            entries: store.gathered(txn),
        })
        .collect()
}

/// Payload bytes a `GATHER` reply may carry for its transactions in a packet of
/// `packet_limit` bytes (packet and message headers, the `more` flag and the count).
#[must_use]
pub fn page_budget(packet_limit: usize) -> usize {
    packet_limit.saturating_sub(RpcPacketHeader::LEN + RpcMessageHeader::LEN + 3)
}

/// The page of `all` (ascending) after `after` that fits `budget` bytes — at least one
/// transaction — and whether more follow.
#[must_use]
pub fn page(
    all: Vec<GatheredTxn>,
    after: Option<TxnId>,
    budget: usize,
) -> (Vec<GatheredTxn>, bool) {
    let mut rest = all
        .into_iter()
        .filter(|t| after.is_none_or(|a| t.txn > a))
        .peekable();
    let mut out = Vec::new();
    let mut used = 0;
    while let Some(t) = rest.peek() {
        let len = t.encoded_len();
        if !out.is_empty() && used + len > budget {
            break;
        }
        used += len;
        out.extend(rest.next());
    }
    let more = rest.peek().is_some();
    (out, more)
}
