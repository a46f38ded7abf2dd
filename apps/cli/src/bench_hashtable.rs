//! `dmem bench hashtable`: random-key Gets, Puts and mixes (10 % Puts unless `--put-pct` says
//! otherwise) on 8-byte keys and values,
//! DLHT (batched and unbatched) side by side with hashbrown, std's HashMap, dashmap and
//! papaya, and the machine's physical limit (random independent loads with prefetch batching
//! over an array as big as the DLHT bins). `--hasher` runs the comparison tables with their
//! own default hashers, with DLHT's `mix64`, or with foldhash, so rows compare like for like.

use std::collections::HashMap as StdHashMap;
use std::hash::{BuildHasher, RandomState};
use std::hint::black_box;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use clap::{Args as ClapArgs, ValueEnum};
use dmem_cli::common::{self, Sink, round};
use dmem_hashtable::{Dlht, Op, Options, Request, Sizing, WordArray, mix64};
use serde::Serialize;

/// Flags of `dmem bench hashtable`.
#[derive(ClapArgs, Debug, Serialize)]
pub(crate) struct Args {
    /// Tables to measure, comma-separated (dlht-fast = DLHT with `Sizing::Fast`, 1.5
    /// entries per bin instead of 2.6; limit = random independent 8-byte loads over an
    /// array the size of the DLHT bins).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "dlht,hashbrown,std,dashmap,papaya,limit"
    )]
    table: Vec<Table>,
    /// Table sizes in keys, comma-separated (k/M/G suffixes allowed, e.g. 1M,10M,100M).
    #[arg(long, value_delimiter = ',', default_value = "1M,10M", value_parser = parse_count)]
    keys: Vec<usize>,
    /// Thread counts, comma-separated, 1..=1024 (hashbrown and std run single-threaded only).
    #[arg(long, value_delimiter = ',', default_value = "1,2", value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Vec<u16>,
    /// Batch sizes, comma-separated, 1..=4096 (DLHT and limit; the other tables have no
    /// batch API).
    #[arg(long, value_delimiter = ',', default_value = "1,4,8,16,24,32", value_parser = clap::value_parser!(u16).range(1..=4096))]
    batch: Vec<u16>,
    /// Operations, comma-separated: get, put (update of a present key), mixed (Gets with
    /// `--put-pct` % Puts on every thread, so writers run while Gets do).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "get")]
    op: Vec<Workload>,
    /// Percentage of Puts in `--op mixed`, 0..=100.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u8).range(0..=100))]
    put_pct: u8,
    /// Seconds measured per row, in (0, 3600].
    #[arg(long, default_value_t = 1.0)]
    secs: f64,
    /// Pages for the DLHT and limit arrays: huge (madvise(MADV_HUGEPAGE)) or small.
    #[arg(long, value_enum, default_value = "huge")]
    pages: Pages,
    /// Hashers for hashbrown, std, dashmap and papaya, comma-separated: default (each table's
    /// own: foldhash for hashbrown, SipHash-1-3 with random keys for std, dashmap and papaya),
    /// mix64 (DLHT's own bin hash, for all: like for like with dlht) or foldhash (for all).
    /// DLHT always hashes with mix64, and limit with mix64 too; they run once.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "default")]
    hasher: Vec<HasherChoice>,
    /// Print JSON lines instead of a table: one object per measured row, then a summary.
    #[arg(long)]
    json: bool,
    /// Also write the rows to this CSV file.
    #[arg(long, value_name = "FILE")]
    csv: Option<std::path::PathBuf>,
}

/// Pages of the DLHT and limit arrays.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Pages {
    Huge,
    Small,
}

/// A count with an optional k/M/G suffix (`10M`), at least 1.
fn parse_count(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, mult) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1_000),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1_000_000),
        Some(b'g' | b'G') => (&t[..t.len() - 1], 1_000_000_000),
        _ => (t, 1),
    };
    let n: usize = digits
        .parse()
        .map_err(|_| format!("`{s}` is not a number (suffixes k, M, G allowed)"))?;
    let n = n
        .checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))?;
    if n == 0 {
        return Err("must be at least 1".into());
    }
    Ok(n)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Table {
    Dlht,
    DlhtFast,
    Hashbrown,
    Std,
    Dashmap,
    Papaya,
    Limit,
}

impl Table {
    fn name(self) -> &'static str {
        match self {
            Table::Dlht => "dlht",
            Table::DlhtFast => "dlht-fast",
            Table::Hashbrown => "hashbrown",
            Table::Std => "std",
            Table::Dashmap => "dashmap",
            Table::Papaya => "papaya",
            Table::Limit => "limit",
        }
    }
}

/// The hasher the comparison tables run with (`--hasher`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum HasherChoice {
    Default,
    Mix64,
    Foldhash,
}

impl HasherChoice {
    fn name(self) -> &'static str {
        match self {
            HasherChoice::Default => "default",
            HasherChoice::Mix64 => "mix64",
            HasherChoice::Foldhash => "foldhash",
        }
    }
}

/// DLHT's bin hash as a `BuildHasher`: a `u64` key hashes to exactly `mix64(key)`, the value
/// DLHT itself picks the bin from, so `--hasher mix64` compares tables, not hashers.
#[derive(Clone, Copy, Debug, Default)]
struct Mix64Build;

struct Mix64Hasher(u64);

impl std::hash::Hasher for Mix64Hasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
    }

    #[inline(always)]
    fn write_u64(&mut self, x: u64) {
        self.0 = self.0.rotate_left(23) ^ x;
    }

    #[inline(always)]
    fn finish(&self) -> u64 {
        mix64(self.0)
    }
}

impl std::hash::BuildHasher for Mix64Build {
    type Hasher = Mix64Hasher;
    #[inline(always)]
    fn build_hasher(&self) -> Mix64Hasher {
        Mix64Hasher(0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum Workload {
    Get,
    Put,
    Mixed,
}

impl Workload {
    fn name(self) -> &'static str {
        match self {
            Workload::Get => "get",
            Workload::Put => "put",
            Workload::Mixed => "mixed",
        }
    }
}

/// Validated flags.
struct Plan {
    tables: Vec<Table>,
    keys: Vec<usize>,
    threads: Vec<usize>,
    batches: Vec<usize>,
    ops: Vec<Workload>,
    hashers: Vec<HasherChoice>,
    put_pct: u8,
    secs: f64,
    huge: bool,
}

impl Plan {
    fn from_args(a: &Args) -> Result<Plan> {
        let names = |v: &[Table]| v.iter().map(|t| t.name()).collect::<Vec<_>>();
        common::no_duplicates("table", &names(&a.table))?;
        common::no_duplicates("keys", &a.keys)?;
        common::no_duplicates("threads", &a.threads)?;
        common::no_duplicates("batch", &a.batch)?;
        let ops: Vec<_> = a.op.iter().map(|w| w.name()).collect();
        common::no_duplicates("op", &ops)?;
        let hashers: Vec<_> = a.hasher.iter().map(|h| h.name()).collect();
        common::no_duplicates("hasher", &hashers)?;
        if !(a.secs > 0.0 && a.secs <= 3600.0) {
            bail!("--secs: must be in (0, 3600], got {}", a.secs);
        }
        // One table is alive at a time; the hungriest measured here (dashmap, papaya, std)
        // stays under 96 bytes per 16-byte entry, the DLHT and the limit array far below.
        if let Some(&n) = a.keys.iter().max() {
            common::ensure_memory(
                (n as u64).checked_mul(BYTES_PER_KEY_BOUND),
                &format!("a table of {n} keys"),
                "--keys",
            )?;
        }
        let mut keys = a.keys.clone();
        // Smallest first, so the big (memory-hungry) rows run last.
        keys.sort_unstable();
        Ok(Plan {
            tables: a.table.clone(),
            keys,
            threads: a.threads.iter().map(|&t| usize::from(t)).collect(),
            batches: a.batch.iter().map(|&b| usize::from(b)).collect(),
            ops: a.op.clone(),
            hashers: a.hasher.clone(),
            put_pct: a.put_pct,
            secs: a.secs,
            huge: a.pages == Pages::Huge,
        })
    }
}

/// An upper bound of the resident bytes per key of any table this command builds (checked
/// before building, against the machine's available memory).
const BYTES_PER_KEY_BOUND: u64 = 96;

/// The key of index `i` (distinct for distinct `i`: `mix64` is a bijection).
fn key_of(i: u64) -> u64 {
    mix64(i ^ 0x5eed_5eed_5eed_5eed)
}

const STREAM: usize = 1 << 20;

/// One thread's request stream: random present keys and, for mixed runs, which are Puts.
struct Stream {
    keys: Vec<u64>,
    is_put: Vec<bool>,
}

fn stream(n: usize, thread: usize, workload: Workload, put_pct: u8) -> Stream {
    let mut s = 0x1234_5678_9abc_def0u64 ^ (thread as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(s)
    };
    let mut keys = Vec::with_capacity(STREAM);
    let mut is_put = Vec::with_capacity(STREAM);
    for _ in 0..STREAM {
        let i = ((u128::from(next()) * n as u128) >> 64) as u64;
        keys.push(key_of(i));
        is_put.push(match workload {
            Workload::Get => false,
            Workload::Put => true,
            Workload::Mixed => next() % 100 < u64::from(put_pct),
        });
    }
    Stream { keys, is_put }
}

/// Resident set size of this process, in bytes.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

fn huge_bytes() -> u64 {
    dmem_hashtable::anon_huge_bytes().unwrap_or(0)
}

/// What a built table reports next to its rows.
struct Built {
    /// RSS growth while building, per key.
    bytes_per_key: f64,
    /// Fraction of that growth on huge pages.
    huge_fraction: f64,
    pages: &'static str,
}

/// Runs `per_thread` on `threads` threads for `secs`, returns Mops/s.
/// `per_thread(thread, deadline)` returns the number of operations it did.
fn measure<F>(threads: usize, secs: f64, per_thread: F) -> f64
where
    F: Fn(usize, Instant) -> u64 + Sync,
{
    let barrier = Barrier::new(threads + 1);
    let (ops, elapsed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let f = &per_thread;
                let b = &barrier;
                s.spawn(move || {
                    b.wait();
                    let deadline = Instant::now() + Duration::from_secs_f64(secs);
                    f(t, deadline)
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let ops: u64 = handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .sum();
        (ops, start.elapsed())
    });
    ops as f64 / elapsed.as_secs_f64() / 1e6
}

/// Calls `chunk(pos)` (which does `step` operations) until the deadline; returns operations.
#[inline(always)]
fn run_until(deadline: Instant, step: usize, mut chunk: impl FnMut(usize)) -> u64 {
    let mut done = 0u64;
    let mut pos = 0usize;
    loop {
        for _ in 0..(1024 / step).max(1) {
            chunk(pos);
            pos = (pos + step) % (STREAM - step);
            done += step as u64;
        }
        if Instant::now() >= deadline {
            return done;
        }
    }
}

struct Row<'a> {
    table: Table,
    workload: Workload,
    keys: usize,
    threads: usize,
    batch: usize,
    /// The hasher the table ran with.
    hasher: &'static str,
    mops: f64,
    built: &'a Built,
}

/// One measured row as `--json` and `--csv` give it.
#[derive(Serialize)]
struct RowOut {
    table: Table,
    op: Workload,
    keys: usize,
    threads: usize,
    batch: usize,
    hasher: &'static str,
    mops: f64,
    ns_per_op_per_thread: f64,
    pages: &'static str,
    huge_fraction: f64,
    bytes_per_key: f64,
}

/// Rows to the terminal as they are measured, and to the shared sink (JSON lines, CSV).
struct Printer {
    sink: Sink,
    header_done: bool,
    /// The first row the sink could not take (reported after the run).
    error: Option<anyhow::Error>,
}

impl Printer {
    fn row(&mut self, r: &Row<'_>) {
        let ns = 1e3 * r.threads as f64 / r.mops;
        let out = self.sink.row(&RowOut {
            table: r.table,
            op: r.workload,
            keys: r.keys,
            threads: r.threads,
            batch: r.batch,
            hasher: r.hasher,
            mops: round(r.mops, 3),
            ns_per_op_per_thread: round(ns, 1),
            pages: r.built.pages,
            huge_fraction: round(r.built.huge_fraction, 2),
            bytes_per_key: round(r.built.bytes_per_key, 1),
        });
        if let Err(e) = out {
            self.error.get_or_insert(e);
        }
        if self.sink.json() {
            return;
        }
        if !self.header_done {
            println!(
                "{:<10} {:<6} {:>11} {:>7} {:>5} {:<8} {:>9} {:>11} {:<12} {:>6} {:>9}",
                "table",
                "op",
                "keys",
                "threads",
                "batch",
                "hasher",
                "Mops/s",
                "ns/op/thr",
                "pages",
                "huge%",
                "B/key"
            );
            self.header_done = true;
        }
        println!(
            "{:<10} {:<6} {:>11} {:>7} {:>5} {:<8} {:>9.2} {:>11.1} {:<12} {:>6.0} {:>9.1}",
            r.table.name(),
            r.workload.name(),
            r.keys,
            r.threads,
            r.batch,
            r.hasher,
            r.mops,
            ns,
            r.built.pages,
            r.built.huge_fraction * 100.0,
            r.built.bytes_per_key
        );
    }
}

/// Builds a table with `build`, measuring RSS and huge-page growth.
fn built<T>(n: usize, pages: &'static str, build: impl FnOnce() -> T) -> (T, Built) {
    let (rss0, huge0) = (rss_bytes(), huge_bytes());
    let t = build();
    let (rss1, huge1) = (rss_bytes(), huge_bytes());
    let grew = rss1.saturating_sub(rss0);
    let b = Built {
        bytes_per_key: grew as f64 / n as f64,
        huge_fraction: if grew == 0 {
            0.0
        } else {
            (huge1.saturating_sub(huge0) as f64 / grew as f64).min(1.0)
        },
        pages,
    };
    (t, b)
}

/// Entry point of `dmem bench hashtable`.
pub(crate) fn run(args: Args) -> Result<()> {
    let plan = Plan::from_args(&args)?;
    let mut out = Printer {
        sink: Sink::new(args.json, args.csv.as_deref())?,
        header_done: false,
        error: None,
    };
    if !args.json {
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "# dmem bench hashtable: {} cores, THP policy {}, load average {}",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            dmem_hashtable::thp_policy().unwrap_or_else(|| "unknown".into()),
            load.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        );
        println!(
            "# {} s per row; keys and values 8 bytes; uniform random present keys; mixed: {} % \
             Puts; pages: what the table asked for; huge%: share of its resident growth on huge \
             pages",
            plan.secs, plan.put_pct
        );
    }
    for &n in &plan.keys {
        let workloads: Vec<(Workload, Vec<Stream>)> = plan
            .ops
            .iter()
            .map(|&w| {
                let max_threads = plan.threads.iter().copied().max().unwrap_or(1);
                (
                    w,
                    (0..max_threads)
                        .map(|t| stream(n, t, w, plan.put_pct))
                        .collect(),
                )
            })
            .collect();
        for &table in &plan.tables {
            bench_table(&plan, &mut out, table, n, &workloads);
        }
    }
    if let Some(e) = out.error {
        return Err(e);
    }
    out.sink
        .finish("bench hashtable", &args, serde_json::json!({}))
}

fn bench_table(
    plan: &Plan,
    out: &mut Printer,
    table: Table,
    n: usize,
    workloads: &[(Workload, Vec<Stream>)],
) {
    let secs = plan.secs;
    let page_name = if plan.huge { "thp-advised" } else { "4k" };
    match table {
        Table::Dlht | Table::DlhtFast => {
            let (t, b) = built(n, page_name, || {
                let t = Dlht::with_options(Options {
                    capacity: n,
                    huge_pages: plan.huge,
                    sizing: if table == Table::DlhtFast {
                        Sizing::Fast
                    } else {
                        Sizing::Compact
                    },
                });
                let g = t.pin();
                for i in 0..n as u64 {
                    g.insert(key_of(i), i);
                }
                drop(g);
                t
            });
            let b = Built {
                pages: t.page_kind().name(),
                ..b
            };
            for (w, streams) in workloads {
                for &threads in &plan.threads {
                    for &batch in &plan.batches {
                        let mops = measure(threads, secs, |th, deadline| {
                            dlht_thread(&t, &streams[th], *w, batch, deadline)
                        });
                        out.row(&Row {
                            table,
                            workload: *w,
                            keys: n,
                            threads,
                            batch,
                            hasher: "mix64",
                            mops,
                            built: &b,
                        });
                    }
                }
            }
        }
        Table::Hashbrown | Table::Std | Table::Dashmap | Table::Papaya => {
            // The table's memory does not depend on its hasher; the first build's resident
            // growth is kept, because later builds reuse pages the allocator kept.
            let first_bpk = std::cell::Cell::new(None);
            for &h in &plan.hashers {
                let c = Cmp {
                    plan,
                    table,
                    n,
                    workloads,
                    hasher: h,
                    first_bpk: &first_bpk,
                };
                match (table, h) {
                    (Table::Hashbrown, HasherChoice::Default | HasherChoice::Foldhash) => {
                        c.seq(out, |n| {
                            hashbrown::HashMap::with_capacity_and_hasher(
                                n,
                                hashbrown::DefaultHashBuilder::default(),
                            )
                        })
                    }
                    (Table::Hashbrown, HasherChoice::Mix64) => c.seq(out, |n| {
                        hashbrown::HashMap::with_capacity_and_hasher(n, Mix64Build)
                    }),
                    (Table::Std, HasherChoice::Default) => c.seq(out, |n| {
                        StdHashMap::with_capacity_and_hasher(n, RandomState::new())
                    }),
                    (Table::Std, HasherChoice::Mix64) => {
                        c.seq(out, |n| StdHashMap::with_capacity_and_hasher(n, Mix64Build))
                    }
                    (Table::Std, HasherChoice::Foldhash) => c.seq(out, |n| {
                        StdHashMap::with_capacity_and_hasher(
                            n,
                            hashbrown::DefaultHashBuilder::default(),
                        )
                    }),
                    (Table::Dashmap, HasherChoice::Default) => c.dashmap(out, RandomState::new()),
                    (Table::Dashmap, HasherChoice::Mix64) => c.dashmap(out, Mix64Build),
                    (Table::Dashmap, HasherChoice::Foldhash) => {
                        c.dashmap(out, hashbrown::DefaultHashBuilder::default())
                    }
                    (Table::Papaya, HasherChoice::Default) => c.papaya(out, RandomState::new()),
                    (Table::Papaya, HasherChoice::Mix64) => c.papaya(out, Mix64Build),
                    (Table::Papaya, HasherChoice::Foldhash) => {
                        c.papaya(out, hashbrown::DefaultHashBuilder::default())
                    }
                    _ => unreachable!("only comparison tables take a hasher"),
                }
            }
        }
        Table::Limit => {
            // An array as large as the DLHT bins for n keys, one load per random cache line.
            // (With the same pages: on huge pages DLHT rounds its bins to whole pages.)
            let bins = Dlht::with_options(Options {
                capacity: n,
                huge_pages: plan.huge,
                ..Options::default()
            })
            .memory_usage()
            .bins;
            let words = bins * 8;
            let (arr, b) = built(n, page_name, || {
                let mut a = WordArray::new(words, plan.huge);
                for (i, w) in a.as_mut_slice().iter_mut().enumerate() {
                    *w = i as u64;
                }
                a
            });
            let b = Built {
                pages: arr.page_kind().name(),
                ..b
            };
            let lines = bins;
            let words = arr.as_slice();
            let streams = &workloads[0].1;
            for &threads in &plan.threads {
                for &batch in &plan.batches {
                    let mops = measure(threads, secs, |th, deadline| {
                        limit_thread(words, lines, &streams[th], batch, deadline)
                    });
                    out.row(&Row {
                        table,
                        workload: Workload::Get,
                        keys: n,
                        threads,
                        batch,
                        hasher: "mix64",
                        mops,
                        built: &b,
                    });
                }
            }
        }
    }
}

/// A single-threaded map the benchmark drives (hashbrown and std).
trait SeqMap {
    fn put_new(&mut self, k: u64, v: u64);
    fn read(&self, k: u64) -> Option<u64>;
    fn bump(&mut self, k: u64);
}

impl<S: BuildHasher> SeqMap for hashbrown::HashMap<u64, u64, S> {
    fn put_new(&mut self, k: u64, v: u64) {
        self.insert(k, v);
    }
    #[inline(always)]
    fn read(&self, k: u64) -> Option<u64> {
        self.get(&k).copied()
    }
    #[inline(always)]
    fn bump(&mut self, k: u64) {
        if let Some(v) = self.get_mut(&k) {
            *v = v.wrapping_add(1);
        }
    }
}

impl<S: BuildHasher> SeqMap for StdHashMap<u64, u64, S> {
    fn put_new(&mut self, k: u64, v: u64) {
        self.insert(k, v);
    }
    #[inline(always)]
    fn read(&self, k: u64) -> Option<u64> {
        self.get(&k).copied()
    }
    #[inline(always)]
    fn bump(&mut self, k: u64) {
        if let Some(v) = self.get_mut(&k) {
            *v = v.wrapping_add(1);
        }
    }
}

/// One comparison table at one size and hasher.
struct Cmp<'a> {
    plan: &'a Plan,
    table: Table,
    n: usize,
    workloads: &'a [(Workload, Vec<Stream>)],
    hasher: HasherChoice,
    /// B/key of this table's first build (see `bench_table`).
    first_bpk: &'a std::cell::Cell<Option<f64>>,
}

impl Cmp<'_> {
    /// `b` with the B/key of the table's first build.
    fn first_build(&self, b: Built) -> Built {
        match self.first_bpk.get() {
            Some(bytes_per_key) => Built { bytes_per_key, ..b },
            None => {
                self.first_bpk.set(Some(b.bytes_per_key));
                b
            }
        }
    }

    fn row(&self, out: &mut Printer, w: Workload, threads: usize, mops: f64, b: &Built) {
        out.row(&Row {
            table: self.table,
            workload: w,
            keys: self.n,
            threads,
            batch: 1,
            hasher: self.hasher.name(),
            mops,
            built: b,
        });
    }

    /// hashbrown or std: single thread, no batching.
    fn seq<M: SeqMap>(&self, out: &mut Printer, new: impl FnOnce(usize) -> M) {
        let n = self.n;
        let (mut m, b) = built(n, "heap", || {
            let mut m = new(n);
            for i in 0..n as u64 {
                m.put_new(key_of(i), i);
            }
            m
        });
        let b = self.first_build(b);
        for (w, streams) in self.workloads {
            let s = &streams[0];
            let mut sink = 0u64;
            let start = Instant::now();
            let deadline = start + Duration::from_secs_f64(self.plan.secs);
            let ops = run_until(deadline, 1, |p| {
                let k = s.keys[p];
                if s.is_put[p] {
                    m.bump(k);
                } else {
                    sink = sink.wrapping_add(m.read(k).unwrap_or(0));
                }
            });
            black_box(sink);
            let mops = ops as f64 / start.elapsed().as_secs_f64() / 1e6;
            self.row(out, *w, 1, mops, &b);
        }
    }

    fn dashmap<S: BuildHasher + Clone + Send + Sync>(&self, out: &mut Printer, hasher: S) {
        let n = self.n;
        let (m, b) = built(n, "heap", || {
            let m = dashmap::DashMap::with_capacity_and_hasher(n, hasher);
            for i in 0..n as u64 {
                m.insert(key_of(i), i);
            }
            m
        });
        let b = self.first_build(b);
        for (w, streams) in self.workloads {
            for &threads in &self.plan.threads {
                let mops = measure(threads, self.plan.secs, |th, deadline| {
                    let s = &streams[th];
                    let mut sink = 0u64;
                    let ops = run_until(deadline, 1, |p| {
                        let k = s.keys[p];
                        if s.is_put[p] {
                            m.insert(k, p as u64);
                        } else {
                            sink = sink.wrapping_add(m.get(&k).map_or(0, |v| *v));
                        }
                    });
                    black_box(sink);
                    ops
                });
                self.row(out, *w, threads, mops, &b);
            }
        }
    }

    fn papaya<S: BuildHasher + Send + Sync>(&self, out: &mut Printer, hasher: S) {
        let n = self.n;
        let (m, b) = built(n, "heap", || {
            let m = papaya::HashMap::with_capacity_and_hasher(n, hasher);
            {
                let g = m.pin();
                for i in 0..n as u64 {
                    g.insert(key_of(i), i);
                }
            }
            m
        });
        let b = self.first_build(b);
        for (w, streams) in self.workloads {
            for &threads in &self.plan.threads {
                let mops = measure(threads, self.plan.secs, |th, deadline| {
                    let s = &streams[th];
                    let mut sink = 0u64;
                    let mut g = m.pin();
                    let mut since = 0u32;
                    let ops = run_until(deadline, 1, |p| {
                        let k = s.keys[p];
                        if s.is_put[p] {
                            g.insert(k, p as u64);
                        } else {
                            sink = sink.wrapping_add(g.get(&k).copied().unwrap_or(0));
                        }
                        since += 1;
                        if since == 4096 {
                            // Let papaya reclaim, as a long-running server would.
                            g = m.pin();
                            since = 0;
                        }
                    });
                    black_box(sink);
                    ops
                });
                self.row(out, *w, threads, mops, &b);
            }
        }
    }
}

/// One DLHT benchmark thread. Batch 1 uses the plain calls; larger batches the batch API.
fn dlht_thread(t: &Dlht, s: &Stream, w: Workload, batch: usize, deadline: Instant) -> u64 {
    let mut sink = 0u64;
    let mut g = t.pin();
    let mut since = 0usize;
    let mut out = vec![None; batch];
    let mut reqs = vec![Request::new(0, Op::Get); batch];
    let ops = run_until(deadline, batch, |p| {
        match (w, batch) {
            (Workload::Get, 1) => sink = sink.wrapping_add(g.get(s.keys[p]).unwrap_or(0)),
            (Workload::Get, _) => {
                g.get_batch(&s.keys[p..p + batch], &mut out);
                sink = sink.wrapping_add(out[batch - 1].unwrap_or(0));
            }
            (_, 1) => {
                let k = s.keys[p];
                if s.is_put[p] {
                    g.put(k, p as u64);
                } else {
                    sink = sink.wrapping_add(g.get(k).unwrap_or(0));
                }
            }
            _ => {
                for (i, r) in reqs.iter_mut().enumerate() {
                    let k = s.keys[p + i];
                    *r = Request::new(
                        k,
                        if s.is_put[p + i] {
                            Op::Put(p as u64)
                        } else {
                            Op::Get
                        },
                    );
                }
                g.batch(&mut reqs);
                sink = sink.wrapping_add(reqs[batch - 1].result.unwrap_or(0));
            }
        }
        since += batch;
        if since >= 4096 {
            // Re-pin now and then so a resize's garbage could be freed (none here).
            drop(std::mem::replace(&mut g, t.pin()));
            since = 0;
        }
    });
    black_box(sink);
    ops
}

/// Random independent 8-byte loads, one per random cache line, prefetched `batch` at a time.
fn limit_thread(words: &[u64], lines: usize, s: &Stream, batch: usize, deadline: Instant) -> u64 {
    let mut sink = 0u64;
    let mut idx = [0usize; 4096];
    let ops = run_until(deadline, batch, |p| {
        if batch == 1 {
            let line = ((u128::from(mix64(s.keys[p])) * lines as u128) >> 64) as usize;
            sink = sink.wrapping_add(words[line * 8]);
            return;
        }
        for (i, slot) in idx[..batch].iter_mut().enumerate() {
            let line = ((u128::from(mix64(s.keys[p + i])) * lines as u128) >> 64) as usize;
            *slot = line * 8;
            prefetch(&words[line * 8]);
        }
        for &w in &idx[..batch] {
            sink = sink.wrapping_add(words[w]);
        }
    });
    black_box(sink);
    ops
}

#[inline(always)]
fn prefetch(p: &u64) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is in the x86-64 baseline; a prefetch is a hint and never faults.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            (p as *const u64).cast::<i8>(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
