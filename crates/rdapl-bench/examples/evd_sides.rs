//! Which side of a queue waits, and what each side costs alone, for the
//! EVD (`reserve` + `complete`, `dequeue`) and a crossbeam bounded
//! channel (`try_send`, `try_recv`) of the same events and capacity:
//!
//! ```sh
//! cargo build --release -p rdapl-bench --example evd_sides
//! target/release/examples/evd_sides serial 3000   # one thread, ns an event a side
//! target/release/examples/evd_sides pair 4        # two threads, who waits
//! target/release/examples/evd_sides delay evd     # work added to one side
//! ```
//!
//! `serial`: one thread pushes 1,000 events then pops them, `rounds`
//! times; the time of each side apart. `pair`: a producer thread and the
//! consumer (this thread), 0.5 s a run, the EVD then crossbeam, `runs`
//! times; per event taken, how often the consumer found the queue empty
//! and the producer found it full, and the producer's lead (sampled; low
//! by up to 63, the producer publishes its count every 64 events).
//! `delay`: `pair` with a chain of dependent multiplies after each event
//! on the producer or the consumer (`cal` times the chains): a side whose
//! added work slows the rate is the one that sets it. Not part of the
//! suite: a tool for reading a machine where the suite's ratios surprise.
use rdapl::evd::EvdProducer;
use rdapl::{Evd, EvdFlags, Event};
use rdapl_bench::util::dto_event;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

const QLEN: usize = 1024;

fn serial(rounds: u32) {
    let n = 1000u64;
    let evd = Evd::create(QLEN, EvdFlags::DTO).unwrap();
    let (tx, rx) = crossbeam_channel::bounded::<Event>(QLEN);
    let mut t = [0f64; 4];
    let mut sum = 0u64;
    for _ in 0..rounds {
        let a = Instant::now();
        for i in 0..n {
            let r = evd.reserve().unwrap();
            evd.complete(r, dto_event(i)).unwrap();
        }
        let b = Instant::now();
        while let Some(Event::Dto(d)) = evd.dequeue().unwrap() {
            sum += d.cookie;
        }
        let c = Instant::now();
        for i in 0..n {
            tx.try_send(dto_event(i)).unwrap();
        }
        let d = Instant::now();
        while let Ok(Event::Dto(e)) = rx.try_recv() {
            sum += e.cookie;
        }
        let e = Instant::now();
        for (k, (from, to)) in [(a, b), (b, c), (c, d), (d, e)].into_iter().enumerate() {
            t[k] += (to - from).as_nanos() as f64;
        }
    }
    let k = f64::from(rounds) * n as f64;
    println!(
        "ns an event: evd produce {:.1} consume {:.1} | crossbeam send {:.1} recv {:.1} (checksum {sum})",
        t[0] / k,
        t[1] / k,
        t[2] / k,
        t[3] / k
    );
}

/// Work after each event: `k` dependent multiplies.
#[inline(never)]
fn work(k: u64) {
    let mut x = 1u64;
    for _ in 0..k {
        x = std::hint::black_box(x.wrapping_mul(3));
    }
    std::hint::black_box(x);
}

/// One two-thread run of `secs` on the EVD (`evd`) or crossbeam, with
/// `pd` / `cd` multiplies after each event on the producer / consumer.
fn pair(evd_queue: bool, secs: f64, pd: u64, cd: u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let lead = Arc::new(AtomicU64::new(0));
    let evd = Evd::create(QLEN, EvdFlags::DTO).unwrap();
    let (tx, rx) = crossbeam_channel::bounded::<Event>(QLEN);
    let producer = {
        let (stop, lead, evd, tx) = (stop.clone(), lead.clone(), evd.clone(), tx.clone());
        std::thread::spawn(move || {
            let (mut i, mut full) = (0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let ok = if evd_queue {
                    evd.reserve()
                        .map(|r| evd.complete(r, dto_event(i)).unwrap())
                        .is_ok()
                } else {
                    tx.try_send(dto_event(i)).is_ok()
                };
                if ok {
                    work(pd);
                    i += 1;
                    if i % 64 == 0 {
                        lead.store(i, Ordering::Relaxed);
                    }
                } else {
                    full += 1;
                    std::hint::spin_loop();
                }
            }
            full
        })
    };
    let start = Instant::now();
    let (mut got, mut empty, mut lead_sum, mut looks) = (0u64, 0u64, 0f64, 0f64);
    while start.elapsed().as_secs_f64() < secs {
        let sent = lead.load(Ordering::Relaxed);
        lead_sum += sent.saturating_sub(got) as f64;
        looks += 1.0;
        for _ in 0..1024 {
            let ok = if evd_queue {
                evd.dequeue().unwrap().is_some()
            } else {
                rx.try_recv().is_ok()
            };
            if ok {
                work(cd);
                got += 1;
            } else {
                empty += 1;
                std::hint::spin_loop();
            }
        }
    }
    let took = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let full = producer.join().unwrap();
    let per = |n: u64| n as f64 / got.max(1) as f64;
    println!(
        "{:9} {:6.2} M/s  empty {:.3}  full {:.3}  lead {:.0}",
        if evd_queue { "evd" } else { "crossbeam" },
        got as f64 / took / 1e6,
        per(empty),
        per(full),
        lead_sum / looks
    );
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, d: u64| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    match a.first().map(String::as_str) {
        Some("serial") => serial(num(1, 2000) as u32),
        Some("cal") => {
            for k in [5u64, 10, 20, 40] {
                let t = Instant::now();
                for _ in 0..1_000_000 {
                    work(k);
                }
                println!("work({k}): {:.1} ns", t.elapsed().as_nanos() as f64 / 1e6);
            }
        }
        Some("delay") => {
            let evd_queue = a.get(1).map(String::as_str) != Some("crossbeam");
            for _ in 0..2 {
                for (pd, cd) in [(0, 0), (5, 0), (0, 5), (0, 0), (10, 0), (0, 10)] {
                    print!("producer +{pd:2} consumer +{cd:2}: ");
                    pair(evd_queue, 0.4, pd, cd);
                }
            }
        }
        _ => {
            for _ in 0..num(1, 4) {
                pair(true, 0.5, 0, 0);
                pair(false, 0.5, 0, 0);
            }
        }
    }
}
