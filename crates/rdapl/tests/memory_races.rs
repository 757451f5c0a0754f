//! Races on the memory the `unsafe` code hands out: the EVD's ring while it
//! grows under producers and consumers, and registered memory while its
//! registration ends. Each case runs many rounds and counts the bad ones.

mod common;
use common::*;
use rdapl::*;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Two producers post tagged software events, two consumers take them in
/// batches, and a third thread resizes the EVD up (through several ring
/// changes) and down while they run: every event is taken exactly once, and
/// each consumer sees each producer's events in order.
#[test]
fn resize_while_producing_and_consuming_takes_each_event_once() {
    const ROUNDS: usize = 10;
    const N: u64 = 4_000;
    let mut bad = 0;
    for round in 0..ROUNDS {
        let evd = sw_evd(2);
        let end = Instant::now() + Duration::from_secs(60);
        let go = Arc::new(Barrier::new(5));
        let taken = Arc::new(AtomicU64::new(0));
        let seen: Arc<Vec<AtomicUsize>> =
            Arc::new((0..2 * N as usize).map(|_| AtomicUsize::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let mut hs = Vec::new();
        for p in 0..2u64 {
            let (evd, go) = (evd.clone(), go.clone());
            hs.push(std::thread::spawn(move || {
                go.wait();
                for i in 0..N {
                    post_retry(&evd, tag(p, i), end);
                }
                0usize
            }));
        }
        for c in 0..2 {
            let (evd, go, taken, seen) = (evd.clone(), go.clone(), taken.clone(), seen.clone());
            hs.push(std::thread::spawn(move || {
                go.wait();
                let mut last = [None::<u64>; 2];
                let mut out = Vec::new();
                let mut ooo = 0usize;
                while taken.load(Ordering::Acquire) < 2 * N {
                    assert!(Instant::now() < end, "consumer stuck");
                    out.clear();
                    // One consumer takes events one by one, the other in batches.
                    let n = if c == 0 {
                        out.extend(evd.dequeue().unwrap());
                        out.len()
                    } else {
                        evd.dequeue_batch(&mut out, 7).unwrap()
                    };
                    if n == 0 {
                        std::thread::yield_now();
                        continue;
                    }
                    taken.fetch_add(n as u64, Ordering::AcqRel);
                    for e in &out {
                        let (p, i) = untag(sw_value(e));
                        seen[p * N as usize + i as usize].fetch_add(1, Ordering::Relaxed);
                        if last[p].is_some_and(|l| l >= i) {
                            ooo += 1;
                        }
                        last[p] = Some(i);
                    }
                }
                ooo
            }));
        }
        // Grows the ring (a new ring each time: 4, 8, ... 2048 slots) at
        // points spread over the run, each followed by a shrink of the
        // queue length back to 2 so that producers keep finding the EVD
        // full (slots reused while consumers copy them out).
        let resizer = {
            let (evd, go, stop, taken) = (evd.clone(), go.clone(), stop.clone(), taken.clone());
            std::thread::spawn(move || {
                go.wait();
                let mut grown = 0;
                for k in 1..=10u64 {
                    while taken.load(Ordering::Acquire) < k * 2 * N / 11 {
                        if stop.load(Ordering::Acquire) {
                            return grown;
                        }
                        std::thread::yield_now();
                    }
                    if evd.resize((2usize << k) - 1).is_ok() {
                        grown += 1;
                    }
                    std::thread::yield_now();
                    while evd.resize(2).is_err() && !stop.load(Ordering::Acquire) {
                        std::thread::yield_now();
                    }
                }
                grown
            })
        };
        let mut ooo = 0;
        for (k, h) in hs.into_iter().enumerate() {
            let r = h.join().unwrap();
            if k >= 2 {
                ooo += r;
            }
        }
        stop.store(true, Ordering::Release);
        assert_eq!(resizer.join().unwrap(), 10, "every grow happened");
        let twice = seen
            .iter()
            .filter(|c| c.load(Ordering::Relaxed) > 1)
            .count();
        let never = seen
            .iter()
            .filter(|c| c.load(Ordering::Relaxed) == 0)
            .count();
        let left = evd.dequeue().unwrap();
        if twice + never + ooo > 0 || left.is_some() {
            eprintln!(
                "round {round}: twice {twice} never {never} out of order {ooo} left {left:?}"
            );
            bad += 1;
        }
    }
    assert_eq!(
        bad, 0,
        "{bad} of {ROUNDS} rounds lost, duplicated or reordered events"
    );
}

// ----- a provider whose `mem_free` panics --------------------------------------

mod panicky {
    use rdapl::event::{PzHandle, SrqHandle};
    use rdapl::provider::{
        EpInfo, EpOps, ListenerOps, MemGrant, MemInfo, Provider, PzOps, SpInner, SrqOps, Transport,
    };
    use rdapl::*;
    use std::net::IpAddr;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// The loopback provider, except that `mem_free` panics while `armed`.
    pub struct Panicky {
        pub inner: Arc<dyn Provider>,
        pub armed: Arc<AtomicBool>,
    }
    struct Ia_ {
        inner: Arc<dyn Transport>,
        armed: Arc<AtomicBool>,
    }
    struct Pz_ {
        inner: Box<dyn PzOps>,
        armed: Arc<AtomicBool>,
    }
    impl Provider for Panicky {
        fn attr(&self) -> ProviderAttr {
            self.inner.attr()
        }
        fn ia_attr(&self, address: IpAddr) -> IaAttr {
            self.inner.ia_attr(address)
        }
        fn open(&self, address: Option<IpAddr>, params: &str) -> Result<Arc<dyn Transport>> {
            Ok(Arc::new(Ia_ {
                inner: self.inner.open(address, params)?,
                armed: self.armed.clone(),
            }))
        }
    }
    impl Transport for Ia_ {
        fn address(&self) -> IpAddr {
            self.inner.address()
        }
        fn ep_create(&self, ep: &EpInfo<'_>) -> Result<Box<dyn EpOps>> {
            self.inner.ep_create(ep)
        }
        fn listen(&self, sp: &Arc<SpInner>) -> Result<Box<dyn ListenerOps>> {
            self.inner.listen(sp)
        }
        fn pz_create(&self, pz: PzHandle) -> Result<Box<dyn PzOps>> {
            Ok(Box::new(Pz_ {
                inner: self.inner.pz_create(pz)?,
                armed: self.armed.clone(),
            }))
        }
        fn srq_create(&self, srq: SrqHandle, pz: PzHandle) -> Result<Box<dyn SrqOps>> {
            self.inner.srq_create(srq, pz)
        }
        fn close(&self) {
            self.inner.close()
        }
    }
    impl PzOps for Pz_ {
        fn mem_create(&self, mem: &MemInfo) -> Result<MemGrant> {
            self.inner.mem_create(mem)
        }
        fn mem_free(&self, mem: &MemInfo) {
            if self.armed.load(Ordering::SeqCst) {
                panic!("the provider's mem_free panics");
            }
            self.inner.mem_free(mem)
        }
        fn free(&self) {
            self.inner.free()
        }
    }
}

/// A provider (safe code) whose `mem_free` panics while the scope of two
/// leaked borrowed LMRs ends: the panic leaves the scope, so the buffers
/// are the caller's again, and both regions must be retired by then (else
/// a transfer resolved earlier, or a holder of the region, reaches memory
/// the caller owns again, or has freed).
#[test]
fn a_panicking_mem_free_does_not_leave_borrowed_memory_registered() {
    let armed = Arc::new(AtomicBool::new(false));
    let p = Arc::new(panicky::Panicky {
        inner: rdapl::builtin().get("loopback").unwrap(),
        armed: armed.clone(),
    });
    let ia = Ia::open_provider(p, ia_options("127.0.253.2")).unwrap();
    let pz = ia.pz_create().unwrap();
    let (mut a, mut b) = (vec![0u8; 64], vec![0u8; 64]);
    let mut regions = Vec::new();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        lmr_scope(|s| {
            for buf in [&mut a, &mut b] {
                let l = pz.lmr_create_borrowed(s, buf, MemPriv::ALL).unwrap();
                regions.push(l.region().unwrap());
                std::mem::forget(l);
            }
            armed.store(true, Ordering::SeqCst);
        })
    }));
    armed.store(false, Ordering::SeqCst);
    assert!(r.is_err(), "the provider's panic reaches the caller");
    // `a` and `b` are the caller's again here.
    let live: Vec<usize> = (0..2).filter(|&i| !regions[i].is_retired()).collect();
    let readable = regions.iter().filter(|r| r.try_write().is_some()).count();
    assert!(
        live.is_empty(),
        "regions {live:?} of the ended scope are not retired ({readable} still writable through rdapl)"
    );
    a[0] = 1;
    b[0] = 1;
}
