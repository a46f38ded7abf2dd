//! Network namespaces for the tests that cross a real (virtual) network: hosts joined by
//! veth links to a bridge, made with iproute2 and deleted on drop.

use std::process::Command;

/// Network namespaces `<prefix>-h0..h2` joined by veth pairs to a bridge in `<prefix>-sw`,
/// deleted on drop.
pub struct Namespaces {
    prefix: String,
    made: Vec<String>,
}

/// The environment variable CI sets: a test that cannot get what it needs fails instead of
/// printing why and passing.
pub const REQUIRE_ENV: &str = "DMEM_TESTS_REQUIRE_ENV";

/// Where namespaces cannot be made: a failure when [`REQUIRE_ENV`] is set (CI), otherwise
/// the reason printed, and the caller returns.
pub fn unavailable(why: &str) {
    let line = format!("cannot create network namespaces here ({why}); run as root with iproute2");
    assert!(
        std::env::var_os(REQUIRE_ENV).is_none(),
        "{line} ({REQUIRE_ENV} is set)"
    );
    println!("skipped: {line}");
}

impl Namespaces {
    fn ip(args: &[&str]) -> Result<(), String> {
        let out = Command::new("ip")
            .args(args)
            .output()
            .map_err(|e| format!("cannot run `ip`: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "`ip {}` failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// Three hosts 10.77.0.1-3/24 on one bridge, in namespaces named `<tag><pid>-…`.
    pub fn three_hosts(tag: &str) -> Result<Self, String> {
        let prefix = format!("{tag}{}", std::process::id());
        let mut ns = Self {
            prefix: prefix.clone(),
            made: Vec::new(),
        };
        for n in ["sw", "h0", "h1", "h2"] {
            let name = format!("{prefix}-{n}");
            Self::ip(&["netns", "add", &name])?;
            ns.made.push(name);
        }
        let sw = format!("{prefix}-sw");
        Self::ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        Self::ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for i in 0..3 {
            let host = format!("{prefix}-h{i}");
            let (v, p) = (format!("v{i}"), format!("p{i}"));
            Self::ip(&[
                "link", "add", &v, "netns", &host, "type", "veth", "peer", "name", &p, "netns", &sw,
            ])?;
            Self::ip(&[
                "-n",
                &host,
                "addr",
                "add",
                &format!("10.77.0.{}/24", i + 1),
                "dev",
                &v,
            ])?;
            Self::ip(&["-n", &host, "link", "set", &v, "up"])?;
            Self::ip(&["-n", &host, "link", "set", "lo", "up"])?;
            Self::ip(&["-n", &sw, "link", "set", &p, "master", "br0"])?;
            Self::ip(&["-n", &sw, "link", "set", &p, "up"])?;
        }
        Ok(ns)
    }

    pub fn host(&self, i: usize) -> String {
        format!("{}-h{i}", self.prefix)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for name in self.made.iter().rev() {
            let _ = Self::ip(&["netns", "del", name]);
        }
    }
}
