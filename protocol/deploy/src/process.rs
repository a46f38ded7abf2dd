//! Recovery across the processes of a real cluster (`dmem mn` / `dmem cn`), fabric-neutral.
//!
//! In the simulator a deployment's recovery is a set of simulated tasks
//! ([`Deployment::start_recovery`](crate::Deployment::start_recovery)). Across processes
//! the same protocol machinery runs on real contexts ([`AnyContext`]), split by role:
//!
//! * **every CN** runs the tasks [`Deployment::process_tasks`](crate::Deployment::process_tasks)
//!   returns, beside its coordinators on its own executor: heartbeats to the detector (the
//!   default, for any protocol: the detector's join barrier counts them) and, for a
//!   protocol with recovery across processes, its listener (Pandora: stray-lock
//!   notifications, MN-failure views, pause and acknowledgement);
//! * **the detector CN** drives the [`ProcessRecovery`] that
//!   [`Deployment::process_recovery`](crate::Deployment::process_recovery) returns:
//!   [`detect`](ProcessRecovery::detect) suspects silent CNs,
//!   [`recover`](ProcessRecovery::recover) cuts one off every MN through a
//!   [`MessageLinkTerminator`] and recovers its coordinators from their logs,
//!   [`watch_mns`](ProcessRecovery::watch_mns) handles failed MNs;
//! * **an MN process** answers link-termination requests ([`parse_terminate`],
//!   [`terminated_reply`]) by revoking the CN at its fabric.
//!
//! The caller (the CLI) only manages processes: it makes the contexts, spawns the tasks on
//! its executor, and calls the detector's steps between its own bookkeeping.

use std::future::Future;
use std::pin::Pin;

use dmem_verbs::{Clock, Endpoint, Nanos, NodeId, Port, Verbs, VerbsError};

use crate::{AnyContext, DeployError, RecoveryEvent};

/// A task a deployment hands to the caller's executor (protocol crates never name one).
pub type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

/// A boxed future borrowed from a [`ProcessRecovery`].
pub type StepFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, DeployError>> + 'a>>;

/// CN → MN: revoke CN `u16 LE`; the MN answers [`TERMINATED`] with the same id.
const TERMINATE: &[u8] = b"dmem-terminate";
/// MN → CN: the CN's access is revoked.
const TERMINATED: &[u8] = b"dmem-terminated";
/// A CN's heartbeat for protocols without their own detector (any message from a CN
/// counts as one at the detector's join barrier).
const ALIVE: &[u8] = b"dmem-alive";

/// A CN of a real cluster, as recovery knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMember {
    /// The CN.
    pub cn: NodeId,
    /// The coordinator ids it runs.
    pub coordinators: Vec<u16>,
    /// Where it receives control messages (its listener task's context).
    pub listener: Endpoint,
}

/// How the processes of a real cluster run a protocol's recovery: the same plan in every
/// process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessPlan {
    /// Every CN.
    pub members: Vec<ClusterMember>,
    /// The detector's endpoint (heartbeats, acknowledgements go there).
    pub detector: Endpoint,
    /// Heartbeat period (also the MN probe period and, quartered, the listeners' poll).
    pub heartbeat: Nanos,
    /// Silence after which the detector suspects a CN.
    pub timeout: Nanos,
    /// How long a peer may stay silent to a control message that wants an answer (a link
    /// termination, an MN-failure acknowledgement) before recovery reports it; requests are
    /// re-sent every [`heartbeat`](Self::heartbeat) meanwhile.
    pub answer_timeout: Nanos,
}

impl ProcessPlan {
    /// The member for `cn`, if it is one.
    #[must_use]
    pub fn member(&self, cn: NodeId) -> Option<&ClusterMember> {
        self.members.iter().find(|m| m.cn == cn)
    }
}

/// The contexts a CN process gives its deployment's [`process_tasks`]
/// (crate::Deployment::process_tasks).
#[derive(Debug, Clone)]
pub struct CnContexts {
    /// For heartbeats to the detector.
    pub heartbeat: AnyContext,
    /// For the listener (its endpoint is this CN's [`ClusterMember::listener`]).
    pub listener: AnyContext,
}

/// One MN failure handled by the detector, protocol-neutral.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MnFailure {
    /// The failed MN.
    pub mn: NodeId,
    /// When the detector confirmed it.
    pub detected_at: Nanos,
    /// When the CNs were resumed; `None` while waiting.
    pub resumed_at: Option<Nanos>,
}

/// The detector's side of a protocol's recovery across processes, driven step by step by
/// the caller's loop (which interleaves its own bookkeeping: which CNs finished).
pub trait ProcessRecovery {
    /// Receives pending heartbeats and returns the CNs newly suspected now (each once).
    ///
    /// # Errors
    /// [`DeployError`] if receiving fails.
    fn detect(&mut self) -> Result<Vec<NodeId>, DeployError>;

    /// Recovers suspected CN `cn`: cuts it off every MN, decides its coordinators'
    /// in-flight transactions from their logs, tells the survivors.
    fn recover(&mut self, cn: NodeId) -> StepFuture<'_, ()>;

    /// One MN-watching step: probes the MNs, handles a failed one, resumes the CNs once
    /// they acknowledged (a no-op for protocols without MN-failure handling).
    fn watch_mns(&mut self) -> StepFuture<'_, ()>;

    /// The CN failures recovered so far.
    fn events(&self) -> Vec<RecoveryEvent>;

    /// The MN failures handled so far.
    fn mn_failures(&self) -> Vec<MnFailure> {
        Vec::new()
    }
}

/// Heartbeats of a CN without a protocol detector: a message to `detector` every `period`,
/// for ever (a send that fails while the detector is still starting is retried a period
/// later). The detector's join barrier counts them.
#[must_use]
pub fn alive_task(ctx: AnyContext, detector: Endpoint, period: Nanos) -> LocalTask {
    Box::pin(async move {
        loop {
            let _ = ctx.send(detector, ALIVE).await;
            ctx.sleep(period).await;
        }
    })
}

/// The MN's control endpoint: port 0 of its node.
#[must_use]
pub fn mn_control(mn: NodeId) -> Endpoint {
    Endpoint {
        node: mn,
        port: Port(0),
    }
}

/// The CN a link-termination request names, if `payload` is one.
#[must_use]
pub fn parse_terminate(payload: &[u8]) -> Option<NodeId> {
    let cn = payload.strip_prefix(TERMINATE)?;
    Some(NodeId(u16::from_le_bytes(<[u8; 2]>::try_from(cn).ok()?)))
}

fn with_cn(prefix: &[u8], cn: NodeId) -> Vec<u8> {
    let mut m = prefix.to_vec();
    m.extend_from_slice(&cn.0.to_le_bytes());
    m
}

/// An MN's answer to a link-termination request for `cn`, once `cn` is revoked.
#[must_use]
pub fn terminated_reply(cn: NodeId) -> Vec<u8> {
    with_cn(TERMINATED, cn)
}

/// Active-link termination through the MN processes (Pandora §3.2.2 step 2: the paper's RPC
/// to the MN's management core): a request to the MN's control endpoint ([`mn_control`]),
/// re-sent every `resend` until the MN confirms, for at most `timeout`.
#[derive(Debug, Clone)]
pub struct MessageLinkTerminator {
    ctx: AnyContext,
    resend: Nanos,
    timeout: Nanos,
}

impl MessageLinkTerminator {
    /// Terminates on `ctx` (a context of its own: replies are received there).
    #[must_use]
    pub fn new(ctx: AnyContext, resend: Nanos, timeout: Nanos) -> Self {
        Self {
            ctx,
            resend: resend.max(1),
            timeout,
        }
    }

    /// Revokes `cn`'s access at `mn`; resolves once the MN confirmed.
    ///
    /// # Errors
    /// [`VerbsError::ConnectionLost`] for `mn` if it did not confirm within the timeout (a
    /// dead MN, which MN-failure handling then takes over).
    pub async fn terminate(&self, mn: NodeId, cn: NodeId) -> Result<(), VerbsError> {
        let request = with_cn(TERMINATE, cn);
        let expected = terminated_reply(cn);
        let deadline = self.ctx.now() + self.timeout;
        let mut next_send = self.ctx.now();
        while self.ctx.now() < deadline {
            if self.ctx.now() >= next_send {
                // A send to a dead MN fails: wait for the deadline rather than report at
                // once (the request is re-sent, and the MN may only be slow to accept).
                let _ = self.ctx.send(mn_control(mn), &request).await;
                next_send = self.ctx.now() + self.resend;
            }
            while let Some(msg) = self.ctx.try_recv()? {
                if msg.from.node == mn && msg.payload == expected {
                    return Ok(());
                }
            }
            self.ctx.sleep((self.resend / 8).clamp(1, 1_000_000)).await;
        }
        Err(VerbsError::ConnectionLost { node: mn })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_messages_round_trip_and_reject_garbage() {
        let cn = NodeId(0x1234);
        let req = with_cn(TERMINATE, cn);
        assert_eq!(parse_terminate(&req), Some(cn));
        assert_eq!(parse_terminate(&terminated_reply(cn)), None);
        assert_eq!(parse_terminate(TERMINATE), None);
        assert_eq!(parse_terminate(&req[..req.len() - 1]), None);
        assert_eq!(parse_terminate(b"dmem-quit"), None);
    }
}
