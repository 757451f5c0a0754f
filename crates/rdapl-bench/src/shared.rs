//! Benchmark 6: many connections on one EVD (one CQ for many
//! connections, as storage targets and MPI ranks use it), over the TCP
//! provider in this process (127.0.0.x).
//!
//! The subject is a connection whose EVDs `n` idle connections share; its
//! peer, the same connection layout with EVDs of its own beside `n` idle
//! connections of other EVDs. Both do waiting 64-byte round trips (post a
//! receive each side, send, `wait` for each completion), back to back in
//! every repetition; the figure is µs per round trip and the ratio is
//! shared ÷ own: what sharing an EVD with idle connections costs. No
//! outside program takes part, so it runs on every machine.

use crate::stats::{Summary, rep_ratios};
use rdapl::*;
use rdapl_tcp::Tcp;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Parameters.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Params {
    /// Idle connections beside the measured one.
    pub idle: Vec<usize>,
    /// Round trips per measurement.
    pub rounds: u64,
    /// Bound of every wait.
    pub timeout: Duration,
}

/// One row: a count of idle connections.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// `tcp-shared/<n>`.
    pub id: String,
    /// Idle connections.
    pub idle: usize,
    /// µs per round trip with the EVDs shared, per repetition.
    pub shared_us: Summary,
    /// µs per round trip with EVDs of its own, per repetition.
    pub own_us: Summary,
    /// shared ÷ own in the same repetition.
    pub ratio: Summary,
    /// Why the row failed (a setup or a round trip that did not complete).
    pub error: Option<String>,
}

type R<T> = std::result::Result<T, String>;

struct Node {
    ia: Ia,
    pz: Pz,
    req: Evd,
    rcv: Evd,
    conn: Evd,
    cr: Evd,
}

impl Node {
    fn new(tcp: &Arc<Tcp>, addr: &str) -> R<Node> {
        let e = |e: Error| format!("{addr}: {e}");
        let opts = IaOptions {
            params: format!("addr={addr}"),
            ..Default::default()
        };
        let ia = Ia::open_provider(tcp.clone(), opts).map_err(e)?;
        let evd = |f| ia.evd_create(4096, f).map_err(e);
        Ok(Node {
            pz: ia.pz_create().map_err(e)?,
            req: evd(EvdFlags::DTO)?,
            rcv: evd(EvdFlags::DTO)?,
            conn: evd(EvdFlags::CONNECTION)?,
            cr: evd(EvdFlags::CR)?,
            ia,
        })
    }

    fn ep(&self) -> R<Ep> {
        self.ia
            .ep_create(
                &self.pz,
                Some(&self.rcv),
                Some(&self.req),
                Some(&self.conn),
                None,
            )
            .map_err(|e| e.to_string())
    }
}

fn next(evd: &Evd, t: Duration) -> R<Event> {
    evd.wait(Some(t), 1)
        .map(|(e, _)| e)
        .map_err(|e| format!("no event within {t:?}: {e}"))
}

/// A listener of `ia` on a free qualifier from `base`.
fn listen(ia: &Ia, cr: &Evd, base: u64) -> R<(Psp, u64)> {
    for q in base..base + 2000 {
        match ia.psp_create(q, cr) {
            Ok(p) => return Ok((p, q)),
            Err(Error::ConnQualInUse(_)) => continue,
            Err(e) => return Err(format!("listen: {e}")),
        }
    }
    Err("no free port".into())
}

/// `n` connections from `c` to `s` (qualifier `q`), every end on its
/// node's EVDs: the client ends, then the server ends.
fn connect(c: &Node, s: &Node, q: u64, n: usize, t: Duration) -> R<Vec<Ep>> {
    let mut eps = Vec::new();
    for _ in 0..n {
        let ep = c.ep()?;
        ep.connect(s.ia.address(), q, Some(t), b"")
            .map_err(|e| format!("connect: {e}"))?;
        eps.push(ep);
    }
    for _ in 0..n {
        let Event::ConnectionRequest(r) = next(&s.cr, t)? else {
            return Err("expected a connection request".into());
        };
        let ep = s.ep()?;
        s.ia.cr(r.cr)
            .and_then(|cr| cr.accept(&ep, b""))
            .map_err(|e| format!("accept: {e}"))?;
        eps.push(ep);
    }
    for _ in 0..n {
        for evd in [&c.conn, &s.conn] {
            match next(evd, t)? {
                Event::Connection(e) if e.kind == ConnectionEventKind::Established => {}
                e => return Err(format!("expected Established, got {e:?}")),
            }
        }
    }
    Ok(eps)
}

/// Waiting 64-byte round trips between `cep` (of `c`) and `sep` (of `s`):
/// µs per round trip.
fn round_trips(c: &Node, s: &Node, cep: &Ep, sep: &Ep, p: &Params) -> R<f64> {
    let e = |e: Error| e.to_string();
    let (cb, sb) = (
        c.pz.lmr_create_from(vec![7; 64], MemPriv::ALL).map_err(e)?,
        s.pz.lmr_create_from(vec![9; 64], MemPriv::ALL).map_err(e)?,
    );
    let tc = [cb.triplet(0, 64).map_err(e)?];
    let ts = [sb.triplet(0, 64).map_err(e)?];
    let ok = |evd: &Evd| -> R<()> {
        match next(evd, p.timeout)? {
            Event::Dto(d) if d.status == DtoStatus::Success => Ok(()),
            ev => Err(format!("expected a successful completion, got {ev:?}")),
        }
    };
    let d = CompletionFlags::DEFAULT;
    let t0 = Instant::now();
    for i in 0..p.rounds {
        sep.post_recv(&ts, i, d).map_err(e)?;
        cep.post_recv(&tc, i, d).map_err(e)?;
        cep.post_send(&tc, i, d).map_err(e)?;
        ok(&s.rcv)?;
        sep.post_send(&ts, i, d).map_err(e)?;
        ok(&c.rcv)?;
        ok(&c.req)?;
        ok(&s.req)?;
    }
    Ok(t0.elapsed().as_secs_f64() * 1e6 / p.rounds as f64)
}

/// Measures one count of idle connections (`k`: its place, for
/// addresses and ports).
fn measure(n: usize, k: usize, p: &Params, reps: usize) -> R<(Vec<f64>, Vec<f64>)> {
    let tcp = Tcp::new();
    let t = p.timeout;
    let a = |i: usize| format!("127.0.{}.{}", 120 + k, i);
    let base = 42_000 + 3_000 * k as u64 + u64::from(std::process::id() % 7) * 300;
    // Shared: the measured pair's ends on the idle connections' nodes.
    let (sc, ss) = (Node::new(&tcp, &a(1))?, Node::new(&tcp, &a(2))?);
    let (_p1, q1) = listen(&ss.ia, &ss.cr, base)?;
    let _idle = connect(&sc, &ss, q1, n, t)?;
    let busy = connect(&sc, &ss, q1, 1, t)?;
    // Own: the same beside n idle connections of other nodes.
    let (ic, is) = (Node::new(&tcp, &a(3))?, Node::new(&tcp, &a(4))?);
    let (_p2, q2) = listen(&is.ia, &is.cr, base + 100)?;
    let _idle2 = connect(&ic, &is, q2, n, t)?;
    let (oc, os) = (Node::new(&tcp, &a(5))?, Node::new(&tcp, &a(6))?);
    let (_p3, q3) = listen(&os.ia, &os.cr, base + 200)?;
    let own = connect(&oc, &os, q3, 1, t)?;
    // Past the start-up timers of every connection (the active sides'
    // nudges end 1050 ms after the MPA Reply).
    std::thread::sleep(Duration::from_millis(1_300));
    let (mut sh, mut ow) = (Vec::new(), Vec::new());
    for r in 0..reps {
        // Alternate which goes first.
        if r % 2 == 0 {
            sh.push(round_trips(&sc, &ss, &busy[0], &busy[1], p)?);
            ow.push(round_trips(&oc, &os, &own[0], &own[1], p)?);
        } else {
            ow.push(round_trips(&oc, &os, &own[0], &own[1], p)?);
            sh.push(round_trips(&sc, &ss, &busy[0], &busy[1], p)?);
        }
    }
    Ok((sh, ow))
}

/// Runs the benchmark.
pub fn run(p: &Params, reps: usize, progress: impl Fn(&str)) -> Vec<Row> {
    let mut rows = Vec::new();
    for (k, &n) in p.idle.iter().enumerate() {
        progress(&format!("{n} idle connections"));
        let (sh, ow, error) = match measure(n, k, p, reps) {
            Ok((s, o)) => (s, o, None),
            Err(e) => (Vec::new(), Vec::new(), Some(e)),
        };
        let ratio = rep_ratios(&sh, &ow, sh.len().min(ow.len()));
        rows.push(Row {
            id: format!("tcp-shared/{n}"),
            idle: n,
            shared_us: Summary::of(&sh),
            own_us: Summary::of(&ow),
            ratio: Summary::of(&ratio),
            error,
        });
    }
    rows
}
