//! A provider written outside the core crate, with its public provider
//! interface alone (`rdapl::provider`): "pipe", which connects IAs of one
//! process and moves every request on a progress thread of its own, so
//! that completions arrive asynchronously, never inside the poster's call
//! (as a network provider's do). The tests run the object model's flows on
//! it: connection management with private data, sends and receives, RDMA
//! writes and reads, protection errors, disconnect and free flushing
//! exactly once, with every byte checked.

mod common;

use common::{D, Node, Pair, conn_ev, conn_kind, empty, flushed, ia_options, next_cr, next_dto};
use rdapl::error::Subtype;
use rdapl::event::{CrHandle, EpHandle};
use rdapl::provider::{CrInner, CrState, EpInner, NewWr, Provider, SpInner, Transport, WrKind};
use rdapl::*;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

// ----- the provider -------------------------------------------------------------

struct Pipe {
    fabric: Arc<Fabric>,
}

/// A connected endpoint's peer, the peer's connection number and its own.
type PeerOf = (Weak<EpInner>, u64, u64);

/// What the IAs of one pipe share: listeners, requests in flight, the
/// connected pairs, and the progress thread's queue.
struct Fabric {
    listeners: Mutex<HashMap<(IpAddr, u64), Weak<SpInner>>>,
    pending: Mutex<HashMap<CrHandle, Weak<EpInner>>>,
    /// Each connected endpoint: its peer, the peer's connection number and
    /// its own.
    peers: Mutex<HashMap<EpHandle, PeerOf>>,
    jobs: Mutex<mpsc::Sender<Weak<EpInner>>>,
}

impl Pipe {
    fn new() -> Arc<Pipe> {
        let (tx, rx) = mpsc::channel::<Weak<EpInner>>();
        let fabric = Arc::new(Fabric {
            listeners: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            peers: Mutex::new(HashMap::new()),
            jobs: Mutex::new(tx),
        });
        let f = Arc::downgrade(&fabric);
        std::thread::spawn(move || {
            while let Ok(ep) = rx.recv() {
                let (Some(f), Some(ep)) = (f.upgrade(), ep.upgrade()) else {
                    continue;
                };
                f.progress(&ep);
            }
        });
        Arc::new(Pipe { fabric })
    }
}

impl Provider for Pipe {
    fn attr(&self) -> ProviderAttr {
        ProviderAttr {
            name: "pipe".into(),
            description: "test provider outside the core crate".into(),
            ..Loopback::new().attr()
        }
    }

    fn ia_attr(&self, address: IpAddr) -> IaAttr {
        IaAttr {
            adapter_name: "pipe0".into(),
            ..Loopback::new().ia_attr(address)
        }
    }

    fn open(&self, params: &str) -> Result<Arc<dyn Transport>> {
        let addr = params
            .strip_prefix("addr=")
            .and_then(|a| a.parse().ok())
            .ok_or(Error::InvalidParameter {
                arg: 1,
                what: "pipe: addr=IP",
            })?;
        Ok(Arc::new(PipeIa {
            f: self.fabric.clone(),
            addr,
        }))
    }
}

struct PipeIa {
    f: Arc<Fabric>,
    addr: IpAddr,
}

impl Fabric {
    fn kick(&self, ep: &Arc<EpInner>) {
        let _ = self.jobs.lock().unwrap().send(Arc::downgrade(ep));
    }

    fn peer(&self, ep: &EpInner) -> Option<(Arc<EpInner>, u64, u64)> {
        let peers = self.peers.lock().unwrap();
        let (p, pc, mc) = peers.get(&ep.handle())?;
        Some((p.upgrade()?, *pc, *mc))
    }

    /// Ends both sides of `ep`'s connection with `kind`.
    fn end(&self, ep: &Arc<EpInner>, kind: ConnectionEventKind) {
        let peer = self.peers.lock().unwrap().remove(&ep.handle());
        ep.ended(kind);
        if let Some(p) = peer.and_then(|(p, _, _)| p.upgrade()) {
            self.peers.lock().unwrap().remove(&p.handle());
            p.ended(kind);
        }
    }

    /// Executes `ep`'s queued requests in order until the queue is empty
    /// or the head waits for a receive of the peer.
    fn progress(&self, ep: &Arc<EpInner>) {
        loop {
            let Some((peer, peer_conn, my_conn)) = self.peer(ep) else {
                return;
            };
            let mut core = ep.lock();
            if core.connection() != my_conn {
                return;
            }
            let Some(kind) = core.front_send().map(|w| w.kind()) else {
                return;
            };
            match kind {
                WrKind::Send => {
                    // Waits (for a kick) until the peer posts a receive.
                    let Some(mut r) = peer.take_recv(peer_conn) else {
                        return;
                    };
                    let wr = core.pop_send().unwrap();
                    drop(core);
                    let mut data = Vec::new();
                    if let Err(st) = ep.gather(&wr, &mut data) {
                        ep.complete(wr, st, 0);
                        peer.complete_recv(r, DtoStatus::Flushed, 0);
                        return self.end(ep, ConnectionEventKind::Broken);
                    }
                    // Placed in segments of 5 bytes, as a wire would
                    // deliver them (the last segment checks the length).
                    let mut placed = Ok(0);
                    for (k, seg) in data.chunks(5).enumerate() {
                        placed = peer.scatter_at(&mut r, 5 * k as u64, seg);
                        if placed.is_err() {
                            break;
                        }
                    }
                    if data.is_empty() {
                        placed = peer.scatter(&mut r, &data);
                    }
                    match placed.map(|_| data.len() as u64) {
                        Ok(n) => {
                            ep.complete(wr, DtoStatus::Success, n);
                            peer.complete_recv(r, DtoStatus::Success, n);
                        }
                        Err(st) => {
                            ep.complete(wr, DtoStatus::RemoteResponder, 0);
                            peer.complete_recv(r, st, 0);
                            return self.end(ep, ConnectionEventKind::Broken);
                        }
                    }
                }
                WrKind::RdmaWrite(rt) => {
                    let wr = core.pop_send().unwrap();
                    drop(core);
                    let mut data = Vec::new();
                    let moved = ep
                        .gather(&wr, &mut data)
                        .and_then(|()| peer.remote_write(rt, &data));
                    match moved {
                        Ok(()) => ep.complete(wr, DtoStatus::Success, data.len() as u64),
                        Err(st) => {
                            ep.complete(wr, st, 0);
                            return self.end(ep, ConnectionEventKind::Broken);
                        }
                    }
                }
                WrKind::RdmaRead(rt) => {
                    let wr = core.pop_send().unwrap();
                    drop(core);
                    let len: u64 = wr.iov().iter().map(|t| t.segment_length).sum();
                    let mut data = vec![0; len as usize];
                    let moved = peer
                        .remote_read(rt, &mut data)
                        .and_then(|()| ep.scatter_read(&wr, 0, &data));
                    match moved {
                        Ok(n) => ep.complete(wr, DtoStatus::Success, n),
                        Err(st) => {
                            ep.complete(wr, st, 0);
                            return self.end(ep, ConnectionEventKind::Broken);
                        }
                    }
                }
                WrKind::Local => {
                    let wr = core.pop_send().unwrap();
                    drop(core);
                    ep.execute_local(wr);
                }
            }
        }
    }
}

impl Transport for PipeIa {
    fn address(&self) -> IpAddr {
        self.addr
    }

    fn listen(&self, sp: &Arc<SpInner>) -> Result<()> {
        let mut l = self.f.listeners.lock().unwrap();
        let key = (self.addr, sp.conn_qual());
        if l.get(&key)
            .and_then(Weak::upgrade)
            .is_some_and(|s| !s.freed())
        {
            return Err(Error::ConnQualInUse(sp.conn_qual()));
        }
        l.insert(key, Arc::downgrade(sp));
        Ok(())
    }

    fn unlisten(&self, sp: &SpInner) {
        let mut l = self.f.listeners.lock().unwrap();
        let key = (self.addr, sp.conn_qual());
        if l.get(&key).is_some_and(|w| std::ptr::eq(w.as_ptr(), sp)) {
            l.remove(&key);
        }
    }

    fn connect(
        &self,
        ep: &Arc<EpInner>,
        remote: IpAddr,
        conn_qual: u64,
        private_data: Vec<u8>,
        _timeout: Option<Duration>,
    ) -> Result<()> {
        let sp = self
            .f
            .listeners
            .lock()
            .unwrap()
            .get(&(remote, conn_qual))
            .and_then(Weak::upgrade);
        let Some(sp) = sp else {
            ep.connect_failed(ConnectionEventKind::NonPeerRejected, None);
            return Ok(());
        };
        // Recorded before the request is visible: an accept may come at once.
        let mut pending = self.f.pending.lock().unwrap();
        match sp.request(self.addr, private_data) {
            Ok(cr) => {
                pending.insert(cr.handle(), Arc::downgrade(ep));
            }
            Err(_) => {
                drop(pending);
                ep.connect_failed(ConnectionEventKind::NonPeerRejected, None);
            }
        }
        Ok(())
    }

    fn accept(&self, cr: &Arc<CrInner>, ep: &Arc<EpInner>, private_data: Vec<u8>) -> Result<()> {
        if !cr.settle_as(CrState::Accepted) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
        }
        let active = self.f.pending.lock().unwrap().remove(&cr.handle());
        let Some(active) = active.and_then(|a| a.upgrade()) else {
            return Err(Error::Abort("the connecting endpoint went away"));
        };
        let passive_conn = ep
            .established((cr.remote(), cr.qualifier()), None)
            .ok_or(Error::Abort("the accepting endpoint went away"))?;
        let Some(active_conn) =
            active.established((self.addr, cr.qualifier()), Some(&private_data))
        else {
            ep.ended(ConnectionEventKind::Broken);
            return Ok(());
        };
        let mut peers = self.f.peers.lock().unwrap();
        peers.insert(
            ep.handle(),
            (Arc::downgrade(&active), active_conn, passive_conn),
        );
        peers.insert(
            active.handle(),
            (Arc::downgrade(ep), passive_conn, active_conn),
        );
        drop(peers);
        // Requests may have been queued before the connection was up.
        self.f.kick(ep);
        self.f.kick(&active);
        Ok(())
    }

    fn reject(&self, cr: &Arc<CrInner>, private_data: Vec<u8>) -> Result<()> {
        if !cr.settle_as(CrState::Rejected) {
            return Err(Error::InvalidHandle(Subtype::InvalidHandleCr));
        }
        let active = self.f.pending.lock().unwrap().remove(&cr.handle());
        if let Some(a) = active.and_then(|a| a.upgrade()) {
            a.connect_failed(ConnectionEventKind::PeerRejected, Some(&private_data));
        }
        Ok(())
    }

    fn disconnect(&self, ep: &Arc<EpInner>, _graceful: bool) {
        self.f.end(ep, ConnectionEventKind::Disconnected);
    }

    fn kick(&self, ep: &Arc<EpInner>, recv: bool) {
        if recv {
            if let Some((p, _, _)) = self.f.peer(ep) {
                self.f.kick(&p);
            }
        } else {
            self.f.kick(ep);
        }
    }

    fn submit(&self, ep: &Arc<EpInner>, mut core: rdapl::provider::EpLock<'_>, wr: NewWr<'_>) {
        core.push_send(wr.queued());
        drop(core);
        self.f.kick(ep);
    }

    fn srq_posted(&self, _srq: &rdapl::srq::SrqInner) {}

    fn close(&self) {}
}

// ----- the tests ----------------------------------------------------------------

fn node(pipe: &Arc<Pipe>, addr: &str) -> Node {
    let ia = Ia::open_provider(pipe.clone(), ia_options(addr)).unwrap();
    Node::of(ia, None, 64, 64)
}

fn pipe_pair(qual: u64) -> Pair {
    let pipe = Pipe::new();
    let p = Pair::new(node(&pipe, "127.0.90.1"), node(&pipe, "127.0.90.2"), qual);
    p.connect();
    p
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

#[test]
fn the_provider_is_named_and_opens_ias() {
    let pipe = Pipe::new();
    let ia = Ia::open_provider(pipe.clone(), ia_options("127.0.91.1")).unwrap();
    let (attr, pattr) = ia.query().unwrap();
    assert_eq!(pattr.name, "pipe");
    assert_eq!(attr.adapter_name, "pipe0");
    let reg = Registry::with_builtin();
    reg.register(pipe).unwrap();
    assert_eq!(
        reg.names(),
        vec!["loopback".to_string(), "pipe".to_string()]
    );
    assert!(reg.open("pipe", ia_options("127.0.91.2")).is_ok());
}

#[test]
fn connect_accept_and_reject_carry_private_data() {
    let pipe = Pipe::new();
    let (c, s) = (node(&pipe, "127.0.92.1"), node(&pipe, "127.0.92.2"));
    let _psp = s.ia.psp_create(70, &s.cr).unwrap();
    c.ep.connect(s.ia.address(), 70, Some(common::T), b"hello")
        .unwrap();
    let cr = next_cr(&s.ia, &s.cr);
    assert_eq!(cr.private_data(), b"hello");
    assert_eq!(cr.remote_address(), c.ia.address());
    cr.reject(b"no").unwrap();
    let e = conn_ev(&c.conn);
    assert_eq!(e.kind, ConnectionEventKind::PeerRejected);
    assert_eq!(e.private_data.as_deref(), Some(&b"no"[..]));
    assert!(cr.accept(&s.ep, b"").is_err(), "a settled request");
    c.ep.reset().unwrap();
    c.ep.connect(s.ia.address(), 70, Some(common::T), b"again")
        .unwrap();
    next_cr(&s.ia, &s.cr).accept(&s.ep, b"welcome").unwrap();
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    let e = conn_ev(&c.conn);
    assert_eq!(e.kind, ConnectionEventKind::Established);
    assert_eq!(e.private_data.as_deref(), Some(&b"welcome"[..]));
    assert_eq!(
        c.ep.query().unwrap().peer_private_data.as_deref(),
        Some(&b"welcome"[..])
    );
    // Nobody listens on 71.
    let c2 = c.ep2();
    c2.connect(s.ia.address(), 71, Some(common::T), b"")
        .unwrap();
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::NonPeerRejected);
}

#[test]
fn sends_land_in_order_with_every_byte() {
    let p = pipe_pair(72);
    const N: u64 = 48;
    let rbuf = p.s.buf(64 * N as usize);
    let src =
        p.c.lmr((0..N as usize).flat_map(|i| pattern(64, i as u8)).collect());
    // Half the sends before their receives (they wait), half after.
    for i in 0..N / 2 {
        p.c.send(&src, i * 64, 64, i);
    }
    for i in 0..N {
        p.s.recv(&rbuf, i * 64, 64, 1000 + i);
    }
    for i in N / 2..N {
        p.c.send(&src, i * 64, 64, i);
    }
    for i in 0..N {
        let d = next_dto(&p.c.req);
        assert_eq!(
            (d.cookie, d.status, d.transferred_length),
            (i, DtoStatus::Success, 64)
        );
        let r = next_dto(&p.s.rcv);
        assert_eq!(
            (r.cookie, r.status, r.operation),
            (1000 + i, DtoStatus::Success, DtoOp::Receive)
        );
    }
    assert_eq!(rbuf.to_vec().unwrap(), src.to_vec().unwrap());
    empty(&p.c.req);
    empty(&p.s.rcv);
}

#[test]
fn rdma_write_and_read_move_exactly_the_range() {
    let p = pipe_pair(73);
    let target = p.s.lmr(pattern(256, 9));
    let before = target.to_vec().unwrap();
    let src = p.c.lmr(pattern(64, 1));
    let remote = target.rmr_triplet(32, 64).unwrap();
    p.c.ep
        .post_rdma_write(&[src.triplet(0, 64).unwrap()], remote, 1, D)
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!(
        (d.status, d.transferred_length, d.operation),
        (DtoStatus::Success, 64, DtoOp::RdmaWrite)
    );
    let after = target.to_vec().unwrap();
    assert_eq!(&after[32..96], &pattern(64, 1)[..]);
    assert_eq!(&after[..32], &before[..32]);
    assert_eq!(&after[96..], &before[96..]);
    let sink = p.c.buf(100);
    p.c.ep
        .post_rdma_read(
            &[sink.triplet(10, 80).unwrap()],
            target.rmr_triplet(100, 80).unwrap(),
            2,
            D,
        )
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!(
        (d.status, d.transferred_length, d.operation),
        (DtoStatus::Success, 80, DtoOp::RdmaRead)
    );
    let got = sink.to_vec().unwrap();
    assert_eq!(&got[10..90], &after[100..180]);
    assert!(got[..10].iter().chain(&got[90..]).all(|&b| b == 0));
}

#[test]
fn a_forged_key_moves_nothing_and_breaks_both_sides() {
    let p = pipe_pair(74);
    let target = p.s.lmr(vec![5; 64]);
    let rbuf = p.s.buf(16);
    p.s.recv(&rbuf, 0, 16, 9);
    let src = p.c.lmr(vec![1; 64]);
    let mut forged = target.rmr_triplet(0, 64).unwrap();
    forged.rmr_context ^= 0xFF;
    p.c.ep
        .post_rdma_write(&[src.triplet(0, 64).unwrap()], forged, 1, D)
        .unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!(
        (d.status, d.transferred_length),
        (DtoStatus::RemoteAccess, 0)
    );
    p.expect_end(ConnectionEventKind::Broken);
    flushed(&p.s.rcv, &[9]);
    assert_eq!(target.to_vec().unwrap(), vec![5; 64]);
    // Out of range with the right key: refused too.
    p.reconnect();
    let past = common::rt(
        target.context().unwrap(),
        target.rmr_triplet(0, 1).unwrap().target_address + 60,
        8,
    );
    p.c.ep
        .post_rdma_write(&[src.triplet(0, 8).unwrap()], past, 2, D)
        .unwrap();
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(target.to_vec().unwrap(), vec![5; 64]);
}

#[test]
fn disconnect_and_free_flush_everything_once_and_tell_the_peer() {
    let p = pipe_pair(75);
    let rbuf = p.s.buf(64);
    let cbuf = p.c.buf(64);
    for i in 0..4 {
        p.s.recv(&rbuf, i * 16, 16, 10 + i);
        p.c.recv(&cbuf, i * 16, 16, 20 + i);
    }
    p.c.ep.disconnect(true).unwrap();
    p.expect_end(ConnectionEventKind::Disconnected);
    flushed(&p.s.rcv, &[10, 11, 12, 13]);
    flushed(&p.c.rcv, &[20, 21, 22, 23]);
    empty(&p.s.rcv);
    empty(&p.c.rcv);
    // Freeing a connected endpoint reaches the provider: the peer is told.
    p.reconnect();
    p.s.recv(&rbuf, 0, 16, 30);
    p.c.ep.free().unwrap();
    assert_eq!(conn_kind(&p.s.conn), ConnectionEventKind::Disconnected);
    flushed(&p.s.rcv, &[30]);
    assert_eq!(p.s.ep.state(), EpState::Disconnected);
}

#[test]
fn a_message_in_segments_fills_a_scatter_list_in_order() {
    let p = pipe_pair(76);
    let rbuf = p.s.buf(64);
    // Three entries of 7, 3 and 13 bytes at scattered offsets.
    let list = [
        rbuf.triplet(40, 7).unwrap(),
        rbuf.triplet(0, 3).unwrap(),
        rbuf.triplet(20, 13).unwrap(),
    ];
    p.s.ep.post_recv(&list, 1, D).unwrap();
    let msg = pattern(23, 3);
    let src = p.c.lmr(msg.clone());
    p.c.send(&src, 0, 23, 2);
    let r = next_dto(&p.s.rcv);
    assert_eq!((r.status, r.transferred_length), (DtoStatus::Success, 23));
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::Success);
    let got = rbuf.to_vec().unwrap();
    assert_eq!(&got[40..47], &msg[..7]);
    assert_eq!(&got[0..3], &msg[7..10]);
    assert_eq!(&got[20..33], &msg[10..]);
    // One byte too many for the list: LocalLength, nothing breaks silently.
    p.s.ep.post_recv(&list, 3, D).unwrap();
    let big = p.c.lmr(pattern(24, 4));
    p.c.send(&big, 0, 24, 4);
    assert_eq!(next_dto(&p.s.rcv).status, DtoStatus::LocalLength);
    assert_eq!(next_dto(&p.c.req).status, DtoStatus::RemoteResponder);
    p.expect_end(ConnectionEventKind::Broken);
}
