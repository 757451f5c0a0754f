//! The async `Stream` of EVD events (feature `stream`).
#![cfg(feature = "stream")]

mod common;

use common::{LIMIT, spawn_poster, start_waiter, sw_evd, within};
use futures_executor::block_on;
use rdapl::error::Subtype;
use rdapl::{Error, Event};
use std::future::Future;
use std::pin::Pin;
use std::sync::mpsc;
use std::task::{Context, Poll};
use std::thread;
use std::time::{Duration, Instant};

/// `StreamExt::next` without futures-util.
struct Next<'a, S>(&'a mut S);

impl<S: futures_core::Stream + Unpin> Future for Next<'_, S> {
    type Output = Option<S::Item>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut *self.0).poll_next(cx)
    }
}

fn next<S: futures_core::Stream + Unpin>(s: &mut S) -> Next<'_, S> {
    Next(s)
}

#[test]
fn yields_queued_events_in_order() {
    let evd = sw_evd(16);
    for i in 0..10 {
        evd.post_se(i).unwrap();
    }
    let mut s = evd.stream();
    let got = within(LIMIT, "reading 10 queued events", move || {
        block_on(async {
            let mut v = Vec::new();
            for _ in 0..10 {
                v.push(next(&mut s).await.unwrap().unwrap());
            }
            v
        })
    });
    assert_eq!(got, (0..10).map(Event::Software).collect::<Vec<_>>());
    assert_eq!(evd.query().unwrap().pending, 0);
}

#[test]
fn wakes_on_later_arrivals_from_another_thread() {
    const N: u64 = 2000;
    let evd = sw_evd(64);
    let producer = spawn_poster(&evd, 0..N, Instant::now() + LIMIT, |k| {
        // Sometimes let the consumer go idle first.
        if (k + 1) % 100 == 0 {
            thread::sleep(Duration::from_millis(1));
        }
    });
    let mut s = evd.stream();
    let got = within(LIMIT, "stream consumer (a wakeup was missed?)", move || {
        block_on(async {
            let mut v = Vec::with_capacity(N as usize);
            while (v.len() as u64) < N {
                match next(&mut s).await {
                    Some(Ok(Event::Software(x))) => v.push(x),
                    other => panic!("unexpected {other:?}"),
                }
            }
            v
        })
    });
    producer.join().unwrap();
    assert_eq!(got, (0..N).collect::<Vec<_>>());
}

#[test]
fn a_pending_stream_is_woken_by_a_single_arrival() {
    let evd = sw_evd(4);
    let mut s = evd.stream();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let r = block_on(next(&mut s));
        let _ = tx.send(r);
    });
    thread::sleep(Duration::from_millis(30));
    assert!(rx.try_recv().is_err(), "stream yielded on an empty EVD");
    evd.post_se(5).unwrap();
    let got = rx
        .recv_timeout(LIMIT)
        .expect("stream not woken by the arrival");
    assert_eq!(got.unwrap().unwrap(), Event::Software(5));
}

#[test]
fn ends_after_free() {
    let evd = sw_evd(4);
    let mut s = evd.stream();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        block_on(async {
            // One event, then the end of the stream.
            let first = next(&mut s).await;
            let _ = tx.send(first.map(|r| r.map_err(|e| format!("{e:?}"))));
            let end = next(&mut s).await;
            let _ = tx.send(end.map(|r| r.map_err(|e| format!("{e:?}"))));
        })
    });
    evd.post_se(1).unwrap();
    assert_eq!(
        rx.recv_timeout(LIMIT).unwrap(),
        Some(Ok(Event::Software(1)))
    );
    thread::sleep(Duration::from_millis(30)); // the task is now parked on an empty EVD
    evd.free().unwrap();
    assert_eq!(
        rx.recv_timeout(LIMIT)
            .expect("pending stream not woken by free"),
        None,
        "stream did not end after free"
    );
    // A stream made after the free ends at once.
    let mut s2 = evd.stream();
    assert!(
        within(LIMIT, "stream on a freed EVD", move || block_on(next(
            &mut s2
        )))
        .is_none()
    );
}

#[test]
fn reports_a_waiter_owning_the_evd() {
    let evd = sw_evd(8);
    let (waiter, result) = start_waiter(&evd, Some(LIMIT), 2);
    let mut s = evd.stream();
    let r = within(LIMIT, "stream while a waiter owns", move || {
        block_on(next(&mut s))
    });
    match r {
        Some(Err(Error::InvalidState {
            state: Subtype::InvalidStateEvdWaiter,
            ..
        })) => {}
        other => panic!("expected an InvalidState item, got {other:?}"),
    }
    evd.post_se(1).unwrap();
    evd.post_se(2).unwrap();
    waiter.join().unwrap();
    assert_eq!(result.recv().unwrap().unwrap(), (Event::Software(1), 1));
}

/// A waker that only records that it was woken.
#[derive(Default)]
struct Flag(std::sync::atomic::AtomicBool);

impl std::task::Wake for Flag {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref()
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Stream A parks on an empty EVD; stream B polls in a loop while a
/// producer posts one event, and takes it. A post after that must still
/// wake A: B's poll must not disarm the wake-up A parked on. Counts the
/// rounds where A was never woken though an event was left queued.
fn parked_stream_stranded_rounds(rounds: usize) -> usize {
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Barrier};
    let mut stranded = 0;
    for round in 0..rounds {
        let evd = sw_evd(4);
        let mut a = evd.stream();
        let flag = Arc::new(Flag::default());
        let waker = std::task::Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(futures_core::Stream::poll_next(Pin::new(&mut a), &mut cx).is_pending());
        let go = Arc::new(Barrier::new(2));
        let producer = {
            let (evd, go) = (evd.clone(), go.clone());
            thread::spawn(move || {
                go.wait();
                // Vary the start so the push lands inside B's loop.
                for _ in 0..(round % 64) * 8 {
                    std::hint::spin_loop();
                }
                evd.post_se(1).unwrap();
            })
        };
        let mut b = evd.stream();
        let mut bcx = Context::from_waker(std::task::Waker::noop());
        go.wait();
        let end = Instant::now() + LIMIT;
        let got = loop {
            if let Poll::Ready(item) = futures_core::Stream::poll_next(Pin::new(&mut b), &mut bcx) {
                break item;
            }
            assert!(Instant::now() < end, "B never got the event");
        };
        producer.join().unwrap();
        assert_eq!(got.unwrap().unwrap(), Event::Software(1));
        // B stops reading; A must be told of this one.
        evd.post_se(2).unwrap();
        if !flag.0.load(Ordering::SeqCst) {
            stranded += 1;
        }
    }
    stranded
}

#[test]
fn a_parked_stream_stays_armed_while_another_polls() {
    let stranded = parked_stream_stranded_rounds(3000);
    assert_eq!(
        stranded, 0,
        "a parked stream was never woken for a queued event in {stranded} of 3000 rounds"
    );
}

/// `free` racing a poll of the stream: a poll that returned `Pending`
/// is woken, and the next poll ends the stream.
#[test]
fn a_free_racing_a_poll_ends_the_stream() {
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Barrier};
    let mut stranded = 0;
    for round in 0..2000 {
        let evd = sw_evd(4);
        let mut s = evd.stream();
        let flag = Arc::new(Flag::default());
        let waker = std::task::Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let go = Arc::new(Barrier::new(2));
        let freer = {
            let (evd, go) = (evd.clone(), go.clone());
            thread::spawn(move || {
                go.wait();
                for _ in 0..(round % 64) * 4 {
                    std::hint::spin_loop();
                }
                evd.free().unwrap();
            })
        };
        go.wait();
        let polled = futures_core::Stream::poll_next(Pin::new(&mut s), &mut cx);
        freer.join().unwrap();
        match polled {
            Poll::Ready(None) => {}
            Poll::Pending if flag.0.load(Ordering::SeqCst) => {}
            Poll::Pending => stranded += 1,
            Poll::Ready(Some(item)) => panic!("an item from an empty EVD: {item:?}"),
        }
    }
    assert_eq!(stranded, 0, "polls left pending and never woken");
}
