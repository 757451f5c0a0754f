//! One thread pushes and pops `n` events through an EVD or a crossbeam
//! channel: the software cost per event without any cross-core traffic, for
//! an instruction-count profiler (deterministic on a noisy machine):
//!
//! ```sh
//! cargo build --release -p rdapl-bench --example profile_evd_serial
//! valgrind --tool=callgrind target/release/examples/profile_evd_serial evd 1000000
//! ```
//!
//! Arguments: `evd` (`reserve` + `complete` + `dequeue`), `evd-batch`
//! (64 completions, then one `dequeue_batch`) or `crossbeam` (`try_send` +
//! `try_recv`), and the number of events. Prints a checksum of the cookies
//! received (so nothing is optimised away) and the size of an `Event`.
use rdapl::evd::EvdProducer;
use rdapl::{Evd, EvdFlags};
use rdapl_bench::util::dto_event;
fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let n: u64 = a.get(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
    let mut sum = 0u64;
    match a.first().map(String::as_str).unwrap_or("evd") {
        "evd" => {
            let evd = Evd::create(1024, EvdFlags::DTO).unwrap();
            for i in 0..n {
                let r = evd.reserve().unwrap();
                evd.complete(r, dto_event(i)).unwrap();
                if let Some(rdapl::Event::Dto(d)) = evd.dequeue().unwrap() {
                    sum += d.cookie;
                }
            }
        }
        "evd-batch" => {
            let evd = Evd::create(1024, EvdFlags::DTO).unwrap();
            let mut buf = Vec::with_capacity(64);
            for i in 0..n / 64 {
                for j in 0..64 {
                    let r = evd.reserve().unwrap();
                    evd.complete(r, dto_event(i * 64 + j)).unwrap();
                }
                buf.clear();
                evd.dequeue_batch(&mut buf, 64).unwrap();
                for e in buf.drain(..) {
                    if let rdapl::Event::Dto(d) = e {
                        sum += d.cookie;
                    }
                }
            }
        }
        _ => {
            let (tx, rx) = crossbeam_channel::bounded(1024);
            for i in 0..n {
                tx.try_send(dto_event(i)).unwrap();
                if let Ok(rdapl::Event::Dto(d)) = rx.try_recv() {
                    sum += d.cookie;
                }
            }
        }
    }
    println!("{sum} {}", std::mem::size_of::<rdapl::Event>());
}
