//! Two hosts for the tests of a network provider: two network namespaces
//! joined by a veth pair, with addresses of the test's own, made by the
//! test and removed when dropped.
//!
//! Making them needs root (or `CAP_SYS_ADMIN`) and `ip` (iproute2);
//! [`Hosts::new`] says why it could not, and the test skips or fails as
//! its rules say. Names and addresses carry the process id, so that runs
//! of different tests do not meet.

use std::process::{Command, Stdio};

/// Two namespaces, `a` and `b`, and the veth pair between them (host 1 in
/// `a`, host 2 in `b`, on a /24 of their own); removed on drop.
pub struct Hosts {
    /// The first host's namespace.
    pub a: String,
    /// The second host's namespace.
    pub b: String,
    veth_a: String,
    veth_b: String,
    net: String,
}

impl Hosts {
    /// Makes the hosts: namespaces `rdapl-TAG-a-PID` and `rdapl-TAG-b-PID`,
    /// addresses `10.OCTET.X.1` and `.2` (`X` from the process id). `tag`
    /// is at most 4 characters (a veth's name is at most 15).
    pub fn new(tag: &str, octet: u8) -> Result<Hosts, String> {
        let pid = std::process::id();
        let h = Hosts {
            a: format!("rdapl-{tag}-a-{pid}"),
            b: format!("rdapl-{tag}-b-{pid}"),
            veth_a: format!("r{tag}a{pid}"),
            veth_b: format!("r{tag}b{pid}"),
            net: format!("10.{octet}.{}", pid % 250 + 1),
        };
        ip(&["netns", "add", &h.a])?;
        // From here on, drop removes what exists.
        ip(&["netns", "add", &h.b])?;
        ip(&[
            "link", "add", &h.veth_a, "netns", &h.a, "type", "veth", "peer", "name", &h.veth_b,
            "netns", &h.b,
        ])?;
        for (ns, dev, host) in [(&h.a, &h.veth_a, 1), (&h.b, &h.veth_b, 2)] {
            let addr = format!("{}/24", h.addr(host));
            ip(&["-n", ns, "addr", "add", &addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(h)
    }

    /// Host `host`'s address (1: in `a`, 2: in `b`).
    pub fn addr(&self, host: u8) -> String {
        format!("{}.{host}", self.net)
    }

    /// Lowers the link's MTU at both ends.
    pub fn set_mtu(&self, mtu: u32) {
        let mtu = mtu.to_string();
        for (ns, dev) in [(&self.a, &self.veth_a), (&self.b, &self.veth_b)] {
            ip(&["-n", ns, "link", "set", dev, "mtu", &mtu]).expect("lower the MTU");
        }
    }

    /// Cuts the link: no packet crosses, and neither side is told.
    pub fn cut(&self) {
        ip(&["-n", &self.a, "link", "set", &self.veth_a, "down"]).expect("cut the link");
    }

    /// `program` to be run in namespace `ns` (`ip netns exec`).
    pub fn command(ns: &str, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns]).arg(program);
        c
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

/// Runs `ip ARGS`; its complaint if it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
