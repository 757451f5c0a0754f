//! Many connections on one EVD ("one CQ", as storage targets and MPI
//! ranks use it): the waiting 64-byte round trip of one busy connection
//! whose EVDs `n` idle connections share, against the same round trip on
//! a connection with EVDs of its own beside `n` idle ones, in one process
//! over the tcp provider (127.0.0.x), alternating.
//!
//! ```sh
//! cargo run --release -p rdapl-tcp --example shared_cq -- 10 100 500
//! ```
//!
//! Prints, per `n`, the median of 5 alternating measurements of each
//! layout (µs per round trip) and their ratio. A hand measurement: the
//! benchmark suite does not run it.

use rdapl::*;
use rdapl_tcp::Tcp;
use std::sync::Arc;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(10);
const D: CompletionFlags = CompletionFlags::DEFAULT;
const ROUNDS: u64 = 3_000;
const REPS: usize = 5;

struct Node {
    ia: Ia,
    pz: Pz,
    req: Evd,
    rcv: Evd,
    conn: Evd,
    cr: Evd,
}

impl Node {
    fn new(tcp: &Arc<Tcp>, addr: &str) -> Node {
        let opts = IaOptions {
            params: format!("addr={addr}"),
            ..Default::default()
        };
        let ia = Ia::open_provider(tcp.clone(), opts).unwrap();
        let evd = |f| ia.evd_create(4096, f).unwrap();
        Node {
            pz: ia.pz_create().unwrap(),
            req: evd(EvdFlags::DTO),
            rcv: evd(EvdFlags::DTO),
            conn: evd(EvdFlags::CONNECTION),
            cr: evd(EvdFlags::CR),
            ia,
        }
    }

    fn ep(&self) -> Ep {
        self.ia
            .ep_create(
                &self.pz,
                Some(&self.rcv),
                Some(&self.req),
                Some(&self.conn),
                None,
            )
            .unwrap()
    }
}

fn next(evd: &Evd) -> Event {
    evd.wait(Some(T), 1).expect("an event within 10 s").0
}

/// `n` connections from `c` to `s` (listening on qualifier `q`), every
/// end on its node's EVDs: the client ends, then the server ends.
fn connect(c: &Node, s: &Node, q: u64, n: usize) -> Vec<Ep> {
    let mut eps = Vec::new();
    for _ in 0..n {
        let ep = c.ep();
        ep.connect(s.ia.address(), q, Some(T), b"").unwrap();
        eps.push(ep);
    }
    for _ in 0..n {
        let Event::ConnectionRequest(r) = next(&s.cr) else {
            panic!("expected a connection request")
        };
        let ep = s.ep();
        s.ia.cr(r.cr).unwrap().accept(&ep, b"").unwrap();
        eps.push(ep);
    }
    for _ in 0..n {
        for evd in [&c.conn, &s.conn] {
            if let Event::Connection(e) = next(evd) {
                assert_eq!(e.kind, ConnectionEventKind::Established);
            }
        }
    }
    eps
}

fn listen(ia: &Ia, cr: &Evd, base: u64) -> (Psp, u64) {
    for q in base..base + 1000 {
        if let Ok(p) = ia.psp_create(q, cr) {
            return (p, q);
        }
    }
    panic!("no free port");
}

/// Waiting 64-byte round trips between `cep` (of `c`) and `sep` (of `s`):
/// µs per round trip.
fn round_trips(c: &Node, s: &Node, cep: &Ep, sep: &Ep) -> f64 {
    let lmr = |n: &Node| n.pz.lmr_create_from(vec![7; 64], MemPriv::ALL).unwrap();
    let (cb, sb) = (lmr(c), lmr(s));
    let t = |l: &Lmr| [l.triplet(0, 64).unwrap()];
    let t0 = Instant::now();
    for i in 0..ROUNDS {
        sep.post_recv(&t(&sb), i, D).unwrap();
        cep.post_recv(&t(&cb), i, D).unwrap();
        cep.post_send(&t(&cb), i, D).unwrap();
        assert!(matches!(next(&s.rcv), Event::Dto(d) if d.status == DtoStatus::Success));
        sep.post_send(&t(&sb), i, D).unwrap();
        for evd in [&c.rcv, &c.req, &s.req] {
            assert!(matches!(next(evd), Event::Dto(d) if d.status == DtoStatus::Success));
        }
    }
    t0.elapsed().as_secs_f64() * 1e6 / ROUNDS as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let ns: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a connection count"))
        .collect();
    let ns = if ns.is_empty() {
        vec![10, 100, 500]
    } else {
        ns
    };
    println!("idle connections | shared EVDs µs/rt | own EVDs µs/rt | shared ÷ own");
    for (k, &n) in ns.iter().enumerate() {
        let tcp = Tcp::new();
        let a = |i: usize| format!("127.0.{}.{}", 90 + k, i);
        // Shared: the busy pair's ends on the idle connections' nodes.
        let (sc, ss) = (Node::new(&tcp, &a(1)), Node::new(&tcp, &a(2)));
        let (_p1, q1) = listen(&ss.ia, &ss.cr, 41_000 + 1_000 * k as u64);
        let _idle = connect(&sc, &ss, q1, n);
        let busy = connect(&sc, &ss, q1, 1);
        // Own: the same beside n idle connections of other nodes.
        let (ic, is) = (Node::new(&tcp, &a(3)), Node::new(&tcp, &a(4)));
        let (_p2, q2) = listen(&is.ia, &is.cr, 41_500 + 1_000 * k as u64);
        let _idle2 = connect(&ic, &is, q2, n);
        let (oc, os) = (Node::new(&tcp, &a(5)), Node::new(&tcp, &a(6)));
        let (_p3, q3) = listen(&os.ia, &os.cr, 41_700 + 1_000 * k as u64);
        let own = connect(&oc, &os, q3, 1);
        // Past the start-up timers of every connection.
        std::thread::sleep(Duration::from_millis(1_300));
        let (mut sh, mut ow) = (Vec::new(), Vec::new());
        for _ in 0..REPS {
            sh.push(round_trips(&sc, &ss, &busy[0], &busy[1]));
            ow.push(round_trips(&oc, &os, &own[0], &own[1]));
        }
        let (sh, ow) = (median(sh), median(ow));
        println!("{n} | {sh:.1} | {ow:.1} | {:.2}", sh / ow);
    }
}
