//! LMRs over memory borrowed from the caller (`Pz::lmr_create_borrowed`
//! inside `lmr_scope`): RDMA into and out of the caller's buffer, and the
//! guarantee that once the `BorrowedLmr` is dropped or released (or the
//! scope ends) rdapl never touches the buffer again: its keys and the keys
//! of windows bound to it are refused, and a transfer racing with the drop
//! either finished before it or moves nothing.

use rdapl::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

const T: Option<Duration> = Some(Duration::from_secs(5));
const D: CompletionFlags = CompletionFlags::DEFAULT;
const PORT: u64 = 5000;

/// An IA with a PZ, a DTO EVD and a connection/CR EVD.
struct Node {
    ia: Ia,
    pz: Pz,
    dto: Evd,
    conn: Evd,
}

fn node(addr: &str) -> Node {
    let ia = Ia::open_with(
        "loopback",
        IaOptions {
            params: format!("addr={addr}"),
            ..Default::default()
        },
    )
    .unwrap();
    let pz = ia.pz_create().unwrap();
    let dto = ia.evd_create(256, EvdFlags::DTO).unwrap();
    let conn = ia
        .evd_create(64, EvdFlags::CONNECTION | EvdFlags::CR)
        .unwrap();
    Node { ia, pz, dto, conn }
}

impl Node {
    fn ep(&self) -> Ep {
        self.ia
            .ep_create(
                &self.pz,
                Some(&self.dto),
                Some(&self.dto),
                Some(&self.conn),
                None,
            )
            .unwrap()
    }
}

fn next(evd: &Evd) -> Event {
    evd.wait(T, 1).expect("event").0
}

fn dto(evd: &Evd) -> DtoCompletion {
    match next(evd) {
        Event::Dto(d) => d,
        e => panic!("expected a DTO completion, got {e:?}"),
    }
}

fn expect_dto(evd: &Evd, cookie: u64, status: DtoStatus) {
    let d = dto(evd);
    assert_eq!((d.cookie, d.status), (cookie, status));
}

/// Runs `post` on a clone of `ep` in a new thread and gives it 100 ms to
/// resolve its keys (and block on a held region) before returning.
fn spawn_post<R: Send + 'static>(
    ep: &Ep,
    post: impl FnOnce(&Ep) -> R + Send + 'static,
) -> thread::JoinHandle<R> {
    let ep = ep.clone();
    let h = thread::spawn(move || post(&ep));
    thread::sleep(Duration::from_millis(100));
    h
}

fn conn_kind(evd: &Evd) -> ConnectionEventKind {
    match next(evd) {
        Event::Connection(c) => c.kind,
        e => panic!("expected a connection event, got {e:?}"),
    }
}

/// Connects `c_ep` (on `c`) to `s_ep` (on `s`, which listens on `PORT`).
fn connect(s: &Node, s_ep: &Ep, c: &Node, c_ep: &Ep) {
    c_ep.connect(s.ia.address(), PORT, T, b"").unwrap();
    let cr = match next(&s.conn) {
        Event::ConnectionRequest(a) => s.ia.cr(a.cr).unwrap(),
        e => panic!("{e:?}"),
    };
    cr.accept(s_ep, b"").unwrap();
    assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Established);
    assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Established);
}

/// A connected server/client pair on `127.0.<net>.1` / `127.0.<net>.2`.
struct Pair {
    s: Node,
    c: Node,
    s_ep: Ep,
    c_ep: Ep,
    _psp: Psp,
}

fn pair(net: u8) -> Pair {
    let s = node(&format!("127.0.{net}.1"));
    let c = node(&format!("127.0.{net}.2"));
    let psp = s.ia.psp_create(PORT, &s.conn).unwrap();
    let (s_ep, c_ep) = (s.ep(), c.ep());
    connect(&s, &s_ep, &c, &c_ep);
    Pair {
        s,
        c,
        s_ep,
        c_ep,
        _psp: psp,
    }
}

impl Pair {
    /// The connection broke: both sides saw `Broken`.
    fn expect_broken(&self) {
        assert_eq!(conn_kind(&self.c.conn), ConnectionEventKind::Broken);
        assert_eq!(conn_kind(&self.s.conn), ConnectionEventKind::Broken);
        assert_eq!(self.c_ep.state(), EpState::Disconnected);
        assert_eq!(self.s_ep.state(), EpState::Disconnected);
    }

    fn reconnect(&self) {
        self.c_ep.reset().unwrap();
        self.s_ep.reset().unwrap();
        connect(&self.s, &self.s_ep, &self.c, &self.c_ep);
    }

    /// The client RDMA-writes `src[..len]` to `remote`; returns the status.
    fn client_write(&self, src: &Lmr, remote: RmrTriplet, cookie: u64) -> DtoStatus {
        let len = remote.segment_length;
        self.c_ep
            .post_rdma_write(&[src.triplet(0, len).unwrap()], remote, cookie, D)
            .unwrap();
        let d = dto(&self.c.dto);
        assert_eq!(d.cookie, cookie);
        d.status
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// A stack buffer and a `Vec` borrowed in place: the peer RDMA-writes into
/// them and reads them back; dropped or released, the buffers are the
/// caller's again, holding what the peer wrote.
#[test]
fn rdma_into_borrowed_buffers_and_back() {
    let p = pair(50);
    let mut stack = [0u8; 256];
    let mut heap = vec![0u8; 4096];
    let stack_addr = stack.as_ptr() as u64;
    let data = pattern(100, 1);
    let src = p.c.pz.lmr_create_from(data.clone(), MemPriv::ALL).unwrap();
    lmr_scope(|sc| {
        let a =
            p.s.pz
                .lmr_create_borrowed(sc, &mut stack, MemPriv::ALL)
                .unwrap();
        let b =
            p.s.pz
                .lmr_create_borrowed(sc, &mut heap, MemPriv::ALL)
                .unwrap();
        // Registered in place: triplets name the caller's memory.
        assert_eq!(a.address().unwrap(), stack_addr);
        assert_eq!(a.region().unwrap().len(), 256);

        // RDMA write into the stack buffer, then read it back locally.
        let remote = a.rmr_triplet(10, 100).unwrap();
        assert_eq!(p.client_write(&src, remote, 1), DtoStatus::Success);
        let mut seen = vec![0; 100];
        a.read_at(10, &mut seen).unwrap();
        assert_eq!(seen, data);

        // ... and read it back over RDMA into the client.
        let back =
            p.c.pz
                .lmr_create(Region::zeroed(100), MemPriv::ALL)
                .unwrap();
        p.c_ep
            .post_rdma_read(&[back.triplet(0, 100).unwrap()], remote, 2, D)
            .unwrap();
        let d = dto(&p.c.dto);
        assert_eq!(
            (d.status, d.operation),
            (DtoStatus::Success, DtoOp::RdmaRead)
        );
        assert_eq!(back.to_vec().unwrap(), data);

        // The Vec: written locally, read by the peer, written by the peer.
        b.write_at(4000, b"borrowed").unwrap();
        let rb = b.rmr_triplet(4000, 8).unwrap();
        p.c_ep
            .post_rdma_read(&[back.triplet(0, 8).unwrap()], rb, 3, D)
            .unwrap();
        assert_eq!(dto(&p.c.dto).status, DtoStatus::Success);
        assert_eq!(&back.to_vec().unwrap()[..8], b"borrowed");
        assert_eq!(
            p.client_write(&src, b.rmr_triplet(0, 100).unwrap(), 4),
            DtoStatus::Success
        );

        drop(a); // the stack buffer comes back when the scope ends
        let heap_back: &mut [u8] = b.release(); // the Vec comes back now
        assert_eq!(&heap_back[..100], &data[..]);
        assert_eq!(&heap_back[4000..4008], b"borrowed");
        heap_back[4095] = 0xFF;
    });
    assert_eq!(&stack[10..110], &data[..]);
    assert!(stack[..10].iter().chain(&stack[110..]).all(|x| *x == 0));
    assert_eq!(&heap[..100], &data[..]);
    assert_eq!(heap[4095], 0xFF);
    // Nothing is left registered in the PZ (only the endpoint uses it).
    p.s_ep.disconnect(false).unwrap();
    p.s_ep.free().unwrap();
    p.s.pz.free().unwrap();
}

/// After the drop the LMR's keys are refused: a remote write fails with
/// `RemoteAccess`, breaks the connection and leaves the caller's buffer
/// alone; a remote read fails the same way; the local key is refused too.
#[test]
fn keys_are_refused_after_drop() {
    let p = pair(51);
    let src =
        p.c.pz
            .lmr_create_from(vec![0xAB; 64], MemPriv::ALL)
            .unwrap();
    let sink = p.c.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    let mut buf = vec![7u8; 64];
    let (remote, local) = lmr_scope(|sc| {
        let l =
            p.s.pz
                .lmr_create_borrowed(sc, &mut buf, MemPriv::ALL)
                .unwrap();
        let (remote, local) = (l.rmr_triplet(0, 64).unwrap(), l.triplet(0, 64).unwrap());
        let handle: Lmr = Lmr::clone(&l);
        let back = l.release();
        // A plain handle to the LMR is dead.
        assert!(handle.context().is_err());
        assert!(handle.region().is_none());
        assert!(handle.read_at(0, &mut [0; 1]).is_err());
        assert!(handle.free().is_err(), "freed already");
        // A write with the old key, while the caller holds the buffer again.
        assert_eq!(p.client_write(&src, remote, 1), DtoStatus::RemoteAccess);
        assert!(back.iter().all(|x| *x == 7), "no byte moved");
        (remote, local)
    });
    p.expect_broken();
    assert!(buf.iter().all(|x| *x == 7));

    // Reading through the old key is refused as well.
    p.reconnect();
    p.c_ep
        .post_rdma_read(&[sink.triplet(0, 64).unwrap()], remote, 2, D)
        .unwrap();
    assert_eq!(dto(&p.c.dto).status, DtoStatus::RemoteAccess);
    p.expect_broken();
    assert!(sink.to_vec().unwrap().iter().all(|x| *x == 0));

    // And so is the local key, for the server's own requests.
    p.reconnect();
    p.s_ep
        .post_rdma_write(&[local], sink.rmr_triplet(0, 64).unwrap(), 3, D)
        .unwrap();
    assert_eq!(dto(&p.s.dto).status, DtoStatus::LocalProtection);
    p.expect_broken();
    assert!(sink.to_vec().unwrap().iter().all(|x| *x == 0));
    assert!(buf.iter().all(|x| *x == 7));
}

/// A window bound to the borrowed LMR stops a normal free; dropping the
/// `BorrowedLmr` invalidates it anyway, and the window's key dies with it.
#[test]
fn drop_with_a_window_bound_kills_the_window_key() {
    let p = pair(52);
    let data = pattern(16, 9);
    let src = p.c.pz.lmr_create_from(data.clone(), MemPriv::ALL).unwrap();
    let rmr = p.s.pz.rmr_create().unwrap();
    let mut buf = vec![0u8; 128];
    let (window, lmr_key) = lmr_scope(|sc| {
        let l =
            p.s.pz
                .lmr_create_borrowed(sc, &mut buf, MemPriv::ALL)
                .unwrap();
        let wkey = p
            .s_ep
            .post_rmr_bind(
                &rmr,
                &l,
                l.triplet(32, 64).unwrap(),
                MemPriv::REMOTE_WRITE | MemPriv::REMOTE_READ,
                1,
                D,
            )
            .unwrap();
        let d = dto(&p.s.dto);
        assert_eq!((d.status, d.operation), (DtoStatus::Success, DtoOp::BindMw));
        let window = RmrTriplet {
            rmr_context: wkey,
            target_address: l.address().unwrap() + 32,
            segment_length: 16,
        };
        assert_eq!(p.client_write(&src, window, 2), DtoStatus::Success);
        // A plain free is refused while the window is bound...
        assert!(matches!(
            l.free(),
            Err(Error::InvalidState {
                state: rdapl::error::Subtype::InvalidStateLmrInUse,
                ..
            })
        ));
        let lmr_key = l.rmr_triplet(0, 16).unwrap();
        drop(l); // ...but the drop unregisters it anyway.
        (window, lmr_key)
    });
    let mut expect = vec![0u8; 128];
    expect[32..48].copy_from_slice(&data);
    assert_eq!(buf, expect);

    // The window's key is refused...
    assert_eq!(p.client_write(&src, window, 3), DtoStatus::RemoteAccess);
    p.expect_broken();
    assert_eq!(buf, expect, "no byte moved");
    // ...as is the LMR's.
    p.reconnect();
    assert_eq!(p.client_write(&src, lmr_key, 4), DtoStatus::RemoteAccess);
    p.expect_broken();
    assert_eq!(buf, expect, "no byte moved");
    // The window itself is still there, unbound: it can be freed (or bound
    // again, which gives it a new key).
    assert_eq!(rmr.context().unwrap(), window.rmr_context);
    rmr.free().unwrap();
}

/// A registration leaked with `mem::forget`, or left behind by a panic, is
/// still unregistered when the scope ends.
#[test]
fn leaked_or_unwound_registrations_end_with_the_scope() {
    let p = pair(53);
    let src = p.c.pz.lmr_create_from(vec![1; 8], MemPriv::ALL).unwrap();
    let mut buf = [5u8; 8];
    let remote = lmr_scope(|sc| {
        let l =
            p.s.pz
                .lmr_create_borrowed(sc, &mut buf, MemPriv::ALL)
                .unwrap();
        let r = l.rmr_triplet(0, 8).unwrap();
        std::mem::forget(l);
        r
    });
    assert_eq!(p.client_write(&src, remote, 1), DtoStatus::RemoteAccess);
    p.expect_broken();
    assert_eq!(buf, [5; 8]);

    p.reconnect();
    let mut remote = None;
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lmr_scope(|sc| {
            let l =
                p.s.pz
                    .lmr_create_borrowed(sc, &mut buf, MemPriv::ALL)
                    .unwrap();
            remote = Some(l.rmr_triplet(0, 8).unwrap());
            // Both leaked and unwound past.
            let _leak = Box::leak(Box::new(l));
            panic!("consumer bug");
        })
    }));
    assert!(unwound.is_err());
    assert_eq!(
        p.client_write(&src, remote.unwrap(), 2),
        DtoStatus::RemoteAccess
    );
    p.expect_broken();
    assert_eq!(buf, [5; 8]);

    // A refused registration leaves nothing behind either.
    let pz = p.s.ia.pz_create().unwrap();
    pz.free().unwrap();
    lmr_scope(|sc| {
        assert!(pz.lmr_create_borrowed(sc, &mut buf, MemPriv::ALL).is_err());
    });
    assert_eq!(buf, [5; 8]);
}

/// A transfer whose keys were resolved before the release but whose copy
/// runs after it moves nothing and fails: `RemoteAccess` when the retired
/// buffer is the peer's, `LocalProtection` when it is the poster's own (for
/// sends: `RemoteResponder` and `LocalProtection` on the receive, or
/// `LocalProtection` and the receive flushed).
///
/// The copy is held between the two by a guard on the *other* region, which
/// is locked first (regions lock in creation order), so the release does not
/// wait for it.
#[test]
fn transfers_resolved_before_the_release_move_nothing() {
    let p = pair(54);
    // Remote: the client writes into the borrowed buffer.
    let src =
        p.c.pz
            .lmr_create_from(vec![0xAB; 64], MemPriv::ALL)
            .unwrap();
    let mut buf = vec![0u8; 64];
    lmr_scope(|sc| {
        let l =
            p.s.pz
                .lmr_create_borrowed(sc, &mut buf, MemPriv::ALL)
                .unwrap();
        let (t, remote) = (src.triplet(0, 64).unwrap(), l.rmr_triplet(0, 64).unwrap());
        let src_region = src.region().unwrap();
        let hold = src_region.write();
        // the post resolves its keys, then waits for `hold`
        let h = spawn_post(&p.c_ep, move |ep| ep.post_rdma_write(&[t], remote, 1, D));
        let back = l.release();
        drop(hold);
        h.join().unwrap().unwrap();
        expect_dto(&p.c.dto, 1, DtoStatus::RemoteAccess);
        assert!(back.iter().all(|x| *x == 0), "no byte moved");
    });
    p.expect_broken();

    // Local: the server writes from the borrowed buffer to the client.
    p.reconnect();
    let sink = p.c.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    let mut buf = vec![0xCD_u8; 64];
    lmr_scope(|sc| {
        let l =
            p.s.pz
                .lmr_create_borrowed(sc, &mut buf, MemPriv::ALL)
                .unwrap();
        let (t, remote) = (l.triplet(0, 64).unwrap(), sink.rmr_triplet(0, 64).unwrap());
        let sink_region = sink.region().unwrap();
        let hold = sink_region.write();
        let h = spawn_post(&p.s_ep, move |ep| ep.post_rdma_write(&[t], remote, 2, D));
        drop(l);
        drop(hold);
        h.join().unwrap().unwrap();
        expect_dto(&p.s.dto, 2, DtoStatus::LocalProtection);
    });
    p.expect_broken();
    assert!(
        sink.to_vec().unwrap().iter().all(|x| *x == 0),
        "no byte moved"
    );

    // A send into a receive posted on the borrowed buffer: the sender gets
    // `RemoteResponder`, the receive `LocalProtection`.
    p.reconnect();
    let mut buf = vec![0u8; 64];
    lmr_scope(|sc| {
        let l =
            p.s.pz
                .lmr_create_borrowed(sc, &mut buf, MemPriv::ALL)
                .unwrap();
        p.s_ep
            .post_recv(&[l.triplet(0, 64).unwrap()], 3, D)
            .unwrap();
        let t = src.triplet(0, 64).unwrap();
        let src_region = src.region().unwrap();
        let hold = src_region.write();
        let h = spawn_post(&p.c_ep, move |ep| ep.post_send(&[t], 4, D));
        let back = l.release();
        drop(hold);
        h.join().unwrap().unwrap();
        expect_dto(&p.c.dto, 4, DtoStatus::RemoteResponder);
        expect_dto(&p.s.dto, 3, DtoStatus::LocalProtection);
        assert!(back.iter().all(|x| *x == 0), "no byte moved");
    });
    p.expect_broken();

    // A send from the borrowed buffer: `LocalProtection` for the sender,
    // the receive is flushed.
    p.reconnect();
    let rbuf = p.c.pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    p.c_ep
        .post_recv(&[rbuf.triplet(0, 64).unwrap()], 5, D)
        .unwrap();
    let mut buf = vec![0xCD_u8; 64];
    lmr_scope(|sc| {
        let l =
            p.s.pz
                .lmr_create_borrowed(sc, &mut buf, MemPriv::ALL)
                .unwrap();
        let t = l.triplet(0, 64).unwrap();
        let rbuf_region = rbuf.region().unwrap();
        let hold = rbuf_region.write();
        let h = spawn_post(&p.s_ep, move |ep| ep.post_send(&[t], 6, D));
        drop(l);
        drop(hold);
        h.join().unwrap().unwrap();
        expect_dto(&p.s.dto, 6, DtoStatus::LocalProtection);
        expect_dto(&p.c.dto, 5, DtoStatus::Flushed);
    });
    p.expect_broken();
    assert!(
        rbuf.to_vec().unwrap().iter().all(|x| *x == 0),
        "no byte moved"
    );
}

/// Peers hammer the borrowed buffer with RDMA writes while the owner drops
/// (or releases) the registration: once that returns, no write lands. Each
/// round: a sentinel is written into the buffer as soon as it is back, the
/// writers run on until their key is refused, and the sentinel must be
/// intact; every write either succeeded before the drop or was refused.
#[test]
fn writes_racing_with_the_drop_never_land_after_it() {
    const WRITERS: usize = 3;
    // Small under Miri, which copies a byte at a time thousands of times slower.
    const LEN: usize = if cfg!(miri) { 1 << 10 } else { 1 << 20 };
    const SENTINEL: u8 = 0xEE;
    let s = node("127.0.55.1");
    let _psp = s.ia.psp_create(PORT, &s.conn).unwrap();
    let clients: Vec<Node> = (0..WRITERS)
        .map(|i| node(&format!("127.0.55.{}", 10 + i)))
        .collect();
    // Each writer's source is uniform, so the buffer is always one
    // writer's tag throughout (copies are atomic under the region lock).
    let sources: Vec<Lmr> = clients
        .iter()
        .enumerate()
        .map(|(i, c)| {
            c.pz.lmr_create_from(vec![i as u8 + 1; LEN], MemPriv::ALL)
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    let mut rounds = 0;
    while rounds < 12 && (rounds < 3 || start.elapsed() < Duration::from_secs(3)) {
        rounds += 1;
        let pairs: Vec<(Ep, Ep)> = clients
            .iter()
            .map(|c| {
                let (s_ep, c_ep) = (s.ep(), c.ep());
                connect(&s, &s_ep, c, &c_ep);
                (s_ep, c_ep)
            })
            .collect();
        let mut buf = vec![0u8; LEN];
        let release = rounds % 2 == 0;
        let ok = Arc::new(AtomicUsize::new(0));
        let mut writers = Vec::new();
        lmr_scope(|sc| {
            let l =
                s.pz.lmr_create_borrowed(sc, &mut buf, MemPriv::ALL)
                    .unwrap();
            let remote = l.rmr_triplet(0, LEN as u64).unwrap();
            for (i, (c, (_, c_ep))) in clients.iter().zip(&pairs).enumerate() {
                let (ep, evd, ok) = (c_ep.clone(), c.dto.clone(), ok.clone());
                let t = sources[i].triplet(0, LEN as u64).unwrap();
                writers.push(thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_secs(5);
                    let mut cookie = 0;
                    while Instant::now() < deadline {
                        cookie += 1;
                        ep.post_rdma_write(&[t], remote, cookie, D).unwrap();
                        let d = dto(&evd);
                        assert_eq!(d.cookie, cookie);
                        match d.status {
                            DtoStatus::Success => ok.fetch_add(1, Ordering::SeqCst),
                            st => return Some(st),
                        };
                    }
                    None
                }));
            }
            // Let the writers get going, then pull the buffer from under them.
            let wait = Instant::now() + Duration::from_secs(2);
            while ok.load(Ordering::SeqCst) < 2 * WRITERS && Instant::now() < wait {
                thread::yield_now();
            }
            if release {
                let back = l.release();
                let tag = back[0];
                assert!(tag as usize <= WRITERS);
                assert!(back.iter().all(|x| *x == tag), "a write landed partly");
                back.fill(SENTINEL);
                // The writers run on until refused; the buffer is ours.
                thread::sleep(Duration::from_millis(5));
                assert!(back.iter().all(|x| *x == SENTINEL), "a write landed");
            } else {
                drop(l); // the buffer is back when the scope ends
            }
        });
        if !release {
            let tag = buf[0];
            assert!(tag as usize <= WRITERS);
            assert!(buf.iter().all(|x| *x == tag), "a write landed partly");
            buf.fill(SENTINEL);
        }
        for w in writers {
            assert_eq!(
                w.join().unwrap(),
                Some(DtoStatus::RemoteAccess),
                "every writer is refused in the end"
            );
        }
        assert!(buf.iter().all(|x| *x == SENTINEL), "a write landed");
        assert!(ok.load(Ordering::SeqCst) >= 1);
        for ((s_ep, c_ep), c) in pairs.iter().zip(&clients) {
            assert_eq!(conn_kind(&c.conn), ConnectionEventKind::Broken);
            assert_eq!(conn_kind(&s.conn), ConnectionEventKind::Broken);
            s_ep.free().unwrap();
            c_ep.free().unwrap();
        }
    }
}
