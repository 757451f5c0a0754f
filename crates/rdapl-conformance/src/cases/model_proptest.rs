//! Property test: random sequences of operations on a connected pair of
//! endpoints of the provider under test, checked against a simple model of
//! reliable-connected semantics.
//!
//! The client `A` sends to the server `B`, RDMA-writes into and RDMA-reads
//! from `B`'s memory through several keys (the whole LMR, a read/write
//! window over part of it, a read-only window, a freed LMR's key, unknown
//! keys, an LMR of another PZ), at offsets in and out of range. Receives
//! are posted on `B`. Disconnects, injected failures, injected breaks and
//! reconnects are mixed in. After every operation the test checks that
//!
//! * every posted DTO completed exactly once, with the status the model
//!   predicts (success, the specific error, or `Flushed` once the connection
//!   broke), and quiet (suppressed / unsignalled) successes not at all;
//! * both sides got exactly the connection events predicted;
//! * data arrived intact and in order (each receive holds the message the
//!   model matched to it);
//! * no byte changed anywhere the model did not predict (full snapshots of
//!   the target LMR, the other-PZ LMR, the read sink and every receive
//!   buffer).
//!
//! The model is exact because each operation settles before the next: the
//! test awaits every completion and connection event the model predicts,
//! then (across a network, where a quiet request completes later) until
//! no request is outstanding and the target holds what the model says. A
//! send that finds no receive fails with `ReceiverNotReady` after a short
//! wait: the loopback's RNR time (each case on a fabric of its own, 20 ms),
//! or the provider's [`quick_rnr`](crate::Suite::quick_rnr) parameters;
//! without them the cases skip on providers other than the loopback.
//!
//! Failure persistence is off so a failing run writes no files; proptest
//! prints the minimal failing sequence.

use crate::case;
use crate::support as common;

use common::{Inject, Node, conn_kind, connect_nodes, eventually, next};
use proptest::prelude::*;
use rdapl::error::Subtype;
use rdapl::*;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const RNR: Duration = Duration::from_millis(20);
const TGT_LEN: usize = 256;
const SRC_LEN: usize = 512;
const SINK_LEN: usize = 64;
/// The read/write window: `[WIN.0, WIN.1)` of the target.
const WIN: (usize, usize) = (64, 192);
/// The read-only window.
const RO_WIN: (usize, usize) = (32, 96);
const QUAL: u64 = 77;

#[derive(Copy, Clone, Debug)]
enum Key {
    /// The target LMR's own key (whole region, every right).
    Lmr,
    /// A window over `WIN`, remote read and write.
    Window,
    /// A window over `RO_WIN`, remote read only.
    RoWindow,
    /// The key of an LMR that was freed.
    Dead,
    /// A key whose slot does not exist.
    Bogus(u32),
    /// An LMR of another protection zone of the server's IA.
    OtherPz,
}

#[derive(Clone, Debug)]
enum Op {
    Recv {
        len: usize,
    },
    Send {
        len: usize,
        quiet: bool,
    },
    Write {
        key: Key,
        off: usize,
        len: usize,
        quiet: bool,
    },
    Read {
        key: Key,
        off: usize,
        len: usize,
    },
    Disconnect {
        by_server: bool,
    },
    Fail(DtoStatus),
    Break {
        by_server: bool,
    },
    Reconnect,
}

fn key() -> impl Strategy<Value = Key> {
    prop_oneof![
        3 => Just(Key::Lmr),
        3 => Just(Key::Window),
        2 => Just(Key::RoWindow),
        1 => Just(Key::Dead),
        1 => any::<u32>().prop_map(Key::Bogus),
        1 => Just(Key::OtherPz),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let quiet = prop_oneof![3 => Just(false), 1 => Just(true)];
    prop_oneof![
        5 => (1usize..=48).prop_map(|len| Op::Recv { len }),
        5 => (0usize..=48, quiet.clone()).prop_map(|(len, quiet)| Op::Send { len, quiet }),
        4 => (key(), 0usize..300, 0usize..=48, quiet)
            .prop_map(|(key, off, len, quiet)| Op::Write { key, off, len, quiet }),
        3 => (key(), 0usize..300, 0usize..=48).prop_map(|(key, off, len)| Op::Read { key, off, len }),
        1 => any::<bool>().prop_map(|by_server| Op::Disconnect { by_server }),
        1 => prop_oneof![
            Just(DtoStatus::Transport),
            Just(DtoStatus::LocalEp),
            Just(DtoStatus::BadResponse),
            Just(DtoStatus::RemoteResponder),
        ]
        .prop_map(Op::Fail),
        1 => any::<bool>().prop_map(|by_server| Op::Break { by_server }),
        2 => Just(Op::Reconnect),
    ]
}

/// A fresh pair of addresses per case (and per shrink step), in 127.1/16:
/// the other cases of the suite, in the same process, use 127.0/16.
fn addresses() -> (String, String) {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let (hi, lo) = (n / 100, (n % 100) * 2 + 1);
    assert!(hi < 256, "out of test addresses");
    (format!("127.1.{hi}.{lo}"), format!("127.1.{hi}.{}", lo + 1))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Client `a` and server `b` (listening on [`QUAL`]), connected, with the
/// memory the operations use.
struct World {
    a: Node,
    b: Node,
    _psp: Psp,
    src: Lmr,
    sink: Lmr,
    tgt: Lmr,
    other: Lmr,
    keys: [u32; 5],
}

fn empty(evd: &Evd, what: &str) {
    let e = evd.dequeue().unwrap();
    assert_eq!(e, None, "{what}: unexpected event");
}

impl World {
    fn new() -> World {
        let (aa, ba) = addresses();
        let (a, b) = match common::quick_rnr() {
            Some(params) if !common::on_loopback() => (
                common::open_with(&aa, params),
                common::open_with(&ba, params),
            ),
            _ => {
                let lb = Loopback::new();
                lb.set_rnr_timeout(RNR);
                (common::open_on(&lb, &aa), common::open_on(&lb, &ba))
            }
        };
        let a = Node::of(a, None, 256, 256);
        let b = Node::of(b, None, 256, 256);
        let psp = b.ia.psp_create(QUAL, &b.cr).unwrap();
        let src = a.lmr(pattern(SRC_LEN, 1));
        let sink = a.buf(SINK_LEN);
        let tgt = b.lmr(pattern(TGT_LEN, 2));
        let dead = b.buf(TGT_LEN);
        let k_dead = dead.context().unwrap();
        dead.free().unwrap();
        let pz2 = b.ia.pz_create().unwrap();
        let other = pz2
            .lmr_create_from(pattern(TGT_LEN, 3), MemPriv::ALL)
            .unwrap();
        let mut w = World {
            a,
            b,
            _psp: psp,
            src,
            sink,
            tgt,
            other,
            keys: [0; 5],
        };
        w.connect();
        let rw = w.bind(WIN, MemPriv::REMOTE_READ | MemPriv::REMOTE_WRITE);
        let ro = w.bind(RO_WIN, MemPriv::REMOTE_READ);
        w.keys = [
            w.tgt.context().unwrap(),
            rw,
            ro,
            k_dead,
            w.other.context().unwrap(),
        ];
        w
    }

    fn connect(&self) {
        connect_nodes(&self.a, &self.b, QUAL);
    }

    fn bind(&self, (lo, hi): (usize, usize), privs: MemPriv) -> u32 {
        let rmr = self.b.pz.rmr_create().unwrap();
        let t = self.tgt.triplet(lo as u64, (hi - lo) as u64).unwrap();
        let k = self
            .b
            .ep
            .post_rmr_bind(&rmr, &self.tgt, t, privs, 0, CompletionFlags::DEFAULT)
            .unwrap();
        match next(&self.b.req) {
            Event::Dto(d) => {
                assert_eq!((d.status, d.operation), (DtoStatus::Success, DtoOp::BindMw))
            }
            e => panic!("{e:?}"),
        }
        k
    }

    /// The remote triplet for `key` at `off` (relative to its region).
    fn remote(&self, key: Key, off: usize, len: usize) -> RmrTriplet {
        let (ctx, region) = match key {
            Key::Lmr => (self.keys[0], &self.tgt),
            Key::Window => (self.keys[1], &self.tgt),
            Key::RoWindow => (self.keys[2], &self.tgt),
            Key::Dead => (self.keys[3], &self.tgt),
            Key::Bogus(x) => (0xFF00_0000 | (x & 0x00FF_FFFF), &self.tgt),
            Key::OtherPz => (self.keys[4], &self.other),
        };
        RmrTriplet {
            rmr_context: ctx,
            target_address: region.address().unwrap() + off as u64,
            segment_length: len as u64,
        }
    }
}

/// An expected DTO completion.
#[derive(Debug, PartialEq, Eq)]
struct Exp {
    cookie: u64,
    status: DtoStatus,
    op: DtoOp,
    len: u64,
}

#[derive(Default)]
struct Expect {
    a_req: Vec<Exp>,
    b_rcv: Vec<Exp>,
    conn: Option<ConnectionEventKind>,
}

struct RecvBuf {
    cookie: u64,
    lmr: Lmr,
    len: usize,
    want: Vec<u8>,
}

struct Model {
    connected: bool,
    /// Outstanding receives on B (indices into `bufs`), in post order.
    recvs: VecDeque<usize>,
    bufs: Vec<RecvBuf>,
    tgt: Vec<u8>,
    other: Vec<u8>,
    sink: Vec<u8>,
    /// An injected failure waiting for A's next request.
    fail: Option<DtoStatus>,
    /// Whether a Send or RDMA Write completes once the peer placed it
    /// (`ProviderAttr::completes_when_placed`); else once sent, so a
    /// remote error breaks the connection after the request succeeded.
    placed: bool,
}

impl Model {
    /// The connection ends with `kind`: B's receives flush, in order.
    fn end(&mut self, exp: &mut Expect, kind: ConnectionEventKind) {
        for i in self.recvs.drain(..) {
            exp.b_rcv.push(Exp {
                cookie: self.bufs[i].cookie,
                status: DtoStatus::Flushed,
                op: DtoOp::Receive,
                len: 0,
            });
        }
        self.connected = false;
        exp.conn = Some(kind);
    }

    /// The start of every A request, posted with result `r`: refused while
    /// disconnected, else accepted; an injected failure waiting for it fails
    /// it. True when the request then runs as usual.
    fn runs(&mut self, exp: &mut Expect, r: Result<()>, cookie: u64, op: DtoOp) -> bool {
        if !self.connected {
            refused(r);
            return false;
        }
        r.unwrap();
        match self.fail.take() {
            Some(st) => {
                self.fail(exp, cookie, op, st);
                false
            }
            None => true,
        }
    }

    /// A Send or RDMA Write of `len` bytes that the peer refuses with
    /// `status` for A: reported so when completions wait for placement;
    /// else it already succeeded (quietly if `quiet`). Then the connection
    /// breaks.
    fn refused_by_peer(
        &mut self,
        exp: &mut Expect,
        (cookie, op, len, quiet): (u64, DtoOp, usize, bool),
        status: DtoStatus,
    ) {
        if self.placed {
            return self.fail(exp, cookie, op, status);
        }
        if !quiet {
            exp.a_req.push(Exp {
                cookie,
                status: DtoStatus::Success,
                op,
                len: len as u64,
            });
        }
        self.end(exp, ConnectionEventKind::Broken);
    }

    /// An A request failed with `status`: reported, then the connection breaks.
    fn fail(&mut self, exp: &mut Expect, cookie: u64, op: DtoOp, status: DtoStatus) {
        exp.a_req.push(Exp {
            cookie,
            status,
            op,
            len: 0,
        });
        self.end(exp, ConnectionEventKind::Broken);
    }
}

fn src_off(cookie: u64) -> usize {
    (cookie as usize * 37) % (SRC_LEN - 48)
}

/// Is an access of `len` bytes at `off` through `key` allowed (`write`: as
/// an RDMA write)?
fn allowed(key: Key, off: usize, len: usize, write: bool) -> bool {
    let within = |(lo, hi): (usize, usize)| off >= lo && off + len <= hi;
    match key {
        Key::Lmr => within((0, TGT_LEN)),
        Key::Window => within(WIN),
        Key::RoWindow => !write && within(RO_WIN),
        Key::Dead | Key::Bogus(_) | Key::OtherPz => false,
    }
}

fn quiet_flag(quiet: bool, cookie: u64) -> CompletionFlags {
    match (quiet, cookie % 2) {
        (false, _) => CompletionFlags::DEFAULT,
        (true, 0) => CompletionFlags::SUPPRESS,
        (true, _) => CompletionFlags::UNSIGNALLED,
    }
}

fn refused<T: std::fmt::Debug>(r: Result<T>) {
    assert!(
        matches!(
            r,
            Err(Error::InvalidState {
                state: Subtype::InvalidStateEpDisconnected,
                ..
            })
        ),
        "posting on a disconnected endpoint: {r:?}"
    );
}

fn step(w: &World, m: &mut Model, cookie: u64, op: &Op) -> Expect {
    let mut exp = Expect::default();
    let a_op = |op: DtoOp, status: DtoStatus, len: usize| Exp {
        cookie,
        status,
        op,
        len: len as u64,
    };
    match *op {
        Op::Recv { len } => {
            let lmr = w.b.buf(len);
            let r = w.b.ep.post_recv(
                &[lmr.triplet(0, len as u64).unwrap()],
                cookie,
                CompletionFlags::DEFAULT,
            );
            m.bufs.push(RecvBuf {
                cookie,
                lmr,
                len,
                want: vec![0; len],
            });
            if m.connected {
                r.unwrap();
                m.recvs.push_back(m.bufs.len() - 1);
            } else {
                refused(r);
            }
        }
        Op::Send { len, quiet } => {
            let so = src_off(cookie);
            let r = w.a.ep.post_send(
                &[w.src.triplet(so as u64, len as u64).unwrap()],
                cookie,
                quiet_flag(quiet, cookie),
            );
            if !m.runs(&mut exp, r, cookie, DtoOp::Send) {
                return exp;
            }
            if let Some(i) = m.recvs.pop_front() {
                let b = &mut m.bufs[i];
                if len <= b.len {
                    if !quiet {
                        exp.a_req.push(a_op(DtoOp::Send, DtoStatus::Success, len));
                    }
                    exp.b_rcv.push(Exp {
                        cookie: b.cookie,
                        status: DtoStatus::Success,
                        op: DtoOp::Receive,
                        len: len as u64,
                    });
                    let payload = pattern(SRC_LEN, 1)[so..so + len].to_vec();
                    b.want[..len].copy_from_slice(&payload);
                } else {
                    let rcv = Exp {
                        cookie: b.cookie,
                        status: DtoStatus::LocalLength,
                        op: DtoOp::Receive,
                        len: 0,
                    };
                    let send = (cookie, DtoOp::Send, len, quiet);
                    m.refused_by_peer(&mut exp, send, DtoStatus::RemoteResponder);
                    // (The receive ends first, before the flushes.)
                    exp.b_rcv.insert(0, rcv);
                }
            } else {
                // No receive: the send waits the RNR time and fails.
                let send = (cookie, DtoOp::Send, len, quiet);
                m.refused_by_peer(&mut exp, send, DtoStatus::ReceiverNotReady);
            }
        }
        Op::Write {
            key,
            off,
            len,
            quiet,
        } => {
            let so = src_off(cookie);
            let r = w.a.ep.post_rdma_write(
                &[w.src.triplet(so as u64, len as u64).unwrap()],
                w.remote(key, off, len),
                cookie,
                quiet_flag(quiet, cookie),
            );
            if !m.runs(&mut exp, r, cookie, DtoOp::RdmaWrite) {
                return exp;
            }
            if len == 0 || allowed(key, off, len, true) {
                if !quiet {
                    exp.a_req
                        .push(a_op(DtoOp::RdmaWrite, DtoStatus::Success, len));
                }
                // A zero-length write moves nothing (and checks no key).
                if len > 0 {
                    let payload = pattern(SRC_LEN, 1)[so..so + len].to_vec();
                    m.tgt[off..off + len].copy_from_slice(&payload);
                }
            } else {
                let write = (cookie, DtoOp::RdmaWrite, len, quiet);
                m.refused_by_peer(&mut exp, write, DtoStatus::RemoteAccess);
            }
        }
        Op::Read { key, off, len } => {
            let r = w.a.ep.post_rdma_read(
                &[w.sink.triplet(0, len as u64).unwrap()],
                w.remote(key, off, len),
                cookie,
                CompletionFlags::DEFAULT,
            );
            if !m.runs(&mut exp, r, cookie, DtoOp::RdmaRead) {
                return exp;
            }
            if len == 0 || allowed(key, off, len, false) {
                exp.a_req
                    .push(a_op(DtoOp::RdmaRead, DtoStatus::Success, len));
                if len > 0 {
                    let data = m.tgt[off..off + len].to_vec();
                    m.sink[..len].copy_from_slice(&data);
                }
            } else {
                m.fail(&mut exp, cookie, DtoOp::RdmaRead, DtoStatus::RemoteAccess);
            }
        }
        Op::Disconnect { by_server } => {
            let ep = if by_server { &w.b.ep } else { &w.a.ep };
            ep.disconnect(!by_server).unwrap();
            if m.connected {
                m.end(&mut exp, ConnectionEventKind::Disconnected);
            }
        }
        Op::Fail(st) => {
            w.a.ep.inject_failure(st);
            m.fail = Some(st);
        }
        Op::Break { by_server } => {
            let ep = if by_server { &w.b.ep } else { &w.a.ep };
            ep.inject_break();
            if m.connected {
                m.end(&mut exp, ConnectionEventKind::Broken);
            }
        }
        Op::Reconnect => {
            if !m.connected {
                w.a.ep.reset().unwrap();
                w.b.ep.reset().unwrap();
                w.connect();
                m.connected = true;
            }
        }
    }
    exp
}

fn check(w: &World, m: &Model, exp: Expect, what: &str) {
    let got = |evd: &Evd, ep: &Ep| {
        let d = match next(evd) {
            Event::Dto(d) => d,
            e => panic!("{what}: expected a DTO completion, got {e:?}"),
        };
        assert_eq!(d.ep, ep.handle(), "{what}");
        Exp {
            cookie: d.cookie,
            status: d.status,
            op: d.operation,
            len: d.transferred_length,
        }
    };
    for e in exp.a_req {
        assert_eq!(got(&w.a.req, &w.a.ep), e, "{what}: A's request EVD");
    }
    for e in exp.b_rcv {
        assert_eq!(got(&w.b.rcv, &w.b.ep), e, "{what}: B's receive EVD");
    }
    if let Some(k) = exp.conn {
        assert_eq!(conn_kind(&w.a.conn), k, "{what}: A's connection EVD");
        assert_eq!(conn_kind(&w.b.conn), k, "{what}: B's connection EVD");
    }
    for (evd, name) in [
        (&w.a.req, "A request"),
        (&w.a.rcv, "A receive"),
        (&w.a.conn, "A connection"),
        (&w.b.req, "B request"),
        (&w.b.rcv, "B receive"),
        (&w.b.conn, "B connection"),
        (&w.b.cr, "B CR"),
    ] {
        empty(evd, &format!("{what}: {name} EVD"));
    }
    let state = if m.connected {
        EpState::Connected
    } else {
        EpState::Disconnected
    };
    assert_eq!(w.a.ep.state(), state, "{what}: A's state");
    assert_eq!(w.b.ep.state(), state, "{what}: B's state");
    if !common::in_process() {
        // A quiet request completes (with no event) when the peer's
        // answer comes; settled before the next operation, so that a
        // break that follows flushes nothing the model did not see.
        eventually(common::T, || {
            w.a.ep.query().unwrap().outstanding == (0, 0) && w.tgt.to_vec().unwrap() == m.tgt
        });
    }
    assert_eq!(
        w.b.ep.query().unwrap().outstanding,
        (0, m.recvs.len()),
        "{what}: B's queues"
    );
    assert_eq!(
        w.a.ep.query().unwrap().outstanding,
        (0, 0),
        "{what}: A's queues"
    );
    assert!(w.tgt.to_vec().unwrap() == m.tgt, "{what}: target bytes");
    assert!(
        w.other.to_vec().unwrap() == m.other,
        "{what}: other-PZ bytes"
    );
    assert!(
        w.sink.to_vec().unwrap() == m.sink,
        "{what}: read sink bytes"
    );
    assert!(
        w.src.to_vec().unwrap() == pattern(SRC_LEN, 1),
        "{what}: source bytes"
    );
    for b in &m.bufs {
        assert!(
            b.lmr.to_vec().unwrap() == b.want,
            "{what}: receive buffer of cookie {}",
            b.cookie
        );
    }
}

/// False (after saying why, once) when the model cannot run on the
/// provider under test.
fn runs_here() -> bool {
    if common::on_loopback() || common::quick_rnr().is_some() {
        return true;
    }
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        eprintln!(
            "skipped on {}: no quick_rnr parameters (a send without a receive would wait the provider's full time)",
            common::provider().attr().name
        )
    });
    false
}

fn run(ops: &[Op]) {
    if !runs_here() {
        return;
    }
    let w = World::new();
    let mut m = Model {
        connected: true,
        recvs: VecDeque::new(),
        bufs: Vec::new(),
        tgt: pattern(TGT_LEN, 2),
        other: pattern(TGT_LEN, 3),
        sink: vec![0; SINK_LEN],
        fail: None,
        placed: common::provider().attr().completes_when_placed,
    };
    check(&w, &m, Expect::default(), "after setup");
    for (i, op) in ops.iter().enumerate() {
        let cookie = 1 + i as u64;
        let exp = step(&w, &mut m, cookie, op);
        check(&w, &m, exp, &format!("op #{i} {op:?}"));
    }
    if !common::in_process() {
        // Nothing comes late.
        std::thread::sleep(common::QUIET);
        check(&w, &m, Expect::default(), "at the end");
    }
    w.a.ia.close(CloseFlags::Abrupt).unwrap();
    w.b.ia.close(CloseFlags::Abrupt).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[case]
    fn random_operation_sequences(ops in prop::collection::vec(op(), 1..=30)) {
        run(&ops);
    }
}

/// A fixed sequence through every branch of the model (a smoke test of the
/// harness itself, independent of what proptest generates).
#[case]
fn model_covers_every_branch() {
    use Op::*;
    run(&[
        Recv { len: 16 },
        Send {
            len: 16,
            quiet: false,
        },
        Recv { len: 8 },
        Send {
            len: 4,
            quiet: true,
        },
        Write {
            key: Key::Lmr,
            off: 0,
            len: 16,
            quiet: false,
        },
        Write {
            key: Key::Window,
            off: 100,
            len: 8,
            quiet: true,
        },
        Read {
            key: Key::RoWindow,
            off: 40,
            len: 16,
        },
        Read {
            key: Key::Window,
            off: 299,
            len: 0,
        },
        Write {
            key: Key::Dead,
            off: 299,
            len: 0,
            quiet: false,
        },
        Recv { len: 4 },
        Send {
            len: 8,
            quiet: false,
        },
        Reconnect,
        Write {
            key: Key::RoWindow,
            off: 40,
            len: 8,
            quiet: false,
        },
        Reconnect,
        Write {
            key: Key::Dead,
            off: 0,
            len: 8,
            quiet: true,
        },
        Reconnect,
        Read {
            key: Key::OtherPz,
            off: 0,
            len: 8,
        },
        Reconnect,
        Read {
            key: Key::Bogus(7),
            off: 0,
            len: 8,
        },
        Reconnect,
        Write {
            key: Key::Lmr,
            off: 250,
            len: 8,
            quiet: false,
        },
        Reconnect,
        Send {
            len: 4,
            quiet: false,
        },
        Reconnect,
        Recv { len: 4 },
        Fail(DtoStatus::Transport),
        Read {
            key: Key::Lmr,
            off: 0,
            len: 4,
        },
        Send {
            len: 4,
            quiet: false,
        },
        Fail(DtoStatus::LocalEp),
        Reconnect,
        Recv { len: 4 },
        Write {
            key: Key::Bogus(1),
            off: 0,
            len: 0,
            quiet: false,
        },
        Disconnect { by_server: true },
        Disconnect { by_server: false },
        Reconnect,
        Recv { len: 4 },
        Break { by_server: false },
        Break { by_server: true },
        Reconnect,
        Recv { len: 4 },
        Send {
            len: 4,
            quiet: false,
        },
    ]);
}
