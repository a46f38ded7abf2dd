//! `dmem perf --fabric rdma`: closed-loop clients on an RDMA NIC of this host, looped back
//! through the NIC (MN regions and the CN thread's queue pairs on the same device).
//!
//! Built only with the `rdma` feature. It has never run on hardware: the development
//! machines have no RNIC, so what is checked there is the failure path (one line, `no RDMA
//! device found`).

use std::future::Future;
use std::rc::Rc;

use anyhow::{Context as _, ensure};
use dmem_rdma::ChainLimits;
use dmem_rdma::device::{RdmaContext, RdmaDevice};
use dmem_runtime::{Clocked, Executor, monotonic_now};
use dmem_verbs::{
    BatchResult, Endpoint, Message, NodeId, Port, PostList, RemoteAddr, Verbs, VerbsError,
};

use super::{Args, PerfOp, Row, Tally, client, merge};

/// Several clients of one thread share its context (its queue pairs and completion queue).
struct Shared(Rc<RdmaContext>);

impl Verbs for Shared {
    fn local_endpoint(&self) -> Endpoint {
        self.0.local_endpoint()
    }
    fn post(&self, list: PostList) -> impl Future<Output = Result<BatchResult, VerbsError>> {
        self.0.post(list)
    }
    fn send(&self, to: Endpoint, payload: &[u8]) -> impl Future<Output = Result<(), VerbsError>> {
        self.0.send(to, payload)
    }
    fn recv(&self) -> impl Future<Output = Result<Message, VerbsError>> {
        self.0.recv()
    }
    fn try_recv(&self) -> Result<Option<Message>, VerbsError> {
        self.0.try_recv()
    }
}

/// Opens the device first, so that a host without one gets its one line before anything
/// else is set up.
pub(super) fn run_rdma(args: &Args, op: PerfOp, batch: u64) -> anyhow::Result<Row> {
    let device = RdmaDevice::open(None)?;
    ensure!(
        args.cns == 1 && args.threads == 1,
        "--fabric rdma runs one CN thread on this host, looped back through the NIC: use --cns 1 --threads 1 (MN and CN processes across hosts come with the control plane)"
    );
    let slot = u64::from(args.size.div_ceil(64) * 64);
    let memory = usize::try_from(args.mn_memory_mib << 20).context("--mn-memory-mib too large")?;
    let cn_node = NodeId(args.mns);
    let cn = device.context(
        Endpoint {
            node: cn_node,
            port: Port(1),
        },
        ChainLimits::default(),
    )?;
    // Each MN: a registered region and a passive context holding its end of the QP.
    let mut mns = Vec::new();
    for i in 0..args.mns {
        let region = device.register(memory)?;
        let mn = device.context(
            Endpoint {
                node: NodeId(i),
                port: Port(0),
            },
            ChainLimits::default(),
        )?;
        let mn_side = mn.prepare(cn_node, Some(region.descriptor()))?;
        let cn_side = cn.prepare(NodeId(i), None)?;
        mn.connect(&cn_side)?;
        cn.connect(&mn_side)?;
        mns.push((region, mn));
    }
    let cn = Rc::new(cn);
    let mut next_slot = vec![0u64; usize::from(args.mns)];
    let duration = args.duration_ms * 1_000_000;
    let start = monotonic_now() + 1_000_000;
    let warm_up_end = start + duration / 10;
    let end = warm_up_end + duration;
    let executor = Executor::new();
    let tally = Tally::new();
    for c in 0..args.clients {
        let mn = (u64::from(c) % u64::from(args.mns)) as usize;
        let region = mns[mn].0.descriptor();
        let first = &mut next_slot[mn];
        let targets = (0..batch)
            .map(|i| {
                let offset = (*first + i) * slot;
                ensure!(offset + slot <= region.len, "MN region too small");
                Ok(RemoteAddr {
                    node: NodeId(mn as u16),
                    rkey: region.rkey,
                    offset,
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        *first += batch;
        executor.spawn(client(
            Clocked::new(Shared(Rc::clone(&cn))),
            op.kind(),
            args.size,
            targets,
            warm_up_end,
            end,
            Rc::clone(&tally),
        ));
    }
    let cpu = super::sample_cn_cpu(warm_up_end, end)?;
    executor.run();
    let cpu_ns = cpu
        .join()
        .map_err(|_| anyhow::anyhow!("the CPU sampler panicked"))?;
    let (ops, latency) = merge(vec![(tally.ops.get(), tally.latency.borrow().clone())])?;
    ensure!(
        ops > 0,
        "no work request completed in the measured window; raise --duration-ms"
    );
    let kind = op.kind();
    Ok(Row::real_time(
        args,
        "rdma",
        device.name().to_owned(),
        kind,
        batch,
        ops,
        duration,
        &latency,
        cpu_ns,
    ))
}
