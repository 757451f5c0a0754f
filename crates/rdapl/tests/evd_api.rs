//! EVD semantics through the public API: ordering, exactly-once delivery,
//! `wait` thresholds, capacity accounting, overflow reporting, the upcall
//! policies and the three re-enable modes.
//!
//! Every blocking step is bounded: helper threads report over channels that
//! are read with a timeout, and polling loops have deadlines.

mod common;

use common::{
    LIMIT, QUIET, conn_event, cr_event, dto_event, eventually, spawn_poster, start_waiter, sw_evd,
    sw_values, tag, teardown_within, untag, upcall, upcall_evd, within,
};
use rdapl::error::Subtype;
use rdapl::evd::EvdProducer;
use rdapl::event::{EpHandle, RmrHandle};
use rdapl::{
    AsyncError, AsyncErrorKind, ConnectionEventKind, DatObject, Dispatcher, DtoOp, DtoStatus,
    Error, Evd, EvdFlags, Event, EventStream, ReEnable, RmrBindCompletion, Upcall, UpcallPolicy,
};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::{self, ThreadId};
use std::time::{Duration, Instant};

/// Deadline of the high-volume tests (only reached when something is wrong
/// or the machine is badly overloaded).
const LONG: Duration = Duration::from_secs(20);

// ----- helpers ----------------------------------------------------------------

/// One upcall invocation as seen by the consumer.
#[derive(Clone, Debug)]
struct Call {
    event: Option<Event>,
    more: bool,
    thread: ThreadId,
}

/// Records upcalls and lets the test wait for a number of them.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<Call>>,
    cv: Condvar,
}

impl Recorder {
    fn push(&self, event: Option<Event>, more: bool) {
        self.calls.lock().unwrap().push(Call {
            event,
            more,
            thread: thread::current().id(),
        });
        self.cv.notify_all();
    }

    fn len(&self) -> usize {
        self.calls.lock().unwrap().len()
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn events(&self) -> Vec<Event> {
        self.calls().into_iter().filter_map(|c| c.event).collect()
    }

    /// Waits until at least `n` calls were recorded; false on timeout.
    fn wait_for(&self, n: usize, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let mut g = self.calls.lock().unwrap();
        while g.len() < n {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            g = self.cv.wait_timeout(g, end - now).unwrap().0;
        }
        true
    }

    fn upcall(self: &Arc<Self>) -> Arc<dyn Upcall> {
        let r = self.clone();
        upcall(move |_, ev, more| r.push(ev, more))
    }
}

/// A software-event EVD of `qlen` entries whose upcalls a [`Recorder`]
/// records, installed under `policy` (re-enable mode `Strict`).
fn recorded_evd(qlen: usize, policy: UpcallPolicy) -> (Arc<Recorder>, Evd) {
    let rec = Arc::new(Recorder::default());
    let evd = sw_evd(qlen);
    evd.modify_upcall(policy, Some(rec.upcall()), ReEnable::Strict)
        .unwrap();
    (rec, evd)
}

// ----- ordering and exactly-once --------------------------------------------

/// (stream, producer, sequence) of a test event.
fn key_of(ev: &Event) -> (EventStream, u64, u64) {
    match ev {
        Event::Software(v) => (EventStream::Software, v >> 32, v & 0xFFFF_FFFF),
        Event::Connection(c) => (EventStream::Connection, c.ep.0 >> 32, c.ep.0 & 0xFFFF_FFFF),
        Event::ConnectionRequest(c) => (EventStream::ConnectionRequest, c.cr.0, c.conn_qual),
        Event::AsyncError(a) => match a.object {
            DatObject::Ep(ep) => (EventStream::Async, a.reason as u64, ep.0),
            other => panic!("unexpected async object {other:?}"),
        },
        Event::Dto(d) => (EventStream::Dto, d.ep.0, d.cookie),
        Event::RmrBind(r) => (EventStream::RmrBind, r.rmr.0, r.cookie),
    }
}

#[test]
fn per_stream_fifo_with_concurrent_producers_and_consumer() {
    const PER: u64 = 800;
    let evd = Evd::create(8192, EvdFlags::ALL).unwrap();
    let mut producers = Vec::new();
    for p in 0..7u64 {
        let evd = evd.clone();
        producers.push(thread::spawn(move || {
            for seq in 0..PER {
                match p {
                    0 | 1 => evd.post_se(tag(p, seq)).unwrap(),
                    2 => evd
                        .post_event(conn_event(ConnectionEventKind::Established, tag(p, seq)))
                        .unwrap(),
                    3 => evd.post_event(cr_event(seq, p)).unwrap(),
                    4 => evd
                        .post_event(Event::AsyncError(AsyncError {
                            kind: AsyncErrorKind::EpBroken,
                            object: DatObject::Ep(EpHandle(seq)),
                            consumer_context: 0,
                            reason: p as i32,
                        }))
                        .unwrap(),
                    5 => {
                        let r = evd.reserve().unwrap();
                        evd.complete(r, dto_event(p, seq, DtoOp::Send, seq))
                            .unwrap();
                    }
                    _ => evd
                        .post_event(Event::RmrBind(RmrBindCompletion {
                            rmr: RmrHandle(p),
                            consumer_context: 0,
                            cookie: seq,
                            status: DtoStatus::Success,
                        }))
                        .unwrap(),
                }
                if seq % 97 == 0 {
                    thread::yield_now();
                }
            }
        }));
    }
    let total = 7 * PER as usize;
    let mut last: HashMap<(EventStream, u64), u64> = HashMap::new();
    let mut got = 0;
    let mut batch = Vec::new();
    let mut buf: Vec<Option<Event>> = vec![None; 5];
    let end = Instant::now() + LONG;
    let mut round = 0u64;
    while got < total {
        assert!(Instant::now() < end, "only {got} of {total} events arrived");
        batch.clear();
        match round % 3 {
            0 => {
                if let Some(e) = evd.dequeue().unwrap() {
                    batch.push(e);
                }
            }
            1 => {
                evd.dequeue_batch(&mut batch, 7).unwrap();
            }
            _ => {
                let n = evd.dequeue_into(&mut buf).unwrap();
                batch.extend(buf.iter_mut().take(n).map(|s| s.take().unwrap()));
            }
        }
        round += 1;
        if batch.is_empty() {
            thread::yield_now();
        }
        for ev in batch.drain(..) {
            let (stream, p, seq) = key_of(&ev);
            assert_eq!(ev.stream(), stream);
            let next = last.entry((stream, p)).or_insert(0);
            assert_eq!(
                seq, *next,
                "{stream:?} producer {p}: out of order or duplicated"
            );
            *next += 1;
            got += 1;
        }
    }
    for h in producers {
        h.join().unwrap();
    }
    assert_eq!(
        evd.dequeue().unwrap(),
        None,
        "more events than were produced"
    );
    assert_eq!(last.len(), 7);
    assert!(last.values().all(|&n| n == PER));
    let q = evd.query().unwrap();
    assert_eq!((q.pending, q.occupied, q.overflows), (0, 0, 0));
}

#[test]
fn single_instance_upcalls_keep_fifo_and_never_overlap() {
    const PER: u64 = 60;
    let active = Arc::new(AtomicUsize::new(0));
    let max_active = Arc::new(AtomicUsize::new(0));
    let rec = Arc::new(Recorder::default());
    let up = {
        let (active, max_active, rec) = (active.clone(), max_active.clone(), rec.clone());
        upcall(move |_, ev, more| {
            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
            max_active.fetch_max(now, Ordering::SeqCst);
            thread::sleep(Duration::from_micros(300));
            rec.push(ev, more);
            active.fetch_sub(1, Ordering::SeqCst);
        })
    };
    let evd = upcall_evd(1024, Some(4), UpcallPolicy::SingleInstance, up);
    let producers: Vec<_> = (0..3u64)
        .map(|p| {
            let evd = evd.clone();
            thread::spawn(move || {
                for seq in 0..PER {
                    evd.post_se(tag(p, seq)).unwrap();
                    if seq % 7 == 0 {
                        thread::sleep(Duration::from_micros(200));
                    }
                }
            })
        })
        .collect();
    for h in producers {
        h.join().unwrap();
    }
    assert!(
        rec.wait_for(3 * PER as usize, LIMIT),
        "only {} upcalls",
        rec.len()
    );
    assert_eq!(
        max_active.load(Ordering::SeqCst),
        1,
        "two single-instance upcalls overlapped"
    );
    let mut next = [0u64; 3];
    for v in sw_values(&rec.events()) {
        let (p, seq) = untag(v);
        assert_eq!(seq, next[p], "producer {p} out of order");
        next[p] += 1;
    }
    assert_eq!(next, [PER; 3]);
    thread::sleep(Duration::from_millis(20));
    assert_eq!(rec.len(), 3 * PER as usize, "an event was delivered twice");
    assert!(rec.calls().iter().all(|c| c.event.is_some()));
}

/// The seed's flow, done by hand: producers post while the consumer keeps
/// switching between upcalls and polling (every dequeue form and `wait`),
/// with every re-enable mode. Every event must be seen exactly once.
#[test]
fn exactly_once_across_upcalls_dequeue_batch_into_and_wait() {
    const N: usize = 12_000;
    let seen: Arc<Vec<AtomicU64>> = Arc::new((0..N).map(|_| AtomicU64::new(0)).collect());
    let by_upcall = Arc::new(AtomicUsize::new(0));
    let by_upcall_dequeue = Arc::new(AtomicUsize::new(0));
    let mark = {
        let seen = seen.clone();
        move |ev: Event| match ev {
            Event::Software(v) => {
                seen[v as usize].fetch_add(1, Ordering::SeqCst);
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    let up = {
        let (mark, by_upcall, by_upcall_dequeue) =
            (mark.clone(), by_upcall.clone(), by_upcall_dequeue.clone());
        upcall(move |evd, ev, more| {
            if let Some(ev) = ev {
                mark(ev);
                by_upcall.fetch_add(1, Ordering::Relaxed);
            }
            // An upcall may poll too (any rdapl call is allowed here).
            if more && let Ok(Some(ev)) = evd.dequeue() {
                mark(ev);
                by_upcall_dequeue.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let evd = Evd::builder(512, EvdFlags::SOFTWARE)
        .dispatch(Dispatcher::new(2))
        .build()
        .unwrap();
    evd.modify_upcall(UpcallPolicy::SingleInstance, Some(up), ReEnable::Strict)
        .unwrap();
    // The producers start with upcalls off, and this thread takes the first
    // event by `wait`: the mix always happens (otherwise the producers can
    // finish, and the upcalls take everything, before the loop below polls
    // once, which happened on a 2-core CI machine).
    evd.modify_upcall(UpcallPolicy::Disable, None, ReEnable::Strict)
        .unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..2u64)
        .map(|p| {
            spawn_poster(
                &evd,
                (p..N as u64).step_by(2),
                Instant::now() + LONG,
                |_| {},
            )
        })
        .collect();
    let end = Instant::now() + LONG;
    let mut round = 0usize;
    let (first, _) = evd.wait(Some(LONG), 1).expect("the first event");
    mark(first);
    let mut polled = 1usize;
    let mut busy = 0usize;
    let mut batch = Vec::new();
    let mut buf: Vec<Option<Event>> = vec![None; 8];
    while !done.load(Ordering::Relaxed) {
        assert!(Instant::now() < end, "consumer loop did not finish");
        // Upcall -> poll: disable, poll a little in this thread.
        evd.modify_upcall(UpcallPolicy::Disable, None, ReEnable::Strict)
            .unwrap();
        for _ in 0..(round % 5) {
            match round % 4 {
                0 => {
                    if let Some(e) = evd.dequeue().unwrap() {
                        mark(e);
                        polled += 1;
                    }
                }
                1 => {
                    batch.clear();
                    polled += evd.dequeue_batch(&mut batch, 6).unwrap();
                    batch.drain(..).for_each(&mark);
                }
                2 => {
                    let n = evd.dequeue_into(&mut buf).unwrap();
                    polled += n;
                    buf.iter_mut().take(n).for_each(|s| mark(s.take().unwrap()));
                }
                _ => match evd.wait(Some(Duration::from_micros(200)), 1) {
                    Ok((e, _)) => {
                        mark(e);
                        polled += 1;
                    }
                    Err(Error::TimeoutExpired { .. }) => {}
                    Err(e) => panic!("wait: {e:?}"),
                },
            }
        }
        // Poll -> upcall, in each re-enable mode.
        let mode = [ReEnable::Strict, ReEnable::OnAny, ReEnable::OnNew][round % 3];
        match evd.modify_upcall(UpcallPolicy::SingleInstance, None, mode) {
            Ok(_) => {}
            Err(Error::Busy { .. }) => busy += 1,
            Err(e) => panic!("re-enable: {e:?}"),
        }
        round += 1;
        if producers.iter().all(|h| h.is_finished()) {
            done.store(true, Ordering::Relaxed);
        }
        thread::yield_now();
    }
    for h in producers {
        h.join().unwrap();
    }
    // Quiesce and drain what is left.
    evd.modify_upcall(UpcallPolicy::Disable, None, ReEnable::Strict)
        .unwrap();
    teardown_within(&evd, "Teardown at the end").unwrap();
    while let Some(e) = evd.dequeue().unwrap() {
        mark(e);
        polled += 1;
    }
    let counts: Vec<u64> = seen.iter().map(|c| c.load(Ordering::SeqCst)).collect();
    let missing: Vec<usize> = (0..N).filter(|&i| counts[i] == 0).take(10).collect();
    let dup: Vec<usize> = (0..N).filter(|&i| counts[i] > 1).take(10).collect();
    assert!(
        missing.is_empty() && dup.is_empty(),
        "missing {missing:?}, duplicated {dup:?}"
    );
    let up_n = by_upcall.load(Ordering::SeqCst) + by_upcall_dequeue.load(Ordering::SeqCst);
    assert_eq!(up_n + polled, N);
    assert!(
        up_n > 0 && polled > 0,
        "the mix did not happen: {up_n} by upcall, {polled} polled"
    );
    let _ = busy; // Strict refusals are expected now and then; both outcomes are fine.
}

// ----- wait -------------------------------------------------------------------

#[test]
fn wait_returns_at_once_when_threshold_already_met() {
    let evd = sw_evd(8);
    for i in 0..5 {
        evd.post_se(i).unwrap();
    }
    // Infinite timeout and no producer: if it slept, it would never return
    // (and `within` fails the test).
    let e2 = evd.clone();
    let got = within(LIMIT, "wait with threshold met", move || e2.wait(None, 3)).unwrap();
    assert_eq!(got, (Event::Software(0), 4));
    // Threshold equal to the queued count, zero timeout.
    assert_eq!(
        evd.wait(Some(Duration::ZERO), 4).unwrap(),
        (Event::Software(1), 3)
    );
    assert_eq!(
        evd.wait(Some(Duration::ZERO), 1).unwrap(),
        (Event::Software(2), 2)
    );
}

#[test]
fn wait_blocks_until_threshold_then_reports_nmore() {
    let evd = sw_evd(8);
    let (_h, rx) = start_waiter(&evd, Some(LIMIT), 4);
    for i in 0..3 {
        evd.post_se(i).unwrap();
        // Below the threshold: the waiter must still be asleep.
        match rx.recv_timeout(Duration::from_millis(40)) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            other => panic!(
                "wait returned below its threshold ({} queued): {other:?}",
                i + 1
            ),
        }
    }
    evd.post_se(3).unwrap();
    let got = rx
        .recv_timeout(LIMIT)
        .expect("waiter not woken at its threshold");
    let (ev, nmore) = got.unwrap();
    assert_eq!(ev, Event::Software(0));
    assert_eq!(nmore, 3);
    assert!(nmore >= 4 - 1, "DAT: nmore >= threshold - 1 on success");
}

#[test]
fn infinite_wait_wakes_on_arrival() {
    let evd = sw_evd(4);
    let (_h, rx) = start_waiter(&evd, None, 1);
    thread::sleep(Duration::from_millis(10));
    evd.post_se(42).unwrap();
    let got = rx
        .recv_timeout(LIMIT)
        .expect("infinite wait missed the wakeup");
    assert_eq!(got.unwrap(), (Event::Software(42), 0));
}

/// Waiter vs producer at the threshold, many times: no wakeup is missed and
/// the order is kept.
#[test]
fn waiter_racing_producer_never_misses_a_wakeup() {
    const N: u64 = 3000;
    let evd = sw_evd(64);
    let producer = spawn_poster(&evd, 0..N, Instant::now() + LIMIT, |_| {});
    let consumer = {
        let evd = evd.clone();
        thread::spawn(move || {
            for i in 0..N {
                let threshold = if N - i >= 3 { 3 } else { 1 };
                let (ev, nmore) = evd
                    .wait(Some(Duration::from_secs(2)), threshold)
                    .unwrap_or_else(|e| panic!("event {i}: {e:?}"));
                assert_eq!(ev, Event::Software(i));
                assert!(nmore + 1 >= threshold);
            }
        })
    };
    within(Duration::from_secs(10), "waiter/producer race", move || {
        producer.join().unwrap();
        consumer.join().unwrap();
    });
    assert_eq!(evd.dequeue().unwrap(), None);
}

// ----- capacity ---------------------------------------------------------------

fn dto(cookie: u64) -> Event {
    dto_event(1, cookie, DtoOp::Receive, 0)
}

/// A producer retrying on a full EVD learns of new room from the slots
/// consumers free (one by one), from the consumers' head (a batch taken at
/// once), and from released reservations (which free no slot), and across
/// a resize that grows the ring: in every case it gets exactly the room
/// freed, no more, no less.
#[test]
fn full_evd_gives_exactly_the_room_freed() {
    const Q: usize = 16;
    let evd = Evd::create(Q, EvdFlags::DTO).unwrap();
    // Reserves and completes until refused; checks each reservation
    // against the queue length before completing it (an excess one would
    // find no free slot).
    let fill = |evd: &Evd, from: u64| -> u64 {
        let mut n = 0;
        while let Ok(r) = evd.reserve() {
            let q = evd.query().unwrap();
            assert!(
                q.occupied <= q.qlen,
                "{} held, queue length {}",
                q.occupied,
                q.qlen
            );
            evd.complete(r, dto(from + n)).unwrap();
            n += 1;
        }
        n
    };
    assert_eq!(fill(&evd, 0), Q as u64);
    // One by one (the producer finds each freed slot).
    for k in 0..40u64 {
        assert_eq!(evd.dequeue().unwrap(), Some(dto(k)));
        assert_eq!(fill(&evd, Q as u64 + k), 1, "one dequeue, one slot");
    }
    let mut next = 40;
    // Two, then three at once (fewer than the slots a producer looks at).
    for take in [2usize, 3] {
        for _ in 0..take {
            assert_eq!(evd.dequeue().unwrap(), Some(dto(next)));
            next += 1;
        }
        assert_eq!(fill(&evd, 1000 + next), take as u64);
    }
    // A whole batch (more than the slots a producer looks at).
    let mut v = Vec::new();
    assert_eq!(evd.dequeue_batch(&mut v, Q).unwrap(), Q);
    assert_eq!(fill(&evd, 2000), Q as u64);
    // Released reservations free no slot: the head and the release count
    // tell them.
    evd.dequeue_batch(&mut v, Q).unwrap();
    let held: Vec<_> = (0..Q).map(|_| evd.reserve().unwrap()).collect();
    assert!(evd.reserve().is_err());
    let mut held = held.into_iter();
    for _ in 0..3 {
        evd.release(held.next().unwrap()).unwrap();
    }
    let again: Vec<_> = (0..3).map(|_| evd.reserve().unwrap()).collect();
    assert!(evd.reserve().is_err(), "three released, three taken");
    for r in held.chain(again) {
        evd.release(r).unwrap();
    }
    // Full, then grown: the new room is there at once, and exactly it.
    assert_eq!(fill(&evd, 3000), Q as u64);
    evd.resize(2 * Q).unwrap();
    assert_eq!(fill(&evd, 4000), Q as u64);
    evd.dequeue_batch(&mut v, 2 * Q).unwrap();
    assert_eq!(fill(&evd, 5000), 2 * Q as u64);
}

/// Producers racing a consumer on a small EVD that is full most of the
/// time never hold more than the queue length: reservations accepted
/// minus events taken stays within it (plus the one event the consumer
/// took and has not counted yet), and nothing is lost.
#[test]
fn full_evd_never_overcommits_under_contention() {
    const Q: i64 = 8;
    let evd = Evd::create(Q as usize, EvdFlags::DTO).unwrap();
    let inflight = Arc::new(AtomicI64::new(0));
    let worst = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..2u64)
        .map(|p| {
            let (evd, inflight, worst, stop) =
                (evd.clone(), inflight.clone(), worst.clone(), stop.clone());
            thread::spawn(move || {
                let mut made = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(r) = evd.reserve() {
                        let now = inflight.fetch_add(1, Ordering::SeqCst) + 1;
                        worst.fetch_max(now, Ordering::SeqCst);
                        evd.complete(r, dto(p << 32 | made)).unwrap();
                        made += 1;
                    } else {
                        std::hint::spin_loop();
                    }
                }
                made
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_millis(300);
    let mut taken = 0u64;
    let mut last = [None::<u64>; 2];
    // Takes one event if there is one: each producer's cookies in order.
    let mut take_one = || {
        if let Some(Event::Dto(d)) = evd.dequeue().unwrap() {
            inflight.fetch_sub(1, Ordering::SeqCst);
            let (p, k) = ((d.cookie >> 32) as usize, d.cookie & 0xFFFF_FFFF);
            assert!(
                last[p].is_none_or(|l| k == l + 1),
                "producer {p}: {k} after {:?}",
                last[p]
            );
            last[p] = Some(k);
            taken += 1;
        }
    };
    while Instant::now() < deadline {
        take_one();
    }
    stop.store(true, Ordering::Relaxed);
    // Drain until every producer is done (bounded: one holding an excess
    // reservation would wait for a slot).
    let end = Instant::now() + Duration::from_secs(5);
    while !producers.iter().all(|h| h.is_finished()) && Instant::now() < end {
        take_one();
    }
    let worst = worst.load(Ordering::SeqCst);
    assert!(
        worst <= Q + 1,
        "{worst} reservations held at once, queue length {Q}"
    );
    assert!(
        producers.iter().all(|h| h.is_finished()),
        "a producer is stuck"
    );
    let made: u64 = producers.into_iter().map(|h| h.join().unwrap()).sum();
    let mut rest = Vec::new();
    while evd.dequeue_batch(&mut rest, Q as usize).unwrap() > 0 {}
    assert_eq!(
        taken + rest.len() as u64,
        made,
        "every completion is taken once"
    );
    assert!(taken > 0);
}

#[test]
fn reserve_complete_release_accounting() {
    let evd = Evd::create(4, EvdFlags::DTO | EvdFlags::SOFTWARE | EvdFlags::CONNECTION).unwrap();
    let r1 = evd.reserve().unwrap();
    let r2 = evd.reserve().unwrap();
    evd.post_se(100).unwrap();
    evd.post_se(101).unwrap();
    let q = evd.query().unwrap();
    assert_eq!((q.pending, q.occupied), (2, 4));
    // queued + reserved == qlen: another reservation is refused...
    let e = evd.reserve().unwrap_err();
    assert!(
        matches!(
            e,
            Error::InsufficientResources {
                resource: Subtype::ResourceTevd,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(e.dat_return().subtype(), Some(Subtype::ResourceTevd));
    // ... and so is every other way in.
    assert_eq!(evd.post_se(102), Err(Error::QueueFull));
    assert!(
        evd.post_event(conn_event(ConnectionEventKind::Broken, 9))
            .is_err()
    );
    // Completing a reservation never fails, even on a "full" EVD.
    evd.complete(r1, dto(1)).unwrap();
    let q = evd.query().unwrap();
    assert_eq!((q.pending, q.occupied), (3, 4));
    // Releasing gives the slot back.
    evd.release(r2).unwrap();
    assert_eq!(evd.query().unwrap().occupied, 3);
    let r3 = evd.reserve().unwrap();
    assert!(evd.reserve().is_err());
    // Dequeue frees a slot too.
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(100)));
    let r4 = evd.reserve().unwrap();
    evd.complete(r4, dto(4)).unwrap();
    evd.complete(r3, dto(3)).unwrap();
    let mut v = Vec::new();
    evd.dequeue_batch(&mut v, 10).unwrap();
    assert_eq!(v, vec![Event::Software(101), dto(1), dto(4), dto(3)]);
    let q = evd.query().unwrap();
    assert_eq!((q.pending, q.occupied), (0, 0));
}

#[test]
fn completions_of_all_reservations_fit_under_concurrency() {
    let evd = Evd::create(32, EvdFlags::DTO).unwrap();
    let reserved = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..4u64)
        .map(|p| {
            let (evd, reserved) = (evd.clone(), reserved.clone());
            thread::spawn(move || {
                let mut rs = Vec::new();
                while let Ok(r) = evd.reserve() {
                    rs.push(r);
                    reserved.fetch_add(1, Ordering::SeqCst);
                }
                for (i, r) in rs.into_iter().enumerate() {
                    evd.complete(r, dto(tag(p, i as u64))).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(
        reserved.load(Ordering::SeqCst),
        32,
        "reservations must fill qlen exactly"
    );
    let q = evd.query().unwrap();
    assert_eq!((q.pending, q.occupied, q.overflows), (32, 32, 0));
}

#[test]
fn post_event_overflow_is_counted_reported_once_per_episode_and_evd_stays_usable() {
    let async_evd = Evd::create(16, EvdFlags::ASYNC).unwrap();
    let evd = Evd::builder(2, EvdFlags::CONNECTION | EvdFlags::CR)
        .async_evd(&async_evd)
        .build()
        .unwrap();
    let conn = |ep: u64| conn_event(ConnectionEventKind::Disconnected, ep);
    evd.post_event(conn(1)).unwrap();
    evd.post_event(conn(2)).unwrap();
    // First overflow of the episode: counted and reported.
    let o = evd.post_event(conn(3)).unwrap_err();
    assert!(o.reported);
    // Same episode: counted, not reported again.
    let o = evd.post_event(conn(4)).unwrap_err();
    assert!(!o.reported);
    let o = evd.post_event(cr_event(5, 5)).unwrap_err();
    assert!(!o.reported);
    assert_eq!(evd.query().unwrap().overflows, 3);
    let overflow = Event::AsyncError(AsyncError {
        kind: AsyncErrorKind::EvdOverflow,
        object: DatObject::Evd(evd.handle()),
        consumer_context: evd.consumer_context(),
        reason: rdapl::event::DAT_EVD_OVERFLOW_ERROR,
    });
    assert_eq!(async_evd.dequeue().unwrap(), Some(overflow.clone()));
    assert_eq!(async_evd.dequeue().unwrap(), None, "one report per episode");
    // Still usable: drain one, post again (ends the episode).
    assert_eq!(evd.dequeue().unwrap(), Some(conn(1)));
    evd.post_event(conn(6)).unwrap();
    // A new episode is reported again.
    assert!(evd.post_event(conn(7)).unwrap_err().reported);
    assert_eq!(evd.query().unwrap().overflows, 4);
    assert_eq!(async_evd.dequeue().unwrap(), Some(overflow));
    assert_eq!(async_evd.dequeue().unwrap(), None);
    let mut v = Vec::new();
    evd.dequeue_batch(&mut v, 10).unwrap();
    assert_eq!(v, vec![conn(2), conn(6)]);
    let ev = &v[0];
    assert_eq!(ev.number(), rdapl::EventNumber::ConnectionDisconnected);
}

// ----- upcall policies ---------------------------------------------------------

#[test]
fn single_instance_delivers_events_that_arrive_while_an_upcall_runs() {
    let (in_tx, in_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let in_tx = Mutex::new(in_tx);
    let go_rx = Mutex::new(go_rx);
    let rec = Arc::new(Recorder::default());
    let up = {
        let rec = rec.clone();
        upcall(move |_, ev, more| {
            let first = rec.len() == 0;
            rec.push(ev, more);
            if first {
                let _ = in_tx.lock().unwrap().send(());
                let _ = go_rx.lock().unwrap().recv_timeout(LIMIT);
            }
        })
    };
    let evd = upcall_evd(8, Some(2), UpcallPolicy::SingleInstance, up);
    evd.post_se(1).unwrap();
    in_rx.recv_timeout(LIMIT).expect("no first upcall");
    evd.post_se(2).unwrap();
    evd.post_se(3).unwrap();
    thread::sleep(Duration::from_millis(20));
    assert_eq!(
        rec.len(),
        1,
        "a second single-instance upcall started while one runs"
    );
    go_tx.send(()).unwrap();
    assert!(
        rec.wait_for(3, LIMIT),
        "events that arrived during the upcall were left behind"
    );
    let calls = rec.calls();
    assert_eq!(sw_values(&rec.events()), vec![1, 2, 3]);
    assert!(!calls[0].more);
    assert!(calls[1].more, "event 3 was queued behind event 2");
    assert!(!calls[2].more);
    assert_eq!(evd.query().unwrap().pending, 0);
}

#[test]
fn more_events_flag_reports_what_is_queued() {
    let (rec, evd) = recorded_evd(8, UpcallPolicy::Disable);
    for i in 0..4 {
        evd.post_se(i).unwrap();
    }
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::OnAny)
            .unwrap(),
        4
    );
    assert!(rec.wait_for(4, LIMIT));
    let calls = rec.calls();
    assert_eq!(sw_values(&rec.events()), vec![0, 1, 2, 3]);
    assert_eq!(
        calls.iter().map(|c| c.more).collect::<Vec<_>>(),
        vec![true, true, true, false]
    );
}

#[test]
fn many_runs_upcalls_concurrently_on_a_multi_thread_dispatcher() {
    let active = Arc::new(AtomicUsize::new(0));
    let max_active = Arc::new(AtomicUsize::new(0));
    let rec = Arc::new(Recorder::default());
    let up = {
        let (active, max_active, rec) = (active.clone(), max_active.clone(), rec.clone());
        upcall(move |_, ev, more| {
            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
            max_active.fetch_max(now, Ordering::SeqCst);
            thread::sleep(Duration::from_millis(30));
            active.fetch_sub(1, Ordering::SeqCst);
            rec.push(ev, more);
        })
    };
    let evd = Evd::builder(16, EvdFlags::SOFTWARE)
        .dispatch(Dispatcher::new(2))
        .build()
        .unwrap();
    evd.modify_upcall(UpcallPolicy::Disable, Some(up), ReEnable::Strict)
        .unwrap();
    for i in 0..6 {
        evd.post_se(i).unwrap();
    }
    let t0 = Instant::now();
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::Many, None, ReEnable::OnAny)
            .unwrap(),
        6
    );
    assert!(rec.wait_for(6, LIMIT));
    assert!(
        max_active.load(Ordering::SeqCst) >= 2,
        "Many never ran two upcalls at once (took {:?})",
        t0.elapsed()
    );
    let mut vals = sw_values(&rec.events());
    vals.sort_unstable();
    assert_eq!(vals, (0..6).collect::<Vec<_>>(), "each event exactly once");
    thread::sleep(Duration::from_millis(20));
    assert_eq!(rec.len(), 6);
}

/// With `Many`, an event that arrives while the only running upcall is busy
/// is delivered by a second, concurrent upcall on an idle dispatcher thread
/// (it does not wait for the busy upcall to return).
#[test]
fn many_delivers_an_arrival_concurrently_with_a_busy_upcall() {
    let (in_tx, in_rx) = mpsc::channel::<u64>();
    let in_tx = Mutex::new(in_tx);
    let second_started = Arc::new(AtomicBool::new(false));
    let overlapped = Arc::new(AtomicBool::new(false));
    let up = {
        let (second_started, overlapped) = (second_started.clone(), overlapped.clone());
        upcall(move |_, ev, _more| {
            let v = match ev {
                Some(Event::Software(v)) => v,
                _ => 0,
            };
            let _ = in_tx.lock().unwrap().send(v);
            if v == 1 {
                // Stay busy until the second upcall shows up (bounded).
                let ok = eventually(Duration::from_secs(1), || {
                    second_started.load(Ordering::SeqCst)
                });
                overlapped.store(ok, Ordering::SeqCst);
            } else {
                second_started.store(true, Ordering::SeqCst);
            }
        })
    };
    let evd = upcall_evd(8, Some(2), UpcallPolicy::Many, up);
    evd.post_se(1).unwrap();
    assert_eq!(in_rx.recv_timeout(LIMIT).unwrap(), 1);
    evd.post_se(2).unwrap();
    assert_eq!(
        in_rx.recv_timeout(LIMIT).expect("event 2 never delivered"),
        2
    );
    assert!(eventually(LIMIT, || evd.query().unwrap().pending == 0));
    thread::sleep(Duration::from_millis(10));
    assert!(
        overlapped.load(Ordering::SeqCst),
        "with Many and an idle dispatcher thread, event 2 waited for the upcall of event 1 to return"
    );
}

#[test]
fn notify_only_calls_once_with_none_and_stays_off_until_rearmed() {
    let rec = Arc::new(Recorder::default());
    let evd = sw_evd(16);
    assert_eq!(
        evd.modify_upcall(
            UpcallPolicy::NotifyOnly,
            Some(rec.upcall()),
            ReEnable::OnNew
        )
        .unwrap(),
        0
    );
    for i in 0..3 {
        evd.post_se(i).unwrap();
    }
    assert!(rec.wait_for(1, LIMIT), "no notify upcall");
    thread::sleep(QUIET);
    evd.post_se(3).unwrap();
    thread::sleep(QUIET);
    let calls = rec.calls();
    assert_eq!(
        calls.len(),
        1,
        "notify-only fired more than once without a re-arm"
    );
    assert_eq!(
        calls[0].event, None,
        "a notify-only upcall carries no event"
    );
    // The events were not consumed by the notification.
    assert_eq!(evd.query().unwrap().pending, 4);
    // Re-arm for new arrivals: reports the pending count, fires nothing now.
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::NotifyOnly, None, ReEnable::OnNew)
            .unwrap(),
        4
    );
    thread::sleep(QUIET);
    assert_eq!(rec.len(), 1, "OnNew fired for events already queued");
    evd.post_se(4).unwrap();
    assert!(
        rec.wait_for(2, LIMIT),
        "armed notify-only missed a new arrival"
    );
    // Re-arm with OnAny while events are queued: fires at once.
    evd.modify_upcall(UpcallPolicy::NotifyOnly, None, ReEnable::OnAny)
        .unwrap();
    assert!(
        rec.wait_for(3, LIMIT),
        "OnAny did not notify for queued events"
    );
    thread::sleep(QUIET);
    assert_eq!(rec.len(), 3);
    assert!(rec.calls().iter().all(|c| c.event.is_none()));
    let mut v = Vec::new();
    evd.dequeue_batch(&mut v, 100).unwrap();
    assert_eq!(sw_values(&v), vec![0, 1, 2, 3, 4]);
}

/// An EVD whose first notify-only upcall stays open until `go` is sent;
/// every notification is reported on `notified`.
struct HeldNotify {
    evd: Evd,
    notified: mpsc::Receiver<()>,
    go: mpsc::Sender<()>,
}

impl HeldNotify {
    /// Re-arms notify-only in `mode`; the pending count it reports.
    fn rearm(&self, mode: ReEnable) -> usize {
        self.evd
            .modify_upcall(UpcallPolicy::NotifyOnly, None, mode)
            .unwrap()
    }

    /// Lets the held notification return; whether a notification (the
    /// running one's or a new one) comes within `limit`.
    fn release_then_notified(&self, limit: Duration) -> bool {
        self.go.send(()).unwrap();
        self.notified.recv_timeout(limit).is_ok()
    }

    /// Lets the held notification return, expects a notification within a
    /// second (`what` if none comes), then dequeues software event `v`.
    fn release_and_expect_notified(&self, v: u64, what: &str) {
        let notified = self.release_then_notified(Duration::from_secs(1));
        assert!(
            notified,
            "{what} (pending {})",
            self.evd.query().unwrap().pending
        );
        assert_eq!(self.evd.dequeue().unwrap(), Some(Event::Software(v)));
    }
}

fn held_notify() -> HeldNotify {
    let (in_tx, in_rx) = mpsc::channel::<()>();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let in_tx = Mutex::new(in_tx);
    let go_rx = Mutex::new(go_rx);
    let n = AtomicUsize::new(0);
    let up = upcall(move |_, _ev, _more| {
        let k = n.fetch_add(1, Ordering::SeqCst);
        let _ = in_tx.lock().unwrap().send(());
        if k == 0 {
            // Hold the first notification open until the consumer re-armed.
            let _ = go_rx.lock().unwrap().recv_timeout(LIMIT);
        }
    });
    let evd = upcall_evd(8, Some(2), UpcallPolicy::NotifyOnly, up);
    evd.post_se(1).unwrap();
    in_rx.recv_timeout(LIMIT).expect("no first notification");
    HeldNotify {
        evd,
        notified: in_rx,
        go: go_tx,
    }
}

/// The arm-inside-the-notification pattern (what a poller does): the
/// notify-only upcall hands off to a thread, which drains and re-arms while
/// the upcall has not returned yet. An event that arrives after the re-arm
/// must produce a new notification.
#[test]
fn notify_only_rearmed_while_its_upcall_is_still_running_does_not_lose_a_wakeup() {
    let h = held_notify();
    // Consumer thread: drain, re-arm (nothing pending), then a new arrival.
    assert_eq!(h.evd.dequeue().unwrap(), Some(Event::Software(1)));
    assert_eq!(h.rearm(ReEnable::OnNew), 0);
    h.evd.post_se(2).unwrap();
    h.release_and_expect_notified(
        2,
        "lost wakeup: re-armed notify-only EVD holds event 2 and no notification came",
    );
}

/// Same window, `OnAny` re-arm with an event still queued: the queued event
/// must be notified (by the running run or a new one).
#[test]
fn notify_only_on_any_rearm_while_its_upcall_is_still_running_notifies_queued_events() {
    let h = held_notify();
    assert_eq!(h.rearm(ReEnable::OnAny), 1);
    h.release_and_expect_notified(
        1,
        "OnAny re-arm with event 1 queued produced no notification",
    );
}

/// Same window, `OnNew` re-arm with an event still queued and no new
/// arrival: the caller was told (pending 1), and no notification comes.
#[test]
fn notify_only_on_new_rearm_while_its_upcall_is_still_running_stays_quiet() {
    let h = held_notify();
    assert_eq!(h.rearm(ReEnable::OnNew), 1);
    assert!(
        !h.release_then_notified(QUIET),
        "OnNew notified for an event that was already queued"
    );
    // A new arrival does notify.
    h.evd.post_se(2).unwrap();
    assert!(
        h.notified.recv_timeout(LIMIT).is_ok(),
        "armed EVD missed a new arrival"
    );
}

#[test]
fn upcalls_run_on_a_dispatcher_thread_never_on_the_callers_stack() {
    let me = thread::current().id();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let rec = Arc::new(Recorder::default());
    let waited_ok = Arc::new(AtomicUsize::new(0));
    let up = {
        let (rec, waited_ok) = (rec.clone(), waited_ok.clone());
        upcall(move |_, ev, more| {
            // Blocks until the poster has *returned*: if this ran inline
            // inside post_se/modify_upcall, it would time out here.
            if go_rx
                .lock()
                .unwrap()
                .recv_timeout(Duration::from_secs(2))
                .is_ok()
            {
                waited_ok.fetch_add(1, Ordering::SeqCst);
            }
            rec.push(ev, more);
        })
    };
    let evd = upcall_evd(8, Some(2), UpcallPolicy::SingleInstance, up);
    // post_se path.
    let t0 = Instant::now();
    evd.post_se(1).unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "post_se waited for the upcall"
    );
    go_tx.send(()).unwrap();
    assert!(rec.wait_for(1, LIMIT));
    // modify_upcall(OnAny) path.
    evd.modify_upcall(UpcallPolicy::Disable, None, ReEnable::Strict)
        .unwrap();
    evd.post_se(2).unwrap();
    let t0 = Instant::now();
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::OnAny)
            .unwrap(),
        1
    );
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "modify_upcall waited for the upcall"
    );
    go_tx.send(()).unwrap();
    assert!(rec.wait_for(2, LIMIT));
    let calls = rec.calls();
    assert!(
        calls.iter().all(|c| c.thread != me),
        "an upcall ran on the caller's thread"
    );
    assert_eq!(waited_ok.load(Ordering::SeqCst), 2);
    assert_eq!(sw_values(&rec.events()), vec![1, 2]);
}

#[test]
fn an_upcall_may_modify_its_own_evd() {
    let (tx, rx) = mpsc::channel::<(u64, rdapl::Result<usize>)>();
    let tx = Mutex::new(tx);
    let up = upcall(move |evd, ev, _more| {
        // Never panic in an upcall: report unexpected calls as value 0.
        let v = match ev {
            Some(Event::Software(v)) => v,
            _ => 0,
        };
        let r = match v {
            // Turn upcalls off from inside the upcall.
            1 => evd.modify_upcall(UpcallPolicy::Disable, None, ReEnable::Strict),
            // Switch to notify-only for new arrivals, from inside.
            2 => evd.modify_upcall(UpcallPolicy::NotifyOnly, None, ReEnable::OnNew),
            _ => Ok(usize::MAX),
        };
        let _ = tx.lock().unwrap().send((v, r));
    });
    let evd = upcall_evd(8, None, UpcallPolicy::SingleInstance, up);
    evd.post_se(1).unwrap();
    let (v, r) = rx
        .recv_timeout(LIMIT)
        .expect("upcall deadlocked in modify_upcall");
    assert_eq!((v, r), (1, Ok(0)));
    assert_eq!(evd.query().unwrap().upcall_policy, UpcallPolicy::Disable);
    evd.post_se(2).unwrap();
    evd.post_se(3).unwrap();
    assert!(
        rx.recv_timeout(QUIET).is_err(),
        "delivered although disabled from the upcall"
    );
    // Re-enable from outside: event 2's upcall switches to NotifyOnly/OnNew
    // and sees event 3 pending.
    evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::OnAny)
        .unwrap();
    let (v, r) = rx
        .recv_timeout(LIMIT)
        .expect("upcall deadlocked in modify_upcall");
    assert_eq!((v, r), (2, Ok(1)));
    assert_eq!(evd.query().unwrap().upcall_policy, UpcallPolicy::NotifyOnly);
    assert!(
        rx.recv_timeout(QUIET).is_err(),
        "event 3 delivered after the switch to notify-only"
    );
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(3)));
}

#[test]
fn teardown_waits_for_the_running_upcall() {
    let (in_tx, in_rx) = mpsc::channel::<()>();
    let in_tx = Mutex::new(in_tx);
    let finished = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicUsize::new(0));
    let up = {
        let (finished, calls) = (finished.clone(), calls.clone());
        upcall(move |_, _ev, _more| {
            calls.fetch_add(1, Ordering::SeqCst);
            let _ = in_tx.lock().unwrap().send(());
            thread::sleep(Duration::from_millis(200));
            finished.store(true, Ordering::SeqCst);
        })
    };
    let evd = upcall_evd(8, None, UpcallPolicy::SingleInstance, up);
    evd.post_se(1).unwrap();
    in_rx.recv_timeout(LIMIT).expect("no upcall");
    evd.post_se(2).unwrap(); // queued behind the running upcall
    let t0 = Instant::now();
    let (e2, f2) = (evd.clone(), finished.clone());
    let (r, done_at_return) = within(LIMIT, "Teardown", move || {
        let r = e2.modify_upcall(UpcallPolicy::Teardown, None, ReEnable::Strict);
        (r, f2.load(Ordering::SeqCst))
    });
    let took = t0.elapsed();
    r.unwrap();
    assert!(
        done_at_return,
        "Teardown returned after {took:?}, while the upcall was still running"
    );
    // No new upcalls after Teardown; the queued event is still there.
    evd.post_se(3).unwrap();
    thread::sleep(QUIET);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    let q = evd.query().unwrap();
    assert_eq!(q.upcall_policy, UpcallPolicy::Teardown);
    assert_eq!(q.pending, 2);
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(2)));
}

#[test]
fn teardown_with_no_upcall_running_returns_at_once() {
    let (rec, evd) = recorded_evd(4, UpcallPolicy::SingleInstance);
    evd.post_se(1).unwrap();
    assert!(rec.wait_for(1, LIMIT));
    teardown_within(&evd, "idle Teardown").unwrap();
    // Re-enable after a teardown works.
    evd.post_se(2).unwrap();
    evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::OnAny)
        .unwrap();
    assert!(rec.wait_for(2, LIMIT));
}

#[test]
fn disable_stops_delivery() {
    let (rec, evd) = recorded_evd(8, UpcallPolicy::SingleInstance);
    evd.post_se(1).unwrap();
    assert!(rec.wait_for(1, LIMIT));
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::Disable, None, ReEnable::Strict)
            .unwrap(),
        0
    );
    let q = evd.query().unwrap();
    assert_eq!(q.upcall_policy, UpcallPolicy::Disable);
    assert!(q.has_upcall, "Disable keeps the upcall object");
    for i in 2..5 {
        evd.post_se(i).unwrap();
    }
    thread::sleep(QUIET);
    assert_eq!(rec.len(), 1, "delivered while disabled");
    let mut v = Vec::new();
    evd.dequeue_batch(&mut v, 10).unwrap();
    assert_eq!(sw_values(&v), vec![2, 3, 4]);
}

// ----- re-enable modes ---------------------------------------------------------

#[test]
fn strict_reenable_refuses_while_pending_and_stays_disabled() {
    let (rec, evd) = recorded_evd(8, UpcallPolicy::Disable);
    evd.post_se(1).unwrap();
    evd.post_se(2).unwrap();
    for p in [
        UpcallPolicy::SingleInstance,
        UpcallPolicy::Many,
        UpcallPolicy::NotifyOnly,
    ] {
        assert_eq!(
            evd.modify_upcall(p, None, ReEnable::Strict),
            Err(Error::Busy { pending: 2 })
        );
        assert_eq!(evd.query().unwrap().upcall_policy, UpcallPolicy::Disable);
    }
    thread::sleep(QUIET);
    assert_eq!(rec.len(), 0, "a refused Strict re-enable delivered events");
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::Strict),
        Err(Error::Busy { pending: 1 })
    );
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(2)));
    // Empty queue: succeeds.
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::Strict),
        Ok(0)
    );
    assert_eq!(
        evd.query().unwrap().upcall_policy,
        UpcallPolicy::SingleInstance
    );
    evd.post_se(3).unwrap();
    assert!(rec.wait_for(1, LIMIT));
    assert_eq!(sw_values(&rec.events()), vec![3]);
}

#[test]
fn on_any_reenable_delivers_queued_events_by_upcall() {
    let me = thread::current().id();
    let (rec, evd) = recorded_evd(8, UpcallPolicy::Disable);
    for i in 0..3 {
        evd.post_se(i).unwrap();
    }
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::OnAny),
        Ok(3)
    );
    assert_eq!(
        evd.query().unwrap().upcall_policy,
        UpcallPolicy::SingleInstance
    );
    assert!(
        rec.wait_for(3, LIMIT),
        "OnAny left queued events undelivered"
    );
    assert_eq!(sw_values(&rec.events()), vec![0, 1, 2]);
    assert!(rec.calls().iter().all(|c| c.thread != me));
    assert_eq!(evd.query().unwrap().pending, 0);
    // With nothing queued, OnAny is a plain enable.
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::OnAny),
        Ok(0)
    );
}

#[test]
fn on_new_reenable_reports_pending_and_waits_for_a_new_arrival() {
    let (rec, evd) = recorded_evd(8, UpcallPolicy::Disable);
    evd.post_se(1).unwrap();
    evd.post_se(2).unwrap();
    assert_eq!(
        evd.modify_upcall(UpcallPolicy::SingleInstance, None, ReEnable::OnNew),
        Ok(2)
    );
    assert_eq!(
        evd.query().unwrap().upcall_policy,
        UpcallPolicy::SingleInstance
    );
    thread::sleep(QUIET);
    assert_eq!(
        rec.len(),
        0,
        "OnNew delivered already-queued events without a new arrival"
    );
    assert_eq!(evd.query().unwrap().pending, 2);
    // A new arrival starts delivery; the queue drains in order.
    evd.post_se(3).unwrap();
    assert!(
        rec.wait_for(3, LIMIT),
        "new arrival after OnNew not delivered"
    );
    assert_eq!(sw_values(&rec.events()), vec![1, 2, 3]);
}
