//! A memory node in a child process (the `dmem-shm-mn` binary), CN contexts in this one,
//! connected through a Unix socket that passes the memfd with `SCM_RIGHTS`.

mod util;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use dmem_shm::{MnLink, ShmContext, ShmError, ShmFabric};
use dmem_verbs::{Endpoint, NodeId, Port, PostList, RKey, Verbs, VerbsError, VerbsExt};
use util::now;

const MN: NodeId = NodeId(4);
const RKEY: RKey = RKey(77);
const LEN: u64 = 1 << 20;

/// The MN child; killed and reaped on drop, its socket directory removed.
struct MnProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    dir: PathBuf,
}

impl MnProcess {
    fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("dmem-shm-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_dmem-shm-mn"))
            .args(["--socket", dir.join("mn.sock").to_str().unwrap()])
            .args(["--node", &MN.0.to_string()])
            .args(["--rkey", &RKEY.0.to_string()])
            .args(["--len", &LEN.to_string()])
            .args(["--messages", dir.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start dmem-shm-mn");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let mut mn = Self {
            child,
            stdin,
            stdout,
            dir,
        };
        let ready = mn.line();
        assert!(ready.starts_with("ready "), "MN said {ready:?}");
        eprintln!("MN child: {ready}");
        mn
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("mn.sock")
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        line.trim_end().to_owned()
    }

    fn command(&mut self, command: &str) -> String {
        writeln!(self.stdin, "{command}").unwrap();
        self.stdin.flush().unwrap();
        self.line()
    }
}

impl Drop for MnProcess {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "quit");
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn context(fabric: &ShmFabric, mn: &MnProcess, cn: u16) -> ShmContext {
    let link = MnLink::connect(mn.socket(), NodeId(cn)).unwrap();
    assert_eq!(link.region().node, MN);
    assert_eq!(link.region().rkey, RKEY);
    assert_eq!(link.region().len, LEN);
    let mut ctx = fabric
        .context(Endpoint {
            node: NodeId(cn),
            port: Port(0),
        })
        .unwrap();
    ctx.add_link(link).unwrap();
    ctx
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn verbs_against_a_memory_node_in_another_process() {
    let started = Instant::now();
    let mut mn = MnProcess::start();
    let fabric = ShmFabric::new();
    let a = context(&fabric, &mn, 1);
    let b = context(&fabric, &mn, 2);
    let region = a.link(MN).unwrap().region();
    let addr = |offset| region.at(offset).unwrap();

    // WRITE here, READ in the MN process and through a second mapping here.
    now(a.write(addr(100), b"hello, memory node")).unwrap();
    assert_eq!(
        mn.command("read 100 18"),
        format!("bytes {}", hex(b"hello, memory node"))
    );
    assert_eq!(now(b.read(addr(100), 18)).unwrap(), b"hello, memory node");

    // WRITE in the MN process, READ here.
    assert_eq!(
        mn.command(&format!("write 4000 {}", hex(b"from the MN"))),
        "written"
    );
    assert_eq!(now(a.read(addr(4000), 11)).unwrap(), b"from the MN");

    // CAS and FAA from two contexts, seen by the MN.
    let word = addr(LEN - 8);
    assert_eq!(now(a.cas(word, 0, 41)).unwrap(), 0);
    assert_eq!(now(b.cas(word, 0, 99)).unwrap(), 41, "b's CAS must fail");
    assert_eq!(now(b.faa(word, 1)).unwrap(), 41);
    let mut list = PostList::new();
    for _ in 0..10 {
        list.faa(word, 10);
    }
    now(a.post(list)).unwrap();
    assert_eq!(
        mn.command(&format!("read {} 8", LEN - 8)),
        format!("bytes {}", hex(&142u64.to_ne_bytes()))
    );

    // Bounds are checked against the received region description.
    assert!(matches!(
        now(a.read(word, 9)),
        Err(VerbsError::RemoteAccess { .. })
    ));

    // The MN process revokes CN 1; the flag crosses the process boundary.
    assert_eq!(mn.command("revoke 1"), "revoked 1");
    assert!(a.link(MN).unwrap().is_revoked());
    assert_eq!(
        now(a.faa(word, 1)),
        Err(VerbsError::RemoteAccess {
            index: 0,
            addr: word
        })
    );
    assert_eq!(now(b.faa(word, 1)).unwrap(), 142);

    // Connecting to a socket nobody serves fails cleanly.
    assert!(matches!(
        MnLink::connect(mn.dir.join("nobody.sock"), NodeId(1)),
        Err(ShmError::Os {
            call: "connect",
            ..
        })
    ));

    // A two-sided round trip: the MN process echoes messages to its port 0.
    let _replies = fabric.serve_messages(&mn.dir, NodeId(1)).unwrap();
    now(a.send(
        Endpoint {
            node: MN,
            port: Port(0),
        },
        b"ping",
    ))
    .unwrap();
    let (echo, _) = util::block_on(a.recv());
    let echo = echo.unwrap();
    assert_eq!(
        echo.from,
        Endpoint {
            node: MN,
            port: Port(0)
        }
    );
    assert_eq!(echo.payload, b"ping");

    drop(mn);
    // The mapping outlives the MN process: the memfd lives as long as a mapping of it.
    assert_eq!(now(b.faa(word, 1)).unwrap(), 143);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}
