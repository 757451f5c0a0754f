//! IA parameters and the mapping of DAT connection qualifiers to TCP ports.
//!
//! `Ia::open` hands the provider a parameter string of `key=value` words,
//! separated by spaces or commas. Every key is optional:
//!
//! | key | meaning | default |
//! |---|---|---|
//! | `addr` | the IA's IP address, one of this host's or `0.0.0.0`/`::` (any): listeners bind it, connections start from it | `127.0.0.1` |
//! | `port_base` | TCP port of qualifier 0: qualifier `q` is port `port_base + q` | `0` |
//! | `crc` | ask for MPA CRC32c (`1`/`0`, `on`/`off`); used if either side asks | the instance's (on) |
//! | `mss` | largest FPDU in bytes (64..=65535; `auto`: the default) | the socket's MSS when the connection is set up (on loopback Linux then caps it at half the peer's first window, about 32 KiB; larger FPDUs, once the window grew, moved 1 MiB messages slower), and smaller as soon as the socket's MSS falls (the path's MTU did: looked at every 100 ms while the connection moves) |
//! | `recv_wait_ms` | how long an arriving Send may wait for a receive | the instance's (5000) |
//! | `timeout_ms` | how long a silent peer (link cut, host gone, or stopped inside an FPDU it began or owing the answer to a read or fence) goes unnoticed before the connection breaks (100..=3600000; an idle peer is asked with a heartbeat, a zero-length read, after half of it; below 400 a live peer must acknowledge within half of it, which a delayed acknowledgement may not); keep it above the peer's `recv_wait_ms`, during which a peer may rightly hold an answer back or its window closed, and above the time a peer's consumer may take to catch up with a sender (a window closed about that long breaks the connection, as the kernel's `TCP_USER_TIMEOUT` would; with `complete=sent` a sender may run megabytes ahead) | the instance's (10000) |
//! | `complete` | when a Send or RDMA Write completes: `placed` (the peer placed it) or `sent` (handed to TCP, siw's meaning); see [`Completion`] | the instance's (`placed`) |
//! | `poll_fresh_ms` | how long after a consumer's last polling pass the provider's thread leaves the input to it (1..=3600000); keep it well below the peer's `timeout_ms`: input left unread that long holds back the answers the peer waits for | the instance's (3) |
//! | `mpa_timeout_ms` | how long a passive side waits for the MPA Request of a connection it accepted, and for the RTR after its Reply (100..=3600000); the active side's wait for the Reply is bounded by the consumer's connect timeout alone, and the consumer's decision on a request by nothing | 5000 (siw's) |
//! | `wait_spin_us` | how long a consumer's `wait` drives its connections from its own thread before it hands them to the provider's thread and blocks, at least, in microseconds (0..=1000000); see [`TcpConfig::wait_spin_us`] | the instance's (50, or 0 on a machine with one CPU online) |
//! | `poll_yield` | a consumer's progress passes (its `dequeue`s of an empty EVD) yield the CPU once every this many (0: never; 1..=1000000); see [`TcpConfig::poll_yield`] | the instance's (0, or 4 on a machine with one CPU online) |
//! | `setups` | most accepted connections a listener keeps waiting for their MPA request (1..=65536); past it the oldest that waited a second are closed, so a flood of idle connections holds no more sockets than that (and what comes within a second) | 1024 |
//!
//! An IA's query reports its settings under these keys
//! (`ProviderAttr::provider_specific_attr`), defaults resolved (what this
//! machine's CPUs made of `wait_spin_us` and `poll_yield`, say);
//! `rdapl info` prints them for an IA with no parameters of its own.
//!
//! A qualifier whose port falls outside 1..=65535 is refused with
//! `InvalidParameter`, at `listen` and at `connect`. Both sides must use
//! the same `port_base` to meet.

use rdapl::{Error, NamedAttr, Result};
use std::net::{IpAddr, Ipv4Addr};

/// When a Send or an RDMA Write completes.
///
/// iWARP has no acknowledgement of its own, so the two meanings differ in
/// what the provider must send to know and in what a success tells.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Completion {
    /// The peer has placed it (the default). After a burst of Sends and
    /// Writes the provider posts a zero-length RDMA Read (a fence) whose
    /// response proves the peer processed everything before it. A remote
    /// error (a forged key, no receive) completes the request that caused
    /// it with its status.
    #[default]
    Placed,
    /// Its last byte was handed to TCP: the local buffer may be reused.
    /// This is siw's meaning (and libfabric tcp's transmit-complete): no
    /// fences, fewer bytes and segments on the wire. A success tells
    /// nothing of the peer: a remote error that follows breaks the
    /// connection (both sides see `Broken`, every request not yet
    /// completed is `Flushed`), and a request that succeeded may be lost
    /// with the connection.
    Sent,
}

/// Settings of one [`crate::Tcp`] instance: the defaults of its IAs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// Ask for MPA CRC32c (RFC 5044). On by default.
    pub crc: bool,
    /// How long, in milliseconds, an arriving Send waits for a posted
    /// receive before the connection breaks (`ReceiverNotReady` on the
    /// sender). While it waits, the receiver stops reading that socket, so
    /// TCP flow control holds the sender back.
    pub recv_wait_ms: u64,
    /// How long, in milliseconds, a closed socket may take to drain its
    /// last bytes and see the peer's end before it is dropped.
    pub linger_ms: u64,
    /// How long, in milliseconds, a connection whose peer falls silent
    /// (the link cut, the host gone) lasts before it breaks: nothing
    /// from the peer that long while it is asked (sent data
    /// unacknowledged, a closed window's probes, keepalive probes or,
    /// on an idle connection, the provider's heartbeat, a zero-length
    /// read sent after half of it, unanswered), no byte
    /// of an FPDU the peer began (a peer stopped mid-frame, a corrupted
    /// length), or no byte either way (bytes of ours the kernel still
    /// delivers count) while the peer owes the answer to a read or fence
    /// (a peer process stopped or hung while its kernel acknowledges). Keep it above the peer's `recv_wait_ms`: a peer
    /// holding a Send for a receive holds the answers behind it too.
    pub timeout_ms: u64,
    /// How long, in milliseconds, after a consumer's last polling pass the
    /// progress thread still leaves that connection's input to it (a
    /// consumer that arms a notification or blocks hands it back at
    /// once; this bounds the wait of one that just stops polling). Keep
    /// it well below the peers' `timeout_ms`: input left unread holds
    /// back the answers to their reads and fences.
    pub poll_fresh_ms: u64,
    /// When Sends and RDMA Writes complete ([`Completion::Placed`] by
    /// default).
    pub complete: Completion,
    /// How long, in microseconds, a consumer's `wait` drives its
    /// connections from its own thread (reads, places, completes) before
    /// it hands them to the provider's thread and blocks. A spin saves a
    /// ping-pong two thread wake-ups a message, if the answer comes while
    /// it lasts; where the peer, or this provider's thread, shares the
    /// waiter's only CPU it cannot, and each wait then costs the whole
    /// spin. The least spin: an EVD doubles it, up to
    /// [`rdapl::provider::WAIT_SPIN_GROWTH`] times, while its blocked
    /// waits keep ending soon after they blocked (where waking a blocked
    /// peer costs more than the spin, as on a VM whose idle CPUs halt),
    /// except in a thread that may run on one CPU only: a process pinned
    /// to a CPU of its own, its peer on another, may want a longer one
    /// there (200). `None` (the
    /// default): [`DEFAULT_WAIT_SPIN_US`], or 0 on a
    /// machine with one CPU online. Say 0 where both sides of a
    /// connection, or a consumer and its IA, are confined to one CPU
    /// (`taskset`, a cpuset of one): the provider cannot tell that from a
    /// process pinned to a CPU of its own.
    pub wait_spin_us: Option<u64>,
    /// A polling consumer's progress passes (each `dequeue` that finds its
    /// EVD empty runs one) yield the CPU (`sched_yield`) once every this
    /// many; 0: never. Where the consumer shares its only CPU with its
    /// peer or this provider's thread, a poll loop that never yields keeps
    /// them off the CPU for a whole time slice, milliseconds a message;
    /// where it shares it with an unrelated busy process, each yield hands
    /// that process a time slice. `None` (the default): 0, or
    /// [`ONE_CPU_POLL_YIELD`] on a machine with one CPU online.
    pub poll_yield: Option<u32>,
}

/// [`TcpConfig::poll_yield`] on a machine with one CPU online.
pub const ONE_CPU_POLL_YIELD: u32 = 4;

/// [`TcpConfig::wait_spin_us`] on a machine with more than one CPU
/// online: the core's default ([`rdapl::provider::DEFAULT_WAIT_SPIN`]).
pub const DEFAULT_WAIT_SPIN_US: u64 = rdapl::provider::DEFAULT_WAIT_SPIN.as_micros() as u64;

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            crc: true,
            recv_wait_ms: 5_000,
            linger_ms: 1_000,
            timeout_ms: 10_000,
            poll_fresh_ms: crate::progress::POLL_FRESH_MS,
            complete: Completion::Placed,
            wait_spin_us: None,
            poll_yield: None,
        }
    }
}

/// The settings of one IA.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IaParams {
    pub addr: IpAddr,
    pub port_base: u64,
    pub crc: bool,
    pub mss: Option<u32>,
    pub recv_wait_ms: u64,
    pub linger_ms: u64,
    pub timeout_ms: u64,
    pub poll_fresh_ms: u64,
    pub complete: Completion,
    /// The engine's `request_timeout_ms`.
    pub mpa_timeout_ms: u64,
    /// Most accepted connections a listener keeps waiting for their MPA
    /// request (see `progress::Driver::limit_setups`).
    pub setups: usize,
    /// [`TcpConfig::wait_spin_us`], resolved.
    pub wait_spin_us: u64,
    /// [`TcpConfig::poll_yield`], resolved.
    pub poll_yield: u32,
}

/// The CPUs online on this machine (`None`: unknown).
fn cpus_online() -> Option<usize> {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    count_cpus(&online)
}

/// [`TcpConfig::wait_spin_us`]'s default on a machine with `cpus` online:
/// none with one, where a waiter's spin only keeps its peer, or this
/// provider's thread, from running.
fn wait_spin_for(cpus: Option<usize>) -> u64 {
    if cpus == Some(1) {
        0
    } else {
        DEFAULT_WAIT_SPIN_US
    }
}

/// [`TcpConfig::poll_yield`]'s default on a machine with `cpus` online.
fn poll_yield_for(cpus: Option<usize>) -> u32 {
    if cpus == Some(1) {
        ONE_CPU_POLL_YIELD
    } else {
        0
    }
}

/// The number of CPUs in a kernel CPU list (`0`, `0-3`, `0-3,8,10-11`).
fn count_cpus(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.trim().split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?),
            None => {
                let a = part.parse::<usize>().ok()?;
                (a, a)
            }
        };
        n = n.checked_add(b.checked_sub(a)?.checked_add(1)?)?;
    }
    Some(n)
}

/// The default of `mpa_timeout_ms` (siw's `MPAREP_TIMEOUT`).
pub(crate) const MPA_TIMEOUT_MS: u64 = 5_000;

/// The default of `setups`.
pub(crate) const SETUPS: usize = 1024;

fn bad(what: &'static str) -> Error {
    Error::InvalidParameter { arg: 1, what }
}

/// `v` as a number within `range`, else `InvalidParameter` saying `what`.
fn ranged(v: &str, range: std::ops::RangeInclusive<u64>, what: &'static str) -> Result<u64> {
    v.parse()
        .ok()
        .filter(|t| range.contains(t))
        .ok_or(bad(what))
}

fn flag(v: &str) -> Option<bool> {
    match v {
        "1" | "on" | "true" | "yes" => Some(true),
        "0" | "off" | "false" | "no" => Some(false),
        _ => None,
    }
}

impl IaParams {
    /// The settings of `cfg` for an IA with no parameters of its own
    /// (`wait_spin_us` and `poll_yield` resolved for this machine where
    /// `cfg` leaves them open).
    pub fn defaults(cfg: &TcpConfig) -> IaParams {
        let mut p = IaParams {
            addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port_base: 0,
            crc: cfg.crc,
            mss: None,
            recv_wait_ms: cfg.recv_wait_ms,
            linger_ms: cfg.linger_ms,
            timeout_ms: cfg.timeout_ms,
            poll_fresh_ms: cfg.poll_fresh_ms,
            complete: cfg.complete,
            mpa_timeout_ms: MPA_TIMEOUT_MS,
            setups: SETUPS,
            wait_spin_us: 0,
            poll_yield: 0,
        };
        // (The CPUs are read only for a default the instance left open.)
        let auto = cfg.wait_spin_us.is_none() || cfg.poll_yield.is_none();
        let cpus = if auto { cpus_online() } else { None };
        p.wait_spin_us = cfg.wait_spin_us.unwrap_or_else(|| wait_spin_for(cpus));
        p.poll_yield = cfg.poll_yield.unwrap_or_else(|| poll_yield_for(cpus));
        p
    }

    /// Parses `params` over the defaults of `cfg`.
    pub fn parse(params: &str, cfg: &TcpConfig) -> Result<IaParams> {
        let mut p = IaParams::defaults(cfg);
        for kv in params.split([' ', ',']).filter(|s| !s.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or(bad("tcp: parameters are key=value"))?;
            match k {
                "addr" => p.addr = v.parse().map_err(|_| bad("tcp: addr= is not an IP"))?,
                "port_base" => {
                    p.port_base = v
                        .parse::<u16>()
                        .map_err(|_| bad("tcp: port_base= is not a port number"))?
                        .into()
                }
                "crc" => p.crc = flag(v).ok_or(bad("tcp: crc= is 1 or 0"))?,
                "mss" if v == "auto" => p.mss = None,
                "mss" => {
                    let m: u32 = v.parse().map_err(|_| bad("tcp: mss= is not a number"))?;
                    if !(64..=65535).contains(&m) {
                        return Err(bad("tcp: mss= must be in 64..=65535"));
                    }
                    p.mss = Some(m);
                }
                "recv_wait_ms" => {
                    p.recv_wait_ms = v
                        .parse()
                        .map_err(|_| bad("tcp: recv_wait_ms= is not a number"))?
                }
                "timeout_ms" => {
                    p.timeout_ms = ranged(
                        v,
                        100..=3_600_000,
                        "tcp: timeout_ms= must be in 100..=3600000",
                    )?
                }
                "mpa_timeout_ms" => {
                    p.mpa_timeout_ms = ranged(
                        v,
                        100..=3_600_000,
                        "tcp: mpa_timeout_ms= must be in 100..=3600000",
                    )?
                }
                "poll_fresh_ms" => {
                    p.poll_fresh_ms = ranged(
                        v,
                        1..=3_600_000,
                        "tcp: poll_fresh_ms= must be in 1..=3600000",
                    )?
                }
                "setups" => {
                    let n: usize = v.parse().map_err(|_| bad("tcp: setups= is not a number"))?;
                    if !(1..=65_536).contains(&n) {
                        return Err(bad("tcp: setups= must be in 1..=65536"));
                    }
                    p.setups = n;
                }
                "wait_spin_us" => {
                    p.wait_spin_us = ranged(
                        v,
                        0..=1_000_000,
                        "tcp: wait_spin_us= must be in 0..=1000000",
                    )?
                }
                "poll_yield" => {
                    p.poll_yield =
                        ranged(v, 0..=1_000_000, "tcp: poll_yield= must be in 0..=1000000")? as u32
                }
                "complete" => {
                    p.complete = match v {
                        "placed" => Completion::Placed,
                        "sent" => Completion::Sent,
                        _ => return Err(bad("tcp: complete= is placed or sent")),
                    }
                }
                _ => return Err(bad("tcp: unknown parameter")),
            }
        }
        Ok(p)
    }

    /// The settings as named attributes, under the keys [`parse`](Self::parse)
    /// takes and with the values it reads back to the same settings (an
    /// IA's query reports them: `rdapl info` prints an IA with no
    /// parameters of its own).
    pub fn named(&self) -> Vec<NamedAttr> {
        let mss = self
            .mss
            .map_or_else(|| "auto".to_string(), |m| m.to_string());
        let complete = match self.complete {
            Completion::Placed => "placed",
            Completion::Sent => "sent",
        };
        vec![
            NamedAttr::new("addr", self.addr),
            NamedAttr::new("port_base", self.port_base),
            NamedAttr::new("crc", u8::from(self.crc)),
            NamedAttr::new("mss", mss),
            NamedAttr::new("recv_wait_ms", self.recv_wait_ms),
            NamedAttr::new("timeout_ms", self.timeout_ms),
            NamedAttr::new("complete", complete),
            NamedAttr::new("poll_fresh_ms", self.poll_fresh_ms),
            NamedAttr::new("mpa_timeout_ms", self.mpa_timeout_ms),
            NamedAttr::new("wait_spin_us", self.wait_spin_us),
            NamedAttr::new("poll_yield", self.poll_yield),
            NamedAttr::new("setups", self.setups),
        ]
    }

    /// The TCP port of connection qualifier `qual`.
    pub fn port(&self, qual: u64) -> Result<u16> {
        self.port_base
            .checked_add(qual)
            .filter(|p| (1..=65535).contains(p))
            .map(|p| p as u16)
            .ok_or(Error::InvalidParameter {
                arg: 2,
                what: "tcp: the qualifier maps outside TCP ports 1..=65535",
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_maps_ports() {
        let c = TcpConfig::default();
        let p = IaParams::parse("addr=127.0.0.5, port_base=1000 crc=off mss=9000", &c).unwrap();
        assert_eq!(p.addr, "127.0.0.5".parse::<IpAddr>().unwrap());
        assert!(!p.crc);
        assert_eq!(p.mss, Some(9000));
        assert_eq!(p.port(5).unwrap(), 1005);
        assert!(p.port(64536).is_err());
        assert!(p.port(u64::MAX).is_err());
        let d = IaParams::parse("", &c).unwrap();
        assert_eq!(d.port(80).unwrap(), 80);
        assert!(d.port(0).is_err());
        assert!(IaParams::parse("addr=nope", &c).is_err());
        assert!(IaParams::parse("color=red", &c).is_err());
        assert!(IaParams::parse("mss=10", &c).is_err());
        assert_eq!(
            IaParams::parse("timeout_ms=2500", &c).unwrap().timeout_ms,
            2500
        );
        assert_eq!(d.timeout_ms, 10_000);
        assert!(IaParams::parse("timeout_ms=5", &c).is_err());
        assert!(IaParams::parse("timeout_ms=x", &c).is_err());
        assert_eq!(d.mpa_timeout_ms, 5_000);
        assert_eq!(
            IaParams::parse("mpa_timeout_ms=250", &c)
                .unwrap()
                .mpa_timeout_ms,
            250
        );
        assert!(IaParams::parse("mpa_timeout_ms=99", &c).is_err());
        assert!(IaParams::parse("mpa_timeout_ms=-1", &c).is_err());
        assert_eq!(d.poll_fresh_ms, crate::progress::POLL_FRESH_MS);
        assert_eq!(
            IaParams::parse("poll_fresh_ms=50", &c)
                .unwrap()
                .poll_fresh_ms,
            50
        );
        assert!(IaParams::parse("poll_fresh_ms=0", &c).is_err());
        assert_eq!(d.complete, Completion::Placed);
        assert_eq!(
            IaParams::parse("complete=sent", &c).unwrap().complete,
            Completion::Sent
        );
        assert!(IaParams::parse("complete=later", &c).is_err());
        assert_eq!(d.setups, SETUPS);
        assert_eq!(IaParams::parse("setups=8", &c).unwrap().setups, 8);
        assert!(IaParams::parse("setups=0", &c).is_err());
        assert!(IaParams::parse("setups=70000", &c).is_err());
        assert_eq!(
            IaParams::parse("wait_spin_us=0", &c).unwrap().wait_spin_us,
            0
        );
        assert_eq!(
            IaParams::parse("wait_spin_us=1000000", &c)
                .unwrap()
                .wait_spin_us,
            1_000_000
        );
        assert!(IaParams::parse("wait_spin_us=1000001", &c).is_err());
        assert!(IaParams::parse("wait_spin_us=-1", &c).is_err());
        let fixed = TcpConfig {
            wait_spin_us: Some(7),
            ..TcpConfig::default()
        };
        assert_eq!(IaParams::parse("", &fixed).unwrap().wait_spin_us, 7);
    }

    /// On a machine with one CPU online: no spin and yielding polls, by
    /// default.
    #[test]
    fn one_cpu_defaults() {
        assert_eq!(count_cpus("0\n"), Some(1));
        assert_eq!(count_cpus("0-1\n"), Some(2));
        assert_eq!(count_cpus("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpus("3-1"), None);
        assert_eq!(count_cpus(""), None);
        assert_eq!(count_cpus("x"), None);
        assert_eq!(wait_spin_for(Some(1)), 0);
        assert_eq!(wait_spin_for(Some(2)), DEFAULT_WAIT_SPIN_US);
        assert_eq!(wait_spin_for(None), DEFAULT_WAIT_SPIN_US);
        assert_eq!(poll_yield_for(Some(1)), ONE_CPU_POLL_YIELD);
        assert_eq!(poll_yield_for(Some(2)), 0);
        assert_eq!(poll_yield_for(None), 0);
        let c = TcpConfig::default();
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
        let d = IaParams::parse("", &c).unwrap();
        assert_eq!(d.wait_spin_us, wait_spin_for(count_cpus(&online)));
        assert_eq!(d.poll_yield, poll_yield_for(count_cpus(&online)));
        assert_eq!(IaParams::parse("poll_yield=4", &c).unwrap().poll_yield, 4);
        assert!(IaParams::parse("poll_yield=1000001", &c).is_err());
        assert!(IaParams::parse("poll_yield=x", &c).is_err());
    }

    /// What an IA's query reports reads back, as parameters, to the same
    /// settings: every key, defaults resolved.
    #[test]
    fn named_settings_parse_back_to_themselves() {
        let c = TcpConfig::default();
        let words = |p: &IaParams| -> String {
            p.named()
                .iter()
                .map(|a| format!("{}={}", a.name, a.value))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let d = IaParams::defaults(&c);
        assert_eq!(IaParams::parse("", &c).unwrap(), d);
        let text = words(&d);
        assert!(text.contains("mss=auto"), "{text}");
        assert!(text.contains("complete=placed"), "{text}");
        assert!(text.contains(&format!("wait_spin_us={}", d.wait_spin_us)));
        // Every settable setting but the linger (not a parameter) is named.
        let changed = IaParams::parse(
            "addr=::1 port_base=7000 crc=0 mss=1460 recv_wait_ms=9 timeout_ms=500 \
             complete=sent poll_fresh_ms=2 mpa_timeout_ms=300 wait_spin_us=11 \
             poll_yield=3 setups=5",
            &c,
        )
        .unwrap();
        for p in [&d, &changed] {
            let back = IaParams::parse(&words(p), &TcpConfig::default()).unwrap();
            assert_eq!(&back, p, "{}", words(p));
        }
        for (field, differs) in [
            ("addr", changed.addr != d.addr),
            ("port_base", changed.port_base != d.port_base),
            ("crc", changed.crc != d.crc),
            ("mss", changed.mss != d.mss),
            ("recv_wait_ms", changed.recv_wait_ms != d.recv_wait_ms),
            ("timeout_ms", changed.timeout_ms != d.timeout_ms),
            ("complete", changed.complete != d.complete),
            ("poll_fresh_ms", changed.poll_fresh_ms != d.poll_fresh_ms),
            ("mpa_timeout_ms", changed.mpa_timeout_ms != d.mpa_timeout_ms),
            ("wait_spin_us", changed.wait_spin_us != d.wait_spin_us),
            ("poll_yield", changed.poll_yield != d.poll_yield),
            ("setups", changed.setups != d.setups),
        ] {
            assert!(differs, "{field} is not changed by the test");
        }
        assert_eq!(d.named().len(), 12);
        assert_eq!(IaParams::parse("mss=auto", &c).unwrap().mss, None);
    }
}
