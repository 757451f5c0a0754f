//! Consumer Notification Objects: sticky triggers, several EVDs per CNO,
//! timeouts, enable/disable, direct-waiter suppression, free, and the
//! eventfd form (polled with `poll(2)` and `epoll`).

mod common;

use common::{LIMIT, start_waiter, tag, untag, within};
use rdapl::error::{DatType, Subtype};
use rdapl::event::EvdHandle;
use rdapl::{Cno, Error, Evd, EvdFlags, Event};
use rustix::buffer::spare_capacity;
use rustix::event::{PollFd, PollFlags, Timespec, epoll, poll};
use std::os::fd::BorrowedFd;
use std::sync::mpsc;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

const SHORT: Duration = Duration::from_millis(30);

fn evd_on(cno: &Cno, qlen: usize) -> Evd {
    Evd::builder(qlen, EvdFlags::SOFTWARE)
        .cno(cno)
        .build()
        .unwrap()
}

fn assert_queue_empty(r: rdapl::Result<EvdHandle>) {
    match r {
        Err(e @ Error::QueueEmpty) => {
            assert_eq!(e.dat_return().ty(), Some(DatType::QueueEmpty));
            assert_eq!(e.dat_return().0, 0x8000_0000 | 0x000D_0000);
        }
        other => panic!("expected QueueEmpty, got {other:?}"),
    }
}

/// Posts software event `v` on `evd` from another thread, after [`SHORT`].
fn post_later(evd: &Evd, v: u64) -> thread::JoinHandle<()> {
    let evd = evd.clone();
    thread::spawn(move || {
        thread::sleep(SHORT);
        evd.post_se(v).unwrap();
    })
}

/// Readiness of `fd` for reading within `timeout`, by `poll(2)`.
fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let mut fds = [PollFd::from_borrowed_fd(fd, PollFlags::IN)];
    let ts = Timespec::try_from(timeout).unwrap();
    let n = poll(&mut fds, Some(&ts)).unwrap();
    n == 1 && fds[0].revents().contains(PollFlags::IN)
}

#[test]
fn trigger_is_sticky_and_wait_returns_the_hint() {
    let cno = Cno::new();
    assert!(!cno.is_triggered());
    cno.trigger(EvdHandle(42));
    assert!(cno.is_triggered());
    // Nobody was waiting; the trigger is remembered.
    assert_eq!(cno.wait(Some(Duration::ZERO)), Ok(EvdHandle(42)));
    assert!(!cno.is_triggered());
    assert_queue_empty(cno.wait(Some(Duration::ZERO)));

    // The same through an EVD: the post happens before the wait.
    let evd = evd_on(&cno, 4);
    let q = evd.query().unwrap();
    assert_eq!(q.cno, Some(cno.handle()));
    assert!(q.enabled);
    evd.post_se(1).unwrap();
    let t0 = Instant::now();
    let c2 = cno.clone();
    let hint = within(LIMIT, "wait on a triggered CNO", move || c2.wait(None)).unwrap();
    assert_eq!(hint, evd.handle());
    assert!(t0.elapsed() < Duration::from_secs(1));
    // The event is still on the EVD: the CNO only notifies.
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));
}

#[test]
fn trigger_wakes_a_blocked_waiter() {
    let cno = Cno::new();
    let evd = evd_on(&cno, 4);
    let (tx, rx) = mpsc::channel();
    {
        let cno = cno.clone();
        thread::spawn(move || {
            let _ = tx.send(cno.wait(Some(LIMIT)));
        });
    }
    thread::sleep(SHORT);
    evd.post_se(7).unwrap();
    let got = rx.recv_timeout(LIMIT).expect("CNO waiter not woken");
    assert_eq!(got, Ok(evd.handle()));
}

#[test]
fn several_evds_feed_one_cno() {
    let cno = Cno::new();
    let evds: Vec<Evd> = (0..3).map(|_| evd_on(&cno, 8)).collect();
    // One at a time: the hint names the EVD that fired.
    for (i, evd) in evds.iter().enumerate() {
        evd.post_se(i as u64).unwrap();
        assert_eq!(cno.wait(Some(LIMIT)), Ok(evd.handle()));
        assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(i as u64)));
    }
    // Two fire before anyone waits: the triggers coalesce into one wakeup
    // whose hint is the first; draining every EVD finds both events.
    evds[2].post_se(20).unwrap();
    evds[0].post_se(21).unwrap();
    assert_eq!(cno.wait(Some(LIMIT)), Ok(evds[2].handle()));
    let mut all = Vec::new();
    for evd in &evds {
        evd.dequeue_batch(&mut all, 10).unwrap();
    }
    assert_eq!(all, vec![Event::Software(21), Event::Software(20)]);
    assert_queue_empty(cno.wait(Some(Duration::ZERO)));
}

/// A consumer that waits on the CNO then drains every EVD never misses an
/// event, whatever the interleaving with producers.
#[test]
fn cno_wait_then_drain_never_misses_an_event() {
    const PER: u64 = 2000;
    let cno = Cno::new();
    let evds: Vec<Evd> = (0..3).map(|_| evd_on(&cno, 4096)).collect();
    let producers: Vec<_> = evds
        .iter()
        .enumerate()
        .map(|(p, evd)| {
            let evd = evd.clone();
            thread::spawn(move || {
                for i in 0..PER {
                    evd.post_se(tag(p as u64, i)).unwrap();
                    if i % 50 == 0 {
                        thread::yield_now();
                    }
                }
            })
        })
        .collect();
    let mut next = [0u64; 3];
    let total = 3 * PER;
    let mut got = 0;
    let mut buf = Vec::new();
    let end = Instant::now() + LIMIT;
    while got < total {
        assert!(
            Instant::now() < end,
            "only {got} of {total} events: a notification was lost"
        );
        match cno.wait(Some(Duration::from_secs(2))) {
            Ok(_) => {}
            Err(Error::QueueEmpty) => panic!("CNO timed out with {got} of {total} events seen"),
            Err(e) => panic!("{e:?}"),
        }
        for evd in &evds {
            buf.clear();
            evd.dequeue_batch(&mut buf, usize::MAX).unwrap();
            for ev in buf.drain(..) {
                let Event::Software(v) = ev else { panic!() };
                let (p, i) = untag(v);
                assert_eq!(i, next[p]);
                next[p] += 1;
                got += 1;
            }
        }
    }
    for h in producers {
        h.join().unwrap();
    }
    assert_eq!(next, [PER; 3]);
}

#[test]
fn wait_timeout_returns_queue_empty() {
    let cno = Cno::new();
    let _evd = evd_on(&cno, 4);
    let t0 = Instant::now();
    let c2 = cno.clone();
    let r = within(LIMIT, "timed CNO wait", move || c2.wait(Some(SHORT)));
    let took = t0.elapsed();
    assert_queue_empty(r);
    assert!(took >= SHORT, "returned after {took:?}, before the timeout");
    assert!(took < LIMIT);
}

#[test]
fn disabled_evd_does_not_trigger_its_cno() {
    let cno = Cno::new();
    let evd = evd_on(&cno, 8);
    evd.disable().unwrap();
    assert!(!evd.query().unwrap().enabled);
    evd.post_se(1).unwrap();
    assert!(!cno.is_triggered(), "a disabled EVD triggered its CNO");
    assert_queue_empty(cno.wait(Some(SHORT)));
    // The event is queued all the same.
    assert_eq!(evd.query().unwrap().pending, 1);
    evd.enable().unwrap();
    assert!(evd.query().unwrap().enabled);
    evd.post_se(2).unwrap();
    assert_eq!(cno.wait(Some(LIMIT)), Ok(evd.handle()));
    // Detaching the CNO stops triggers too; re-attaching restores them.
    evd.modify_cno(None).unwrap();
    assert_eq!(evd.query().unwrap().cno, None);
    evd.post_se(3).unwrap();
    assert!(!cno.is_triggered());
    evd.modify_cno(Some(&cno)).unwrap();
    evd.post_se(4).unwrap();
    assert_eq!(cno.wait(Some(LIMIT)), Ok(evd.handle()));
    let mut v = Vec::new();
    evd.dequeue_batch(&mut v, 10).unwrap();
    assert_eq!(v.len(), 4);
}

#[test]
fn evd_with_a_blocked_waiter_does_not_trigger_its_cno() {
    let cno = Cno::new();
    let evd = evd_on(&cno, 8);
    // Returns once the waiter owns the EVD.
    let (_h, rx) = start_waiter(&evd, Some(LIMIT), 2);
    evd.post_se(1).unwrap(); // below the waiter's threshold of 2
    thread::sleep(SHORT);
    assert!(
        !cno.is_triggered(),
        "CNO triggered although a waiter owns the EVD"
    );
    evd.post_se(2).unwrap();
    let got = rx.recv_timeout(LIMIT).expect("waiter not woken");
    assert_eq!(got.unwrap(), (Event::Software(1), 1));
    assert!(
        !cno.is_triggered(),
        "CNO triggered by the event that woke the direct waiter"
    );
    // Without the waiter, arrivals trigger again.
    evd.post_se(3).unwrap();
    assert!(cno.is_triggered());
    assert_eq!(cno.wait(Some(Duration::ZERO)), Ok(evd.handle()));
}

#[test]
fn free_wakes_cno_waiters_with_abort() {
    let cno = Cno::new();
    let n = 3;
    let barrier = Arc::new(Barrier::new(n + 1));
    let (tx, rx) = mpsc::channel();
    for _ in 0..n {
        let (cno, tx, barrier) = (cno.clone(), tx.clone(), barrier.clone());
        thread::spawn(move || {
            barrier.wait();
            let _ = tx.send(cno.wait(None));
        });
    }
    barrier.wait();
    thread::sleep(SHORT);
    cno.free().unwrap();
    for _ in 0..n {
        let r = rx
            .recv_timeout(LIMIT)
            .expect("a CNO waiter was not woken by free");
        match r {
            Err(e @ Error::Abort(_)) => {
                assert_eq!(e.dat_return().ty(), Some(DatType::Abort));
            }
            other => panic!("expected Abort, got {other:?}"),
        }
    }
    // Later waits fail at once too.
    assert!(matches!(cno.wait(None), Err(Error::Abort(_))));
}

fn in_use(r: rdapl::Result<()>) {
    match r {
        Err(e @ Error::InvalidState { .. }) => assert_eq!(
            e.dat_return(),
            rdapl::error::DatReturn::error(DatType::InvalidState, Subtype::InvalidStateCnoInUse)
        ),
        other => panic!("expected InvalidState(CNO_IN_USE), got {other:?}"),
    }
}

/// A CNO that an EVD feeds is in use: `free` is refused (DAT's
/// `CNO_IN_USE`) until every such EVD let go of it (detached, freed or
/// dropped). A freed CNO takes no EVD, and a second free is refused.
#[test]
fn free_refused_while_an_evd_feeds_it() {
    let cno = Cno::new();
    let (a, b) = (evd_on(&cno, 4), evd_on(&cno, 4));
    let c = Evd::builder(4, EvdFlags::SOFTWARE).build().unwrap();
    c.modify_cno(Some(&cno)).unwrap();
    in_use(cno.free());
    a.modify_cno(None).unwrap();
    in_use(cno.free());
    b.free().unwrap();
    in_use(cno.free());
    drop(c);
    cno.free().unwrap();
    assert!(matches!(
        cno.free(),
        Err(Error::InvalidHandle(Subtype::InvalidHandleCno))
    ));
    assert!(matches!(
        a.modify_cno(Some(&cno)),
        Err(Error::InvalidHandle(Subtype::InvalidHandleCno))
    ));
    assert!(matches!(
        Evd::builder(4, EvdFlags::SOFTWARE).cno(&cno).build(),
        Err(Error::InvalidHandle(Subtype::InvalidHandleCno))
    ));
    // A CNO moved from one EVD to another is still in use.
    let other = Cno::new();
    a.modify_cno(Some(&other)).unwrap();
    in_use(other.free());
    a.free().unwrap();
    other.free().unwrap();
}

#[test]
fn fd_form_becomes_readable_on_trigger() {
    assert!(Cno::new().fd().is_none(), "a plain CNO has no fd");
    let cno = Cno::with_fd().unwrap();
    let fd = cno.fd().expect("with_fd gives an fd");
    let evd = evd_on(&cno, 8);
    assert!(!readable(fd, Duration::ZERO), "readable before any trigger");

    // A trigger from another thread wakes a poll(2) that is already blocked.
    let poster = post_later(&evd, 1);
    let t0 = Instant::now();
    assert!(readable(fd, LIMIT), "eventfd not readable after a trigger");
    assert!(t0.elapsed() < LIMIT);
    poster.join().unwrap();
    // Consuming the trigger (zero-timeout wait) drains the fd.
    assert_eq!(cno.wait(Some(Duration::ZERO)), Ok(evd.handle()));
    assert!(
        !readable(fd, Duration::ZERO),
        "readable after the trigger was consumed"
    );
    assert_eq!(evd.dequeue().unwrap(), Some(Event::Software(1)));

    // Sticky through the fd as well: trigger first, poll later.
    evd.post_se(2).unwrap();
    evd.post_se(3).unwrap(); // coalesces
    assert!(readable(fd, Duration::ZERO));
    assert_eq!(cno.wait(Some(Duration::ZERO)), Ok(evd.handle()));
    assert!(!readable(fd, Duration::ZERO));
    // A disabled EVD does not make the fd readable.
    evd.disable().unwrap();
    evd.post_se(4).unwrap();
    assert!(!readable(fd, SHORT));
}

#[test]
fn fd_form_works_with_epoll() {
    let cno = Cno::with_fd().unwrap();
    let evd = evd_on(&cno, 8);
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
    epoll::add(
        &ep,
        cno.fd().unwrap(),
        epoll::EventData::new_u64(7),
        epoll::EventFlags::IN,
    )
    .unwrap();
    let mut events: Vec<epoll::Event> = Vec::with_capacity(4);
    let zero = Timespec::try_from(Duration::ZERO).unwrap();
    let n = epoll::wait(&ep, spare_capacity(&mut events), Some(&zero)).unwrap();
    assert_eq!(n, 0, "ready before any trigger");
    let poster = post_later(&evd, 1);
    let limit = Timespec::try_from(LIMIT).unwrap();
    let n = epoll::wait(&ep, spare_capacity(&mut events), Some(&limit)).unwrap();
    poster.join().unwrap();
    assert_eq!(n, 1, "epoll did not report the CNO's eventfd");
    let data = events[0].data;
    assert_eq!(data.u64(), 7);
    assert_eq!(cno.wait(Some(Duration::ZERO)), Ok(evd.handle()));
    events.clear();
    let n = epoll::wait(&ep, spare_capacity(&mut events), Some(&zero)).unwrap();
    assert_eq!(n, 0, "still ready after the trigger was consumed");
}
