//! Shared test helpers: a pair of connections wired by in-memory pipes.
#![allow(dead_code)]

use rdapl_iwarp::{Config, Connection, Event, Role, VecMemory};

/// A tiny xorshift64* RNG: deterministic, no dependency.
#[derive(Debug, Clone)]
pub struct XorShift(pub u64);

impl XorShift {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// One side of a pair.
pub struct Side {
    pub conn: Connection,
    pub mem: VecMemory,
    pub events: Vec<Event>,
}

impl Side {
    pub fn new(role: Role, cfg: Config) -> Self {
        Self {
            conn: Connection::new(role, cfg, 0).unwrap(),
            mem: VecMemory::default(),
            events: vec![],
        }
    }

    /// All bytes this side wants to send now.
    pub fn drain_tx(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut n = 0;
        while let Some(t) = self.conn.poll_transmit(&self.mem) {
            assert!(t.write_to(&self.mem, &mut out), "transmit source missing");
            n += 1;
            assert!(n < 1_000_000, "unbounded transmit");
        }
        out
    }

    pub fn collect_events(&mut self) {
        while let Some(e) = self.conn.poll_event() {
            self.events.push(e);
        }
    }

    pub fn take_events(&mut self) -> Vec<Event> {
        self.collect_events();
        std::mem::take(&mut self.events)
    }
}

/// Initiator `a` and responder `b`.
pub mod convo;

pub struct Pair {
    pub a: Side,
    pub b: Side,
}

impl Pair {
    pub fn new(ca: Config, cb: Config) -> Self {
        Self {
            a: Side::new(Role::Initiator, ca),
            b: Side::new(Role::Responder, cb),
        }
    }

    /// Moves bytes both ways until neither side has anything to send.
    /// Returns the bytes that went a→b and b→a.
    pub fn pump(&mut self) -> (Vec<u8>, Vec<u8>) {
        let mut ab = Vec::new();
        let mut ba = Vec::new();
        for _ in 0..10_000 {
            let x = self.a.drain_tx();
            let y = self.b.drain_tx();
            if x.is_empty() && y.is_empty() {
                return (ab, ba);
            }
            self.b.conn.handle_input(0, &x, &mut self.b.mem);
            self.a.conn.handle_input(0, &y, &mut self.a.mem);
            ab.extend_from_slice(&x);
            ba.extend_from_slice(&y);
        }
        panic!("pump did not settle");
    }

    /// Connects, accepts, and returns when both sides are established
    /// (sending the RTR if negotiated).
    pub fn establish(&mut self) {
        self.a.conn.connect(0, b"dat-pd-a").unwrap();
        self.pump();
        let evs = self.b.take_events();
        assert!(
            matches!(evs.as_slice(), [Event::ConnectRequest(_)]),
            "{evs:?}"
        );
        self.b.conn.accept(0, b"dat-pd-b", None, None).unwrap();
        self.pump();
        let ea = self.a.take_events();
        assert!(
            matches!(ea.as_slice(), [Event::Established { .. }]),
            "{ea:?}"
        );
        let eb = self.b.take_events();
        // With an RTR, b is established once the RTR arrived (in the pump).
        assert!(
            matches!(eb.as_slice(), [Event::Established { .. }]),
            "{eb:?}"
        );
    }
}
