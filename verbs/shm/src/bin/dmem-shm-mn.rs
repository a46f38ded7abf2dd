//! `dmem-shm-mn`: a memory-node process for the shared-memory fabric.
//!
//! ```text
//! dmem-shm-mn --socket PATH --node N --rkey K --len BYTES [--messages DIR]
//! ```
//!
//! With `--messages DIR` it also receives two-sided messages for node `N` on
//! `DIR/node-N.sock` and echoes every message sent to port 0 back to its sender (a minimal
//! control-plane RPC, used by the multi-process test).
//!
//! Creates the region, serves it on the Unix socket `PATH`, prints `ready <huge pages>` and
//! then reads commands from standard input, one per line, answering each with one line:
//!
//! | command | answer |
//! |---|---|
//! | `revoke <cn>` | `revoked <links>` or `error <why>` |
//! | `read <offset> <len>` | `bytes <hex>` as the MN itself reads them |
//! | `write <offset> <hex>` | `written` |
//! | `quit` | exits |
//!
//! It exits at `quit` or when standard input closes, which is how a parent that dies
//! takes its MN child with it.

use std::future::Future;
use std::io::{BufRead, Write};
use std::pin::pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use dmem_shm::{ShmFabric, ShmMemoryNode};
use dmem_verbs::{Endpoint, NodeId, Port, PostList, RKey, Verbs};

struct Args {
    socket: String,
    messages: Option<String>,
    node: u16,
    rkey: u32,
    len: u64,
}

fn parse_args() -> Result<Args, String> {
    let (mut socket, mut messages) = (None, None);
    let (mut node, mut rkey, mut len) = (0u16, 1u32, 1u64 << 20);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let bad = |e: std::num::ParseIntError| format!("{flag} {value}: {e}");
        match flag.as_str() {
            "--socket" => socket = Some(value),
            "--messages" => messages = Some(value),
            "--node" => node = value.parse().map_err(bad)?,
            "--rkey" => rkey = value.parse().map_err(bad)?,
            "--len" => len = value.parse().map_err(bad)?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(Args {
        socket: socket.ok_or("--socket PATH is required")?,
        messages,
        node,
        rkey,
        len,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("dmem-shm-mn: {e}");
            eprintln!(
                "usage: dmem-shm-mn --socket PATH --node N --rkey K --len BYTES [--messages DIR]"
            );
            return ExitCode::from(2);
        }
    };
    match serve(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dmem-shm-mn: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let me = NodeId(args.node);
    let mn = ShmMemoryNode::create(me, RKey(args.rkey), args.len)?;
    let _server = mn.serve(&args.socket)?;
    // The MN's own view of its memory, through a link of its own.
    let fabric = ShmFabric::new();
    let mut local = fabric.context(Endpoint {
        node: me,
        port: Port(1),
    })?;
    let _messages = match &args.messages {
        Some(dir) => {
            let server = fabric.serve_messages(dir, me)?;
            let control = fabric.context(Endpoint {
                node: me,
                port: Port(0),
            })?;
            std::thread::spawn(move || echo(&control));
            Some(server)
        }
        None => None,
    };
    local.add_link(mn.link(me)?)?;
    let region = mn.region();

    let mut out = std::io::stdout().lock();
    writeln!(out, "ready {:?}", mn.huge_pages())?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["quit"] => break,
            ["revoke", cn] => match cn.parse() {
                Ok(cn) => match mn.revoke(NodeId(cn)) {
                    Ok(n) => format!("revoked {n}"),
                    Err(e) => format!("error {e}"),
                },
                Err(e) => format!("error {e}"),
            },
            ["read", offset, len] => match (offset.parse(), len.parse()) {
                (Ok(offset), Ok(len)) => {
                    let mut list = PostList::new();
                    let id = list.read(region.at(0).expect("empty region").add(offset), len);
                    match local.post_now(list) {
                        Ok(result) => format!("bytes {}", hex(result.bytes(id))),
                        Err(e) => format!("error {e}"),
                    }
                }
                _ => "error bad number".to_owned(),
            },
            ["write", offset, data] => match (offset.parse::<u64>(), unhex(data)) {
                (Ok(offset), Some(data)) => {
                    let mut list = PostList::new();
                    list.write_owned(region.at(0).expect("empty region").add(offset), data);
                    match local.post_now(list) {
                        Ok(_) => "written".to_owned(),
                        Err(e) => format!("error {e}"),
                    }
                }
                _ => "error bad offset or hex".to_owned(),
            },
            _ => format!("error unknown command: {line}"),
        };
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

/// Echoes every message to port 0 back to its sender, until the queue closes.
fn echo(control: &dmem_shm::ShmContext) {
    while let Ok(message) = block_on(control.recv()) {
        // A sender that went away is its own business.
        let _ = block_on(control.send(message.from, &message.payload));
    }
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` on this thread, parking while it is pending.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(value) = future.as_mut().poll(&mut cx) {
            return value;
        }
        std::thread::park();
    }
}
