//! Recovery across the processes of a real cluster (`dmem mn` / `dmem cn`), fabric-neutral.
//!
//! In the simulator a deployment's recovery is a set of simulated tasks
//! ([`SimRecovery::start_recovery`](crate::SimRecovery::start_recovery)). Across processes
//! the same protocol machinery runs on real contexts ([`AnyContext`]), split by role:
//!
//! * **every CN** says which CN it is ([`ProcessDeployment::join_as_cn`](crate::ProcessDeployment::join_as_cn))
//!   before it makes its coordinators, then runs the tasks
//!   [`ProcessDeployment::process_tasks`](crate::ProcessDeployment::process_tasks)
//!   returns, beside its coordinators on its own executor: heartbeats to the detector (the
//!   default, for any protocol: the detector's join barrier counts them), for a
//!   protocol with recovery across processes its listener (Pandora: stray-lock
//!   notifications, MN-failure views, pause and acknowledgement), and for a protocol whose
//!   CNs serve each other its servers on [`CnContexts::services`] (LOTUS's lock tables);
//! * **a CN process on several cores** (one executor and one deployment per core) gives
//!   every core's deployment the same [`CoreGroup`]
//!   ([`ProcessDeployment::join_core`](crate::ProcessDeployment::join_core)); the first core runs the
//!   process tasks, the others the tasks
//!   [`ProcessDeployment::core_tasks`](crate::ProcessDeployment::core_tasks) returns (Pandora: each core's
//!   end of the CN listener, fed through a relay in the group);
//! * **the detector CN** drives the [`ProcessRecovery`] that
//!   [`ProcessDeployment::process_recovery`](crate::ProcessDeployment::process_recovery) returns:
//!   [`detect`](ProcessRecovery::detect) suspects silent CNs,
//!   [`recover`](ProcessRecovery::recover) cuts one off every MN through a
//!   [`MessageLinkTerminator`] and recovers its coordinators from their logs,
//!   [`watch_mns`](ProcessRecovery::watch_mns) handles failed MNs;
//! * **an MN process** answers link-termination requests ([`Termination`]) by revoking
//!   the CN at its fabric.
//!
//! The caller (the CLI) only manages processes: it makes the contexts, spawns the tasks on
//! its executor, and calls the detector's steps between its own bookkeeping.

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::future::Future;
use std::hash::Hasher as _;
use std::io;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

use dmem_layout::bytes::{ByteReader, ByteSink};
use dmem_verbs::{Clock, Endpoint, Nanos, NodeId, Port, Verbs, VerbsError};

use crate::{AnyContext, DeployError, HeartbeatDetector, RecoveredCoordinator, RecoveryEvent};

/// A task a deployment hands to the caller's executor (protocol crates never name one).
pub type LocalTask = Pin<Box<dyn Future<Output = ()>>>;

/// A boxed future borrowed from a [`ProcessRecovery`].
pub type StepFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, DeployError>> + 'a>>;

/// CN → MN: revoke CN `u16 LE`; the MN answers [`TERMINATED`] with the same id
/// ([`Termination`]).
const TERMINATE: &[u8] = b"dmem-terminate";
/// MN → CN: the CN's access is revoked.
const TERMINATED: &[u8] = b"dmem-terminated";
/// A CN's heartbeat for protocols without their own detector (any message from a CN
/// counts as one at the detector's join barrier); the simulator's heartbeats
/// ([`crate::spawn_heartbeat_watch`]) send the same bytes.
pub(crate) const ALIVE: &[u8] = b"dmem-alive";

/// A CN of a real cluster, as recovery knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterMember {
    /// The CN.
    pub cn: NodeId,
    /// The coordinator ids it runs.
    pub coordinators: Vec<u16>,
    /// Where it receives control messages (its listener task's context).
    pub listener: Endpoint,
    /// Where it serves requests of other CNs' coordinators, one endpoint per coordinator
    /// slot: `services[i]` answers the `i`-th coordinator of every other CN (LOTUS §4.1:
    /// the i-th coordinator of one CN talks to the i-th lock server of another). Its
    /// contexts are [`CnContexts::services`]; a protocol whose CNs serve each other
    /// nothing ignores both.
    pub services: Vec<Endpoint>,
}

/// The ports of a CN process of a real cluster, the same in every process (`dmem cn`, and
/// tests that deploy several CNs in one process): coordinators on
/// `FIRST_COORDINATOR..FIRST_COORDINATOR + MAX_CLIENTS`, the fixed ports above them, and the
/// CN's services (LOTUS's lock servers, [`ClusterMember::services`]) from `FIRST_SERVICE`.
pub mod ports {
    use dmem_verbs::Port;

    /// The first coordinator's port; coordinator slot `i` of a CN is on `FIRST_COORDINATOR + i`.
    pub const FIRST_COORDINATOR: u16 = 1;
    /// Most coordinators (clients) one CN process runs.
    pub const MAX_CLIENTS: u16 = 256;
    /// The detector (on the first CN).
    pub const DETECTOR: Port = Port(300);
    /// The link terminator's replies.
    pub const TERMINATOR: Port = Port(301);
    /// "Done" reports.
    pub const DONE: Port = Port(302);
    /// The CN's listener ([`super::ClusterMember::listener`]).
    pub const LISTENER: Port = Port(303);
    /// The heartbeat sender.
    pub const HEARTBEAT: Port = Port(304);
    /// The coordinator that reads the final state.
    pub const FINAL_READER: Port = Port(305);
    /// Tells the MN processes the run is over.
    pub const QUIT_SENDER: Port = Port(306);
    /// The first service port; service `i` of a CN is on `FIRST_SERVICE + i`.
    pub const FIRST_SERVICE: u16 = 1000;

    const _: () = assert!(FIRST_COORDINATOR + MAX_CLIENTS <= DETECTOR.0);
    const _: () = assert!(QUIT_SENDER.0 < FIRST_SERVICE);
    const _: () = assert!(FIRST_SERVICE.checked_add(MAX_CLIENTS).is_some());
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
    /// A directory every CN process of the cluster can read and write, fresh for the run,
    /// for CN-side state that must outlive a CN process ([`DurableSlots`]: Motor's op logs,
    /// which model its UPS-backed DRAM).
    pub state_dir: PathBuf,
}

impl ProcessPlan {
    /// The plan of CNs `cns` (each with its coordinator ids, in order) on the [`ports`]
    /// layout: each CN's listener on [`ports::LISTENER`], `services` service endpoints from
    /// [`ports::FIRST_SERVICE`], the detector on the first CN's [`ports::DETECTOR`].
    ///
    /// # Panics
    /// If `cns` is empty or `services` exceeds [`ports::MAX_CLIENTS`].
    #[must_use]
    pub fn on_ports(
        cns: impl IntoIterator<Item = (NodeId, Vec<u16>)>,
        services: u16,
        heartbeat: Nanos,
        timeout: Nanos,
        answer_timeout: Nanos,
        state_dir: PathBuf,
    ) -> Self {
        assert!(services <= ports::MAX_CLIENTS, "{services} services per CN");
        let at = |node, port| Endpoint { node, port };
        let members: Vec<ClusterMember> = cns
            .into_iter()
            .map(|(cn, coordinators)| ClusterMember {
                cn,
                coordinators,
                listener: at(cn, ports::LISTENER),
                services: (0..services)
                    .map(|i| at(cn, Port(ports::FIRST_SERVICE + i)))
                    .collect(),
            })
            .collect();
        let detector = at(
            members.first().expect("a cluster has a CN").cn,
            ports::DETECTOR,
        );
        Self {
            members,
            detector,
            heartbeat,
            timeout,
            answer_timeout,
            state_dir,
        }
    }

    /// The member for `cn`, if it is one.
    #[must_use]
    pub fn member(&self, cn: NodeId) -> Option<&ClusterMember> {
        self.members.iter().find(|m| m.cn == cn)
    }

    /// `cn`'s index among the members (`0..members.len()`, the same in every process), if
    /// it is one.
    #[must_use]
    pub fn index_of(&self, cn: NodeId) -> Option<u16> {
        self.members
            .iter()
            .position(|m| m.cn == cn)
            .and_then(|i| u16::try_from(i).ok())
    }
}

/// The contexts a CN process gives its deployment's [`process_tasks`](crate::ProcessDeployment::process_tasks).
#[derive(Debug, Clone)]
pub struct CnContexts {
    /// For heartbeats to the detector.
    pub heartbeat: AnyContext,
    /// For the listener (its endpoint is this CN's [`ClusterMember::listener`]).
    pub listener: AnyContext,
    /// For the services this CN offers other CNs that this core serves (messages only):
    /// on a CN on one core, one per endpoint of its [`ClusterMember::services`], in that
    /// order; on several cores the first core's share ([`service_core`]).
    pub services: Vec<ServiceContext>,
}

/// A context on which a CN serves the endpoint `slot` of its [`ClusterMember::services`].
#[derive(Debug, Clone)]
pub struct ServiceContext {
    /// Which endpoint of [`ClusterMember::services`] (the coordinator slot it answers).
    pub slot: usize,
    /// The context, bound to that endpoint.
    pub ctx: AnyContext,
}

/// The core (of `cores`) of a CN process that serves service endpoint `slot`: the core
/// that runs the CN's coordinator of that slot (coordinator `i` runs on core `i mod
/// cores`), so that the `i`-th lock server of LOTUS §4.1 shares its core with the `i`-th
/// coordinator as the paper's coordinator threads do.
#[must_use]
pub fn service_core(slot: usize, cores: usize) -> usize {
    slot % cores.max(1)
}

/// `services`' endpoints that core `core` of `cores` serves, with their slots.
#[must_use]
pub fn services_of_core(
    services: &[Endpoint],
    core: usize,
    cores: usize,
) -> Vec<(usize, Endpoint)> {
    services
        .iter()
        .copied()
        .enumerate()
        .filter(|&(slot, _)| service_core(slot, cores) == core)
        .collect()
}

/// One core of a CN process that runs its coordinators on several cores, one executor each
/// ([`ProcessDeployment::splits_across_cores`](crate::ProcessDeployment::splits_across_cores)): which
/// core, how many, and one value that the deployments of all of them share — the only state
/// that crosses their executors, so `Send + Sync`. A protocol whose CN-side tasks (run by
/// the first core's [`process_tasks`](crate::ProcessDeployment::process_tasks)) update what every
/// core's coordinators read keeps here what carries those updates to the other cores
/// (Pandora: its listener's control messages, `dmem-ford`'s `cores` module).
#[derive(Clone)]
pub struct CoreGroup {
    core: usize,
    cores: usize,
    cell: Arc<OnceLock<Arc<dyn Any + Send + Sync>>>,
}

impl CoreGroup {
    /// The first of `cores` cores (at least one) of a new process-wide group.
    #[must_use]
    pub fn new(cores: usize) -> Self {
        Self {
            core: 0,
            cores: cores.max(1),
            cell: Arc::new(OnceLock::new()),
        }
    }

    /// Core `core` of the same group.
    ///
    /// # Panics
    /// If `core` is not below [`cores`](Self::cores).
    #[must_use]
    pub fn on_core(&self, core: usize) -> Self {
        assert!(core < self.cores, "core {core} of {}", self.cores);
        Self {
            core,
            ..self.clone()
        }
    }

    /// This core (0: the one that runs the CN's process tasks).
    #[must_use]
    pub fn core(&self) -> usize {
        self.core
    }

    /// How many cores the process runs coordinators on.
    #[must_use]
    pub fn cores(&self) -> usize {
        self.cores
    }

    /// The value every core of the group shares, made by `make` on the first core that
    /// asks; `None` if the group already holds a value of another type.
    pub fn shared<T: Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Option<Arc<T>> {
        let any = self.cell.get_or_init(|| Arc::new(make()));
        Arc::clone(any).downcast().ok()
    }
}

impl std::fmt::Debug for CoreGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreGroup")
            .field("core", &self.core)
            .field("cores", &self.cores)
            .finish_non_exhaustive()
    }
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

    /// One round of the detector, the loop every caller runs between its own bookkeeping:
    /// [`detect`](Self::detect), [`recover`](Self::recover) each suspect that `admit`
    /// accepts (a caller skips CNs it knows finished, and notes the others), then
    /// [`watch_mns`](Self::watch_mns). Returns the CNs it recovered.
    fn step<'a>(
        &'a mut self,
        admit: &'a mut dyn FnMut(NodeId) -> bool,
    ) -> StepFuture<'a, Vec<NodeId>> {
        Box::pin(async move {
            let mut recovered = Vec::new();
            for cn in self.detect()? {
                if admit(cn) {
                    self.recover(cn).await?;
                    recovered.push(cn);
                }
            }
            self.watch_mns().await?;
            Ok(recovered)
        })
    }

    /// The MN failures handled so far.
    fn mn_failures(&self) -> Vec<MnFailure> {
        Vec::new()
    }

    /// Whether the decisions of [`events`](Self::events) settle the recovered coordinators'
    /// `Unknown` transactions in the run's history ([`settle_history`](crate::settle_history)),
    /// as the simulator's recovery of the same protocol does; `false` by default (the
    /// checker keeps them undetermined).
    fn settles_history(&self) -> bool {
        false
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

/// A link-termination message (Pandora §3.2.2 step 2): `dmem-terminate` or
/// `dmem-terminated` followed by the CN's id, `u16` little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Termination {
    /// CN → MN's control endpoint ([`mn_control`]): revoke this CN's access.
    Request(NodeId),
    /// MN → the requester: this CN's access is revoked.
    Done(NodeId),
}

/// A payload that is not a [`Termination`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("not a link-termination message")]
pub struct NotTermination;

impl Termination {
    /// The message's payload.
    #[must_use]
    pub fn emit(&self) -> Vec<u8> {
        let (tag, cn) = match *self {
            Termination::Request(cn) => (TERMINATE, cn),
            Termination::Done(cn) => (TERMINATED, cn),
        };
        let mut m = Vec::with_capacity(tag.len() + 2);
        m.put_bytes(tag);
        m.put_u16(cn.0);
        m
    }

    /// The message `payload` carries.
    ///
    /// # Errors
    /// [`NotTermination`] for any other payload.
    pub fn parse(payload: &[u8]) -> Result<Self, NotTermination> {
        // `dmem-terminate` is a prefix of `dmem-terminated`: the lengths tell them apart.
        let cn = |rest: &[u8]| {
            let mut r = ByteReader::new(rest);
            let cn = r.u16().map_err(|_| NotTermination)?;
            r.finish().map_err(|_| NotTermination)?;
            Ok(NodeId(cn))
        };
        match payload.len() {
            n if n == TERMINATE.len() + 2 => Ok(Termination::Request(cn(payload
                .strip_prefix(TERMINATE)
                .ok_or(NotTermination)?)?)),
            n if n == TERMINATED.len() + 2 => Ok(Termination::Done(cn(payload
                .strip_prefix(TERMINATED)
                .ok_or(NotTermination)?)?)),
            _ => Err(NotTermination),
        }
    }
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
        let request = Termination::Request(cn).emit();
        let expected = Termination::Done(cn).emit();
        let deadline = self.ctx.now() + self.timeout;
        let mut next_send = self.ctx.now();
        while self.ctx.now() < deadline {
            if self.ctx.now() >= next_send {
                // An MN that cannot be reached at all (its process is gone) is reported at
                // once; one that is only slow to answer is asked again.
                match self.ctx.send(mn_control(mn), &request).await {
                    Err(VerbsError::ConnectionLost { node }) if node == mn => {
                        return Err(VerbsError::ConnectionLost { node });
                    }
                    _ => {}
                }
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

/// Frame header of a [`DurableSlots`] slot: generation, payload length, checksum.
const SLOT_HEADER: usize = 8 + 4 + 8;

/// Byte slots, one per coordinator id, in files of a directory, that outlive the process
/// writing them: a CN process's state that recovery in another process reads after the
/// writer was killed (Motor's op logs: memory that survives its CN, as Motor's UPS-backed
/// DRAM does). Writes go to the page cache (no `fsync`): they survive the process, not
/// the host, like the DRAM they model.
///
/// Each slot is two files written in turn; each write is one frame (generation, length,
/// FNV-1a checksum, payload) at offset 0, so a write torn by a SIGKILL leaves the other
/// file's frame, the previous value, as the newest valid one.
#[derive(Debug)]
pub struct DurableSlots {
    dir: PathBuf,
    /// Per slot: its two files and the last generation written.
    open: RefCell<HashMap<u16, ([File; 2], u64)>>,
}

impl DurableSlots {
    /// Slots in `dir` (created if missing).
    ///
    /// # Errors
    /// The directory cannot be created.
    pub fn new(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            open: RefCell::new(HashMap::new()),
        })
    }

    fn paths(&self, id: u16) -> [PathBuf; 2] {
        [0, 1].map(|half| self.dir.join(format!("slot-{id}.{half}")))
    }

    /// Starts slot `id` afresh (empty; whatever an earlier run left is gone) for this
    /// process to write.
    ///
    /// # Errors
    /// A file cannot be created.
    pub fn create(&self, id: u16) -> io::Result<()> {
        let [a, b] = self.paths(id);
        let files = [File::create(a)?, File::create(b)?];
        self.open.borrow_mut().insert(id, (files, 0));
        Ok(())
    }

    /// Writes `bytes` as slot `id`'s value ([`create`](Self::create)d first).
    ///
    /// # Errors
    /// The slot was not created here, or the write failed.
    pub fn write(&self, id: u16, bytes: &[u8]) -> io::Result<()> {
        let mut open = self.open.borrow_mut();
        let (files, generation) = open.get_mut(&id).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("slot {id} was not created"),
            )
        })?;
        *generation += 1;
        u32::try_from(bytes.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "slot value over 4 GiB"))?;
        let frame = SlotFrame {
            generation: *generation,
            payload: bytes,
        }
        .emit();
        files[(*generation % 2) as usize].write_all_at(&frame, 0)
    }

    /// The newest intact value of slot `id` (written by any process), `None` if it has none.
    ///
    /// # Errors
    /// A file exists but cannot be read.
    pub fn read(&self, id: u16) -> io::Result<Option<Vec<u8>>> {
        let mut best: Option<(u64, Vec<u8>)> = None;
        for path in self.paths(id) {
            let bytes = match std::fs::read(&path) {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if let Ok(SlotFrame {
                generation,
                payload,
            }) = SlotFrame::parse(&bytes)
                && best.as_ref().is_none_or(|(g, _)| generation > *g)
            {
                best = Some((generation, payload.to_vec()));
            }
        }
        Ok(best.map(|(_, v)| v))
    }
}

fn checksum(generation: u64, bytes: &[u8]) -> u64 {
    let mut h = fnv::FnvHasher::default();
    h.write(&generation.to_le_bytes());
    h.write(bytes);
    h.finish()
}

/// One write of a [`DurableSlots`] slot: `generation u64 | payload length u32 | checksum
/// u64 | payload`, little-endian. A file may hold bytes of an older, longer frame after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotFrame<'a> {
    generation: u64,
    payload: &'a [u8],
}

/// Why a slot file holds no intact frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BadSlotFrame {
    /// The file ends inside the frame (a torn write, or never written).
    Short,
    /// Generation 0 (never written) or a checksum that does not match (a torn write).
    NotIntact,
}

impl<'a> SlotFrame<'a> {
    /// The frame's bytes (the payload's length fits a `u32`: [`DurableSlots::write`]
    /// checks).
    fn emit(&self) -> Vec<u8> {
        let mut frame = Vec::with_capacity(SLOT_HEADER + self.payload.len());
        frame.put_u64(self.generation);
        frame.put_u32(self.payload.len() as u32);
        frame.put_u64(checksum(self.generation, self.payload));
        frame.put_bytes(self.payload);
        frame
    }

    /// The frame at the start of `bytes`, if it is intact.
    fn parse(bytes: &'a [u8]) -> Result<Self, BadSlotFrame> {
        let mut r = ByteReader::new(bytes);
        let short = |_| BadSlotFrame::Short;
        let generation = r.u64().map_err(short)?;
        let len = r.u32().map_err(short)? as usize;
        let sum = r.u64().map_err(short)?;
        let payload = r.bytes(len).map_err(short)?;
        if generation == 0 || checksum(generation, payload) != sum {
            return Err(BadSlotFrame::NotIntact);
        }
        Ok(Self {
            generation,
            payload,
        })
    }
}

/// Recovery of a CN by its coordinators' logs, for protocols whose papers specify no
/// detector (Motor, OOCC, DrTM; `dmem-ford` has Pandora's): a [`HeartbeatDetector`] (any
/// message from a CN on the detector's context counts), link termination at every MN, then the protocol's
/// `recover(ctx, coordinators)` once for the CN's coordinators (in id order; with the
/// virtual time each was decided, which a process does not use).
pub struct LogRecovery<R> {
    protocol: String,
    ctx: AnyContext,
    terminator: MessageLinkTerminator,
    mns: Vec<NodeId>,
    members: Vec<ClusterMember>,
    detector: HeartbeatDetector,
    recover: R,
    events: Rc<RefCell<Vec<RecoveryEvent>>>,
}

impl<R> LogRecovery<R>
where
    R: AsyncFn(&AnyContext, &[u16]) -> Result<Vec<(RecoveredCoordinator, Nanos)>, String>,
{
    /// Watches `plan`'s CNs on `ctx` (the detector's context), cutting a failed one off
    /// every MN of `mns`; recovered CNs are pushed to `events`.
    pub fn new(
        protocol: String,
        ctx: AnyContext,
        terminator: MessageLinkTerminator,
        mns: Vec<NodeId>,
        plan: &ProcessPlan,
        events: Rc<RefCell<Vec<RecoveryEvent>>>,
        recover: R,
    ) -> Self {
        let now = ctx.now();
        // Not the detector's own CN: it runs this code, so it is alive, but a loaded host
        // can starve its heartbeat task past the timeout (while a long recovery step runs),
        // and a detector that suspected itself cut its own links and then failed to recover
        // its own coordinators through them.
        let me = ctx.node();
        Self {
            protocol,
            terminator,
            mns,
            members: plan.members.clone(),
            detector: HeartbeatDetector::watching(
                plan.timeout,
                plan.members.iter().map(|m| m.cn).filter(|&cn| cn != me),
                now,
            ),
            recover,
            events,
            ctx,
        }
    }

    /// Counts a message from `node` that a protocol's own recovery step received on the
    /// detector's context (LOTUS waits there for the survivors' replies to its failure
    /// notice) as a heartbeat now: any message from a CN is one, and one taken off the
    /// context by that step must not turn into a false suspicion.
    pub fn heard_from(&mut self, node: NodeId) {
        self.detector.heartbeat(node, self.ctx.now());
    }

    fn error(&self, reason: String) -> DeployError {
        DeployError::Protocol {
            protocol: self.protocol.clone(),
            reason,
        }
    }
}

impl<R> ProcessRecovery for LogRecovery<R>
where
    R: AsyncFn(&AnyContext, &[u16]) -> Result<Vec<(RecoveredCoordinator, Nanos)>, String>,
{
    fn detect(&mut self) -> Result<Vec<NodeId>, DeployError> {
        let now = self.ctx.now();
        while let Some(msg) = self.ctx.try_recv().map_err(|e| self.error(e.to_string()))? {
            self.detector.heartbeat(msg.from.node, now);
        }
        Ok(self.detector.suspects(now))
    }

    fn recover(&mut self, cn: NodeId) -> StepFuture<'_, ()> {
        Box::pin(async move {
            let detected_at = self.ctx.now();
            for &mn in &self.mns {
                self.terminator.terminate(mn, cn).await.map_err(|e| {
                    self.error(format!(
                        "MN node {} did not terminate node {}'s link: {e}",
                        mn.0, cn.0
                    ))
                })?;
            }
            let terminated_at = self.ctx.now();
            let mut ids = self
                .members
                .iter()
                .find(|m| m.cn == cn)
                .map(|m| m.coordinators.clone())
                .unwrap_or_default();
            ids.sort_unstable();
            let coordinators = (self.recover)(&self.ctx, &ids)
                .await
                .map_err(|e| self.error(format!("recovering the coordinators {ids:?}: {e}")))?
                .into_iter()
                .map(|(r, _)| r)
                .collect();
            let now = self.ctx.now();
            self.events.borrow_mut().push(RecoveryEvent {
                cn,
                detected_at,
                terminated_at,
                logs_recovered_at: now,
                finished_at: now,
                coordinators,
                scanned_locks: 0,
            });
            Ok(())
        })
    }

    fn watch_mns(&mut self) -> StepFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    fn events(&self) -> Vec<RecoveryEvent> {
        self.events.borrow().clone()
    }

    /// As [`spawn_log_recovery`](crate::spawn_log_recovery) settles the history.
    fn settles_history(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cores_of_a_group_share_one_value_made_once() {
        let first = CoreGroup::new(2);
        let second = first.on_core(1);
        assert_eq!((first.core(), second.core(), second.cores()), (0, 1, 2));
        let made = std::sync::atomic::AtomicUsize::new(0);
        let make = || {
            made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            std::sync::atomic::AtomicU64::new(7)
        };
        let a = second.shared(make).unwrap();
        let b = first.shared(make).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "one value for every core");
        assert_eq!(made.into_inner(), 1);
        // Across threads, as the cores of a CN process are.
        let on_thread = std::thread::spawn(move || {
            second
                .shared(|| unreachable!())
                .map(|v: Arc<std::sync::atomic::AtomicU64>| {
                    v.load(std::sync::atomic::Ordering::Relaxed)
                })
        });
        assert_eq!(on_thread.join().unwrap(), Some(7));
        assert!(first.shared(|| 0_u8).is_none(), "a value of another type");
        assert_eq!(CoreGroup::new(0).cores(), 1);
    }

    #[test]
    fn durable_slots_keep_the_newest_intact_value() {
        let dir = std::env::temp_dir().join(format!("dmem-slots-{}", std::process::id()));
        let slots = DurableSlots::new(&dir).unwrap();
        assert_eq!(slots.read(3).unwrap(), None);
        slots.create(3).unwrap();
        assert_eq!(slots.read(3).unwrap(), None);
        slots.write(3, b"first").unwrap();
        assert_eq!(slots.read(3).unwrap().as_deref(), Some(&b"first"[..]));
        slots.write(3, b"second, longer").unwrap();
        slots.write(3, b"third").unwrap();
        // Another process (here: another handle) reads what this one wrote.
        let reader = DurableSlots::new(&dir).unwrap();
        assert_eq!(reader.read(3).unwrap().as_deref(), Some(&b"third"[..]));
        // A write torn by a kill (the newest frame's tail lost) leaves the previous value.
        let [a, b] = slots.paths(3);
        let newest = if std::fs::read(&a).unwrap()[0] == 3 {
            a
        } else {
            b
        };
        let bytes = std::fs::read(&newest).unwrap();
        std::fs::write(&newest, &bytes[..bytes.len() - 2]).unwrap();
        assert_eq!(
            reader.read(3).unwrap().as_deref(),
            Some(&b"second, longer"[..])
        );
        // `create` starts afresh.
        slots.create(3).unwrap();
        assert_eq!(reader.read(3).unwrap(), None);
        assert!(slots.write(4, b"x").is_err(), "slot 4 was never created");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_detector_never_suspects_its_own_cn() {
        let shape = crate::ClusterShape {
            mns: 1,
            cns: 2,
            threads: 1,
            seed: 1,
            profile: dmem_sim::NicProfile::named("cx6").unwrap(),
            min_mn_bytes: 1 << 16,
            message_faults: dmem_sim::MessageFaults::default(),
        };
        let sim = shape.build(1 << 16).unwrap();
        let (me, other) = (sim.cn(0), sim.cn(1));
        let ctx = AnyContext::Sim(sim.context(me, 0).unwrap());
        let member = |cn: NodeId, coordinator: u16| ClusterMember {
            cn,
            coordinators: vec![coordinator],
            listener: Endpoint {
                node: cn,
                port: Port(1),
            },
            services: Vec::new(),
        };
        let plan = ProcessPlan {
            members: vec![member(me, 0), member(other, 1)],
            detector: ctx.local_endpoint(),
            heartbeat: 1_000,
            timeout: 10_000,
            answer_timeout: 10_000,
            state_dir: std::env::temp_dir(),
        };
        let terminator = MessageLinkTerminator::new(ctx.clone(), 1_000, 10_000);
        let mut recovery = LogRecovery::new(
            "test".to_owned(),
            ctx,
            terminator,
            vec![sim.mn(0)],
            &plan,
            Rc::default(),
            async |_: &AnyContext,
                   ids: &[u16]|
                   -> Result<Vec<(RecoveredCoordinator, Nanos)>, String> {
                Err(format!("coordinators {ids:?} are not recovered here"))
            },
        );
        // Nobody sends a heartbeat, the detector's own CN included.
        let idle = sim.context(me, 0).unwrap();
        let clock = idle.clone();
        sim.spawn(&idle, async move { clock.sleep(50_000).await });
        sim.run_until_idle();
        assert_eq!(recovery.detect().unwrap(), vec![other]);
        assert_eq!(recovery.detect().unwrap(), Vec::<NodeId>::new());
    }

    #[test]
    fn termination_messages_round_trip_and_reject_garbage() {
        let cn = NodeId(0x1234);
        for m in [Termination::Request(cn), Termination::Done(cn)] {
            let bytes = m.emit();
            assert_eq!(Termination::parse(&bytes), Ok(m));
            for n in 0..bytes.len() {
                // `dmem-terminated` and one byte of an id is `dmem-terminate` and an id
                // starting with `d` (the wire has always been so): any other cut is refused.
                let cut = Termination::parse(&bytes[..n]);
                if n == bytes.len() - 1 && matches!(m, Termination::Done(_)) {
                    assert_eq!(cut, Ok(Termination::Request(NodeId(0x3464))));
                } else {
                    assert_eq!(cut, Err(NotTermination), "{m:?} cut at {n}");
                }
            }
        }
        let req = Termination::Request(cn).emit();
        assert_eq!(&req[..TERMINATE.len()], TERMINATE);
        assert_eq!(&req[TERMINATE.len()..], &[0x34, 0x12]);
        // A request whose id starts with `d` is not a `dmem-terminated`.
        let d = Termination::Request(NodeId(u16::from(b'd')));
        assert_eq!(Termination::parse(&d.emit()), Ok(d));
        assert_eq!(Termination::parse(TERMINATE), Err(NotTermination));
        assert_eq!(Termination::parse(b"dmem-quit"), Err(NotTermination));
        let mut long = req.clone();
        long.push(0);
        assert!(Termination::parse(&long).is_err());
    }

    #[test]
    fn slot_frames_round_trip_and_torn_ones_are_refused() {
        let payload = b"op log".as_slice();
        let f = SlotFrame {
            generation: 3,
            payload,
        };
        let mut bytes = f.emit();
        assert_eq!(bytes.len(), SLOT_HEADER + payload.len());
        assert_eq!(SlotFrame::parse(&bytes), Ok(f));
        for n in 0..bytes.len() {
            assert_eq!(SlotFrame::parse(&bytes[..n]), Err(BadSlotFrame::Short));
        }
        // An older, longer frame's tail after it is ignored.
        bytes.extend_from_slice(b"stale");
        assert_eq!(SlotFrame::parse(&bytes), Ok(f));
        bytes[SLOT_HEADER] ^= 1;
        assert_eq!(SlotFrame::parse(&bytes), Err(BadSlotFrame::NotIntact));
    }
}
