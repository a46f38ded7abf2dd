//! The dependency graph (compressed sparse rows, real-time order through time points),
//! strongly connected components and shortest cycles.

use alloc::collections::VecDeque;
use alloc::vec::Vec;

use dmem_verbs::Nanos;

use super::index::{ReadTarget, Status};
use super::report::{Anomaly, Cycle, CycleClass, CycleStep, Dependency};
use super::{Checker, Isolation};
use crate::model::Version;

// Edge kinds, packed in bits 30..32 of an edge word.
const WW: u64 = 0;
const WR: u64 = 1;
const RW: u64 = 2;
const RT: u64 = 3;
pub(super) const NODE_BITS: u32 = 30;
const NODE_MASK: u64 = (1 << NODE_BITS) - 1;
const NO_NODE: u32 = u32::MAX;

fn pack(src: u32, kind: u64, dst: u32) -> u64 {
    (u64::from(src) << 32) | (kind << NODE_BITS) | u64::from(dst)
}
fn edge_kind(e: u64) -> u64 {
    (e >> NODE_BITS) & 3
}
fn edge_dst(e: u64) -> u32 {
    (e & NODE_MASK) as u32
}
fn edge_src(e: u64) -> u32 {
    (e >> 32) as u32
}
fn bit(kind: u64) -> u8 {
    1 << kind
}
fn dep_kind(dep: &Dependency) -> u64 {
    match dep {
        Dependency::WriteWrite { .. } => WW,
        Dependency::WriteRead { .. } => WR,
        Dependency::ReadWrite { .. } => RW,
        Dependency::RealTime { .. } => RT,
    }
}

/// Compressed sparse rows from an edge list: a counting sort by source (linear, no
/// comparison sort of the whole list), then each node's few edges sorted (by kind, then
/// destination) and deduplicated. Returns the offsets and the edges.
fn compress(nodes: u32, raw: Vec<u64>) -> (Vec<usize>, Vec<u64>) {
    let mut offsets = alloc::vec![0usize; nodes as usize + 1];
    for &e in &raw {
        offsets[edge_src(e) as usize + 1] += 1;
    }
    for v in 0..nodes as usize {
        offsets[v + 1] += offsets[v];
    }
    let mut fill = offsets.clone();
    let mut edges = alloc::vec![0u64; raw.len()];
    for &e in &raw {
        let slot = &mut fill[edge_src(e) as usize];
        edges[*slot] = e;
        *slot += 1;
    }
    drop(raw);
    // Sort and deduplicate each row in place, compacting the array.
    let mut write = 0;
    let mut read_start = 0;
    for v in 0..nodes as usize {
        let read_end = offsets[v + 1];
        edges[read_start..read_end].sort_unstable();
        let new_start = write;
        for r in read_start..read_end {
            if write == new_start || edges[write - 1] != edges[r] {
                edges[write] = edges[r];
                write += 1;
            }
        }
        offsets[v] = new_start;
        read_start = read_end;
    }
    offsets[nodes as usize] = write;
    edges.truncate(write);
    (offsets, edges)
}

/// Edges of the dependency graph in compressed sparse rows: `edges[offsets[v]..offsets[v+1]]`
/// are `v`'s outgoing edges, sorted by kind then destination.
pub(super) struct Graph {
    /// Transaction nodes are `0..txn_nodes`; time points follow.
    txn_nodes: u32,
    nodes: u32,
    offsets: Vec<usize>,
    edges: Vec<u64>,
}

impl Graph {
    fn out(&self, v: u32) -> &[u64] {
        &self.edges[self.offsets[v as usize]..self.offsets[v as usize + 1]]
    }
    /// Weight of an edge leaving `v`: 1 from a transaction, 0 from a time point.
    fn weight(&self, v: u32) -> u32 {
        u32::from(v < self.txn_nodes)
    }
}

impl Checker<'_> {
    /// Every data edge that has transaction `t` at one end (its outgoing `ww` and `rw` edges,
    /// its incoming `wr` edges), with the evidence. Graph construction and explanations both
    /// use this, so an explanation always exists for a graph edge. Reads that are reported as
    /// anomalies go to `flagged` (by index); an ambiguous read also has edges.
    fn for_each_dep(
        &self,
        t: u32,
        mut f: impl FnMut(u32, u32, Dependency),
        mut flagged: impl FnMut(u32),
    ) {
        if !self.status[t as usize].counts_committed() {
            return;
        }
        let txn = &self.txns[t as usize];
        for w in &txn.writes {
            let rec = (w.table.0, w.key.0);
            let p = self
                .chain
                .partition_point(|c| (c.rec, c.version) < (rec, w.version.0));
            let Some(c) = self.chain.get(p) else { continue };
            if c.rec != rec || c.version != w.version.0 || c.txn != t {
                continue;
            }
            if let Some(n) = self.chain.get(p + 1).filter(|n| n.rec == rec) {
                f(
                    t,
                    n.txn,
                    Dependency::WriteWrite {
                        table: w.table,
                        key: w.key,
                        overwritten: w.version,
                        installed: Version(n.version),
                    },
                );
            }
        }
        for (j, r) in txn.reads.iter().enumerate() {
            let target = self.resolve_read(t, r);
            if target.is_anomalous() {
                flagged(j as u32);
            }
            let ReadTarget::Chain { writer, next, .. } = target else {
                continue;
            };
            if let Some(writer) = writer.filter(|&w| w != t) {
                f(
                    writer,
                    t,
                    Dependency::WriteRead {
                        table: r.table,
                        key: r.key,
                        version: r.version,
                    },
                );
            }
            if let Some(n) = next {
                let n = self.chain[n];
                if n.txn != t {
                    f(
                        t,
                        n.txn,
                        Dependency::ReadWrite {
                            table: r.table,
                            key: r.key,
                            read: r.version,
                            overwritten_by: Version(n.version),
                        },
                    );
                }
            }
        }
    }

    pub(super) fn build_graph(&mut self) -> Graph {
        let n = self.txns.len() as u32;
        let mut edges: Vec<u64> = Vec::new();
        let mut flagged: Vec<(u32, u32)> = Vec::new();
        for t in 0..n {
            if !self.status[t as usize].counts_committed() {
                continue;
            }
            self.stats.reads += self.txns[t as usize].reads.len();
            self.for_each_dep(
                t,
                |src, dst, dep| edges.push(pack(src, dep_kind(&dep), dst)),
                |j| flagged.push((t, j)),
            );
        }
        self.check_reads(&flagged);
        drop(flagged);
        let mut nodes = n;
        if self.options.strict {
            // Time points: distinct end instants of well-formed recorded-committed txns.
            let in_graph = |i: usize| self.status[i].counts_committed() && self.well_formed[i];
            let mut points: Vec<Nanos> = (0..n as usize)
                .filter(|&i| in_graph(i) && self.status[i] == Status::Committed)
                .map(|i| self.txns[i].end)
                .collect();
            points.sort_unstable();
            points.dedup();
            assert!(
                u64::from(n) + points.len() as u64 <= NODE_MASK,
                "too many transactions for the checker"
            );
            let point_node = |rank: usize| n + rank as u32;
            for rank in 1..points.len() {
                edges.push(pack(point_node(rank - 1), RT, point_node(rank)));
            }
            for i in 0..n as usize {
                if !in_graph(i) {
                    continue;
                }
                let t = &self.txns[i];
                if self.status[i] == Status::Committed {
                    let rank = points.partition_point(|&p| p < t.end);
                    edges.push(pack(i as u32, RT, point_node(rank)));
                }
                let before = points.partition_point(|&p| p < t.begin);
                if before > 0 {
                    edges.push(pack(point_node(before - 1), RT, i as u32));
                }
            }
            nodes += points.len() as u32;
            self.stats.time_points = points.len();
        }
        let (offsets, edges) = compress(nodes, edges);
        for &e in &edges {
            match edge_kind(e) {
                WW => self.stats.ww_edges += 1,
                WR => self.stats.wr_edges += 1,
                RW => self.stats.rw_edges += 1,
                _ => self.stats.rt_edges += 1,
            }
        }
        Graph {
            txn_nodes: n,
            nodes,
            offsets,
            edges,
        }
    }

    /// Cycles, level by level.
    pub(super) fn find_cycles(&mut self, g: &Graph) {
        let all = bit(WW) | bit(WR) | bit(RW) | if self.options.strict { bit(RT) } else { 0 };
        let mut scc = Scc::new(g.nodes as usize);
        scc.run(g, all, None);
        // Only nodes in a cyclic component of the whole graph can be on a cycle at any level
        // (each level's graph is a subgraph), so the level passes visit only those.
        let mut active = alloc::vec![false; g.nodes as usize];
        let mut cyclic = false;
        for &e in &g.edges {
            let (a, b) = (edge_src(e) as usize, edge_dst(e) as usize);
            if scc.comp[a] == scc.comp[b] {
                active[a] = true;
                active[b] = true;
                cyclic = true;
            }
        }
        if !cyclic {
            return;
        }
        let mut search = Search::new(g.nodes as usize);
        // Transactions per component at the previous level (none before the first).
        let mut prev: Option<(Vec<u32>, Vec<u32>)> = None;
        for level in self.levels(all) {
            scc.run(g, level.mask, Some(&active));
            let sizes = scc.txn_counts(g);
            for group in level_candidates(g, &scc.comp, level.new_kinds).chunk_by(|a, b| a.0 == b.0)
            {
                let size = sizes[group[0].0 as usize];
                if let Some((pcomp, psizes)) = &prev
                    && psizes[pcomp[group[0].1 as usize] as usize] == size
                {
                    continue; // same transactions as a component already reported
                }
                if !self.out.room() {
                    self.out.omitted += 1;
                    continue;
                }
                let Some(cycle) = self.shortest_cycle(
                    g,
                    &mut search,
                    &scc.comp,
                    level.mask,
                    level.path_mask,
                    group,
                ) else {
                    continue; // snapshot isolation: every cycle has two `rw` edges
                };
                let steps = self.explain(g, &cycle);
                self.out.push(Anomaly::Cycle(Cycle {
                    class: CycleClass::of(&steps),
                    steps,
                    component_size: size as usize,
                }));
            }
            prev = Some((scc.comp.clone(), sizes));
        }
    }

    /// The levels of the search, weakest anomaly first: `ww` only (G0), then with `wr`
    /// (G1c), then with `rw` (G-single, G2) and real time; under snapshot isolation the
    /// last level looks only for cycles with at most one `rw` edge. `all` is every edge kind
    /// checked.
    fn levels(&self, all: u8) -> Vec<Level> {
        let mut levels = alloc::vec![
            Level {
                mask: bit(WW),
                new_kinds: bit(WW),
                path_mask: None
            },
            Level {
                mask: bit(WW) | bit(WR),
                new_kinds: bit(WR),
                path_mask: None
            },
        ];
        if self.options.isolation == Isolation::Snapshot {
            // Snapshot isolation forbids a cycle with at most one `rw` edge (G-single, and
            // with real time a stale read) and allows those with two or more (write skew):
            // start at each `rw` (and `rt`) edge and return without another `rw`.
            let starts = bit(RW) | if self.options.strict { bit(RT) } else { 0 };
            levels.push(Level {
                mask: all,
                new_kinds: starts,
                path_mask: Some(all & !bit(RW)),
            });
        } else {
            levels.push(Level {
                mask: bit(WW) | bit(WR) | bit(RW),
                new_kinds: bit(RW),
                path_mask: None,
            });
            if self.options.strict {
                levels.push(Level {
                    mask: all,
                    new_kinds: bit(RT),
                    path_mask: None,
                });
            }
        }
        levels
    }

    /// The shortest cycle through one of `group`'s edges `(comp, u, v, kind)`, as a node
    /// list `[u, v, …]` with the kind of the edge leaving each node. With `path_mask` the
    /// way back follows only those edge kinds, and there may be no such cycle.
    fn shortest_cycle(
        &self,
        g: &Graph,
        search: &mut Search,
        comp: &[u32],
        mask: u8,
        path_mask: Option<u8>,
        group: &[(u32, u32, u32, u64)],
    ) -> Option<Vec<(u32, u64)>> {
        let c = group[0].0;
        let comp_nodes = comp.iter().filter(|&&x| x == c).count();
        let mut best: Option<(u32, Vec<(u32, u64)>)> = None;
        // At the rw level, first look for G-single: a path back without further rw edges.
        let rw_level = group.iter().all(|&(_, _, _, k)| k == RW);
        let passes: Vec<u8> = match path_mask {
            Some(m) => alloc::vec![m],
            None if rw_level => alloc::vec![bit(WW) | bit(WR), 0],
            None => alloc::vec![0],
        };
        for pass_mask in passes {
            let path_mask = if pass_mask == 0 { mask } else { pass_mask };
            let mut budget = 64 * comp_nodes + 4096;
            for (i, &(_, u, v, kind)) in group.iter().enumerate() {
                let w0 = g.weight(u);
                let limit = best.as_ref().map_or(u32::MAX, |b| b.0);
                if w0 >= limit {
                    break;
                }
                // The first search of a pass always completes.
                let budget_ref = if i == 0 { None } else { Some(&mut budget) };
                match search.path(g, comp, c, path_mask, v, u, limit - w0, budget_ref) {
                    PathResult::Found(d, path) => {
                        let mut cycle = Vec::with_capacity(path.len() + 1);
                        cycle.push((u, kind));
                        cycle.extend(path);
                        best = Some((d + w0, cycle));
                        if d + w0 <= 2 {
                            break; // no self loops: 2 is the minimum
                        }
                    }
                    PathResult::None => {}
                    PathResult::OutOfBudget => break,
                }
            }
            if best.is_some() {
                break;
            }
        }
        debug_assert!(
            path_mask.is_some() || best.is_some(),
            "an edge inside a strongly connected component lies on a cycle"
        );
        best.map(|b| b.1)
    }

    /// Collapses time-point runs into `rt` steps and attaches the evidence to each edge.
    fn explain(&self, g: &Graph, cycle: &[(u32, u64)]) -> Vec<CycleStep> {
        let mut steps = Vec::new();
        let len = cycle.len();
        let mut i = 0;
        while i < len {
            let (a, kind) = cycle[i];
            debug_assert!(a < g.txn_nodes);
            let mut j = (i + 1) % len;
            let mut via_points = false;
            while cycle[j].0 >= g.txn_nodes {
                via_points = true;
                j = (j + 1) % len;
            }
            let b = cycle[j].0;
            let dependency = if via_points || kind == RT {
                Dependency::RealTime {
                    from_end: self.txns[a as usize].end,
                    to_begin: self.txns[b as usize].begin,
                }
            } else {
                let holder = if kind == WR { b } else { a };
                let mut found = None;
                self.for_each_dep(
                    holder,
                    |src, dst, dep| {
                        if found.is_none() && src == a && dst == b && dep_kind(&dep) == kind {
                            found = Some(dep);
                        }
                    },
                    |_| {},
                );
                found.expect("every graph edge has recorded evidence")
            };
            steps.push(CycleStep {
                from: self.id(a),
                to: self.id(b),
                dependency,
            });
            if j <= i {
                break;
            }
            i = j;
        }
        steps
    }
}

// ---------------------------------------------------------------------------------------------
// Strongly connected components (iterative Tarjan) and 0-1 breadth-first search
// ---------------------------------------------------------------------------------------------

struct Scc {
    comp: Vec<u32>,
    index: Vec<u32>,
    low: Vec<u32>,
    on_stack: Vec<bool>,
    stack: Vec<u32>,
    calls: Vec<(u32, usize)>,
    count: u32,
}

impl Scc {
    fn new(nodes: usize) -> Self {
        Self {
            comp: alloc::vec![0; nodes],
            index: alloc::vec![NO_NODE; nodes],
            low: alloc::vec![0; nodes],
            on_stack: alloc::vec![false; nodes],
            stack: Vec::new(),
            calls: Vec::new(),
            count: 0,
        }
    }

    /// Components of the subgraph with edge kinds in `mask`, restricted to the `active` nodes
    /// if given (the others get component `NO_NODE`).
    fn run(&mut self, g: &Graph, mask: u8, active: Option<&[bool]>) {
        self.index.fill(NO_NODE);
        self.on_stack.fill(false);
        self.comp.fill(NO_NODE);
        self.count = 0;
        let is_active = |v: u32| active.is_none_or(|a| a[v as usize]);
        let mut next_index = 0u32;
        for root in 0..g.nodes {
            if self.index[root as usize] != NO_NODE || !is_active(root) {
                continue;
            }
            self.visit(g, root, &mut next_index);
            while let Some((v, cursor)) = self.calls.pop() {
                if cursor < g.offsets[v as usize + 1] {
                    self.calls.push((v, cursor + 1));
                    let e = g.edges[cursor];
                    if mask & bit(edge_kind(e)) == 0 {
                        continue;
                    }
                    let w = edge_dst(e);
                    if !is_active(w) {
                        continue;
                    }
                    if self.index[w as usize] == NO_NODE {
                        self.visit(g, w, &mut next_index);
                    } else if self.on_stack[w as usize] {
                        self.low[v as usize] = self.low[v as usize].min(self.index[w as usize]);
                    }
                    continue;
                }
                // All of v's edges done: propagate its low link and close its component.
                if let Some(&(p, _)) = self.calls.last() {
                    self.low[p as usize] = self.low[p as usize].min(self.low[v as usize]);
                }
                if self.low[v as usize] == self.index[v as usize] {
                    loop {
                        let w = self.stack.pop().expect("v is on the stack");
                        self.on_stack[w as usize] = false;
                        self.comp[w as usize] = self.count;
                        if w == v {
                            break;
                        }
                    }
                    self.count += 1;
                }
            }
        }
    }

    fn visit(&mut self, g: &Graph, v: u32, next_index: &mut u32) {
        self.index[v as usize] = *next_index;
        self.low[v as usize] = *next_index;
        *next_index += 1;
        self.stack.push(v);
        self.on_stack[v as usize] = true;
        self.calls.push((v, g.offsets[v as usize]));
    }

    /// Transactions (not time points) per component.
    fn txn_counts(&self, g: &Graph) -> Vec<u32> {
        let mut sizes = alloc::vec![0u32; self.count as usize];
        for &c in &self.comp[..g.txn_nodes as usize] {
            if c != NO_NODE {
                sizes[c as usize] += 1;
            }
        }
        sizes
    }
}

enum PathResult {
    /// Weight and the path `[(from, kind), …]` from the source up to (not including) the
    /// target, each node with the kind of the edge leaving it on the path.
    Found(u32, Vec<(u32, u64)>),
    None,
    OutOfBudget,
}

/// Scratch space for 0-1 breadth-first searches, reset only where touched.
struct Search {
    dist: Vec<u32>,
    parent: Vec<u32>,
    parent_kind: Vec<u8>,
    touched: Vec<u32>,
    deque: VecDeque<(u32, u32)>,
}

impl Search {
    fn new(nodes: usize) -> Self {
        Self {
            dist: alloc::vec![u32::MAX; nodes],
            parent: alloc::vec![NO_NODE; nodes],
            parent_kind: alloc::vec![0; nodes],
            touched: Vec::new(),
            deque: VecDeque::new(),
        }
    }

    /// The lightest path from `from` to `to` inside component `c` using edges in `mask`,
    /// if lighter than `limit`.
    #[allow(clippy::too_many_arguments)]
    fn path(
        &mut self,
        g: &Graph,
        comp: &[u32],
        c: u32,
        mask: u8,
        from: u32,
        to: u32,
        limit: u32,
        mut budget: Option<&mut usize>,
    ) -> PathResult {
        for &v in &self.touched {
            self.dist[v as usize] = u32::MAX;
            self.parent[v as usize] = NO_NODE;
        }
        self.touched.clear();
        self.deque.clear();
        self.dist[from as usize] = 0;
        self.touched.push(from);
        self.deque.push_back((from, 0));
        let mut result = PathResult::None;
        while let Some((v, d)) = self.deque.pop_front() {
            if d > self.dist[v as usize] {
                continue;
            }
            if d >= limit {
                break;
            }
            if v == to {
                let mut path = Vec::new();
                let mut x = to;
                while x != from {
                    let p = self.parent[x as usize];
                    path.push((p, u64::from(self.parent_kind[x as usize])));
                    x = p;
                }
                path.reverse();
                result = PathResult::Found(d, path);
                break;
            }
            let out = g.out(v);
            if let Some(b) = budget.as_deref_mut() {
                if *b < out.len() {
                    result = PathResult::OutOfBudget;
                    break;
                }
                *b -= out.len();
            }
            let w8 = g.weight(v);
            for &e in out {
                if mask & bit(edge_kind(e)) == 0 {
                    continue;
                }
                let w = edge_dst(e);
                if comp[w as usize] != c {
                    continue;
                }
                let nd = d + w8;
                if nd < self.dist[w as usize] {
                    if self.dist[w as usize] == u32::MAX {
                        self.touched.push(w);
                    }
                    self.dist[w as usize] = nd;
                    self.parent[w as usize] = v;
                    self.parent_kind[w as usize] = edge_kind(e) as u8;
                    if w8 == 0 {
                        self.deque.push_front((w, nd));
                    } else {
                        self.deque.push_back((w, nd));
                    }
                }
            }
        }
        result
    }
}

/// One level of the cycle search.
struct Level {
    /// The edge kinds of the level's graph.
    mask: u8,
    /// The kinds new at this level: a search starts at each such edge.
    new_kinds: u8,
    /// The edge kinds a search may follow back (`None`: the level's graph).
    path_mask: Option<u8>,
}

/// The edges of `new_kinds` inside a component of `comp` as `(component, source,
/// destination, kind)`, sorted by component.
fn level_candidates(g: &Graph, comp: &[u32], new_kinds: u8) -> Vec<(u32, u32, u32, u64)> {
    let mut cand: Vec<(u32, u32, u32, u64)> = g
        .edges
        .iter()
        .filter(|&&e| {
            bit(edge_kind(e)) & new_kinds != 0
                && edge_src(e) < g.txn_nodes
                && comp[edge_src(e) as usize] != NO_NODE
                && comp[edge_src(e) as usize] == comp[edge_dst(e) as usize]
        })
        .map(|&e| {
            (
                comp[edge_src(e) as usize],
                edge_src(e),
                edge_dst(e),
                edge_kind(e),
            )
        })
        .collect();
    cand.sort_by_key(|c| c.0);
    cand
}
