//! A full conversation between two connections, in every MPA mode, and the
//! same byte streams replayed under any split.

mod common;

use common::convo;
use common::{Pair, Side};
use proptest::prelude::*;
use rdapl_iwarp::setup::RtrOffer;
use rdapl_iwarp::{Config, Event, Role, Rtr};

fn cfg(crc: bool, p2p: bool, offer: RtrOffer) -> Config {
    Config {
        crc,
        peer_to_peer: p2p,
        rtr_offer: offer,
        ..Config::default()
    }
}

fn modes() -> Vec<(Config, Config, Option<Rtr>, bool)> {
    let w = RtrOffer {
        write: true,
        read: false,
        send: false,
    };
    let r = RtrOffer {
        write: false,
        read: true,
        send: false,
    };
    let s = RtrOffer {
        write: false,
        read: false,
        send: true,
    };
    let nocrc = Config {
        crc: false,
        ..Config::default()
    };
    vec![
        (cfg(true, false, w), cfg(true, false, w), None, true),
        (nocrc.clone(), nocrc.clone(), None, false),
        (cfg(true, false, w), nocrc.clone(), None, true),
        (nocrc.clone(), cfg(true, false, w), None, true),
        (cfg(false, true, w), nocrc.clone(), Some(Rtr::Write), false),
        (cfg(true, true, r), nocrc.clone(), Some(Rtr::Read), true),
        (cfg(false, true, s), nocrc.clone(), Some(Rtr::Send), false),
        (
            cfg(true, true, RtrOffer::default()),
            nocrc.clone(),
            Some(Rtr::Write),
            true,
        ),
        (
            Config {
                revision: 1,
                ..Config::default()
            },
            Config::default(),
            None,
            true,
        ),
    ]
}

#[test]
fn conversation_in_every_mode() {
    for (ca, cb, rtr, crc) in modes() {
        let mut p = Pair::new(ca.clone(), cb.clone());
        p.establish();
        let na = *p.a.conn.negotiated().unwrap();
        let nb = *p.b.conn.negotiated().unwrap();
        assert_eq!(na.rtr, rtr, "{ca:?}");
        assert_eq!(nb.rtr, rtr);
        assert_eq!(na.crc, crc, "{ca:?} {cb:?}");
        assert_eq!(nb.crc, crc);
        convo::run(&mut p);
        let ea = p.a.take_events();
        let eb = p.b.take_events();
        convo::check_events(&ea, &eb);
        convo::check_memory(&p.a, &p.b);
        assert_eq!(p.a.conn.outstanding_reads(), 0);
    }
}

#[test]
fn ird_ord_are_exchanged() {
    let ca = Config {
        ird: 3,
        ord: 7,
        ..Config::default()
    };
    let cb = Config {
        ird: 5,
        ord: 2,
        ..Config::default()
    };
    let mut p = Pair::new(ca, cb);
    p.establish();
    let na = *p.a.conn.negotiated().unwrap();
    let nb = *p.b.conn.negotiated().unwrap();
    // b's IRD is raised to a's ORD (relaxed negotiation); each ORD is at
    // most the peer's IRD.
    assert_eq!((nb.ird, nb.ord), (7, 2));
    assert_eq!((na.ird, na.ord), (3, 7));
    assert_eq!(nb.peer_ird, Some(3));
    assert_eq!(na.peer_ird, Some(7));
}

#[test]
fn private_data_is_exchanged() {
    let mut p = Pair::new(Config::default(), Config::default());
    p.a.conn.connect(0, b"from-a").unwrap();
    p.pump();
    let evs = p.b.take_events();
    let [Event::ConnectRequest(req)] = evs.as_slice() else {
        panic!("{evs:?}")
    };
    assert_eq!(req.private_data, b"from-a");
    assert_eq!(req.revision, 2);
    p.b.conn.accept(0, b"from-b", None, None).unwrap();
    p.pump();
    let evs = p.a.take_events();
    let [Event::Established { private_data, .. }] = evs.as_slice() else {
        panic!("{evs:?}")
    };
    assert_eq!(private_data, b"from-b");
}

#[test]
fn reject_carries_private_data() {
    let mut p = Pair::new(Config::default(), Config::default());
    p.a.conn.connect(0, b"x").unwrap();
    p.pump();
    p.b.take_events();
    p.b.conn.reject(b"go away").unwrap();
    p.pump();
    let evs = p.a.take_events();
    assert_eq!(
        evs[0],
        Event::Rejected {
            private_data: b"go away".to_vec()
        }
    );
    assert!(p.a.conn.is_closed());
    assert!(p.b.conn.is_closed());
}

/// Records a conversation, returning the two MPA frames' lengths and the
/// a→b and b→a byte streams.
fn record(ca: Config, cb: Config) -> (Vec<u8>, Vec<u8>, usize, usize, Vec<Event>, Vec<Event>) {
    let mut p = Pair::new(ca, cb);
    p.a.conn.connect(0, b"dat-pd-a").unwrap();
    let (req, _) = p.pump();
    p.b.take_events();
    p.b.conn.accept(0, b"dat-pd-b", None, None).unwrap();
    let (rtr, rep) = p.pump();
    p.a.take_events();
    p.b.take_events();
    let (ab, ba) = convo::run(&mut p);
    let ea = p.a.take_events();
    let eb = p.b.take_events();
    convo::check_events(&ea, &eb);
    convo::check_memory(&p.a, &p.b);
    let mut a_stream = req.clone();
    a_stream.extend(rtr);
    a_stream.extend(ab);
    let mut b_stream = rep.clone();
    b_stream.extend(ba);
    (a_stream, b_stream, req.len(), rep.len(), ea, eb)
}

fn inbound(evs: &[Event]) -> Vec<Event> {
    evs.iter()
        .filter(|e| {
            matches!(
                e,
                Event::RecvComplete { .. } | Event::ReadComplete { .. } | Event::Error(_)
            )
        })
        .cloned()
        .collect()
}

fn feed_split(side: &mut Side, bytes: &[u8], cuts: &[u16]) {
    feed_split_direct(side, bytes, cuts, false);
}

/// Feeds `bytes` cut at `cuts`; with `direct`, each piece that starts
/// inside a placed payload goes first to its destination the way a provider
/// reading its socket straight into memory does (`rx_direct`, then
/// `Memory::place` by the caller and `handle_placed`), the rest through
/// `handle_input`.
fn feed_split_direct(side: &mut Side, bytes: &[u8], cuts: &[u16], direct: bool) {
    let mut cuts: Vec<usize> = cuts
        .iter()
        .map(|c| usize::from(*c) % (bytes.len() + 1))
        .collect();
    cuts.sort_unstable();
    let mut prev = 0;
    for end in cuts.into_iter().chain([bytes.len()]) {
        let mut piece = &bytes[prev..end];
        if direct && let Some((place, due)) = side.conn.rx_direct() {
            let n = piece.len().min(due as usize);
            // More than is due is refused, and nothing is taken.
            if n < piece.len() {
                assert!(!side.conn.handle_placed(0, &piece[..n + 1]));
            }
            rdapl_iwarp::Memory::place(&mut side.mem, &place, &piece[..n]);
            assert!(side.conn.handle_placed(0, &piece[..n]));
            piece = &piece[n..];
        }
        side.conn.handle_input(0, piece, &mut side.mem);
        prev = end;
        side.drain_tx();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn same_conversation_under_any_split(
        crc in any::<bool>(), p2p in any::<bool>(), direct in any::<bool>(),
        cut_req in proptest::collection::vec(any::<u16>(), 0..4),
        cut_a in proptest::collection::vec(any::<u16>(), 0..40),
        cut_rep in proptest::collection::vec(any::<u16>(), 0..4),
        cut_b in proptest::collection::vec(any::<u16>(), 0..40),
    ) {
        let ca = Config { crc, peer_to_peer: p2p, ..Config::default() };
        let cb = Config::default();
        let (a_stream, b_stream, req_len, rep_len, ea, eb) = record(ca.clone(), cb.clone());

        // Replay a→b into a fresh responder.
        let mut b2 = Side::new(Role::Responder, cb);
        let mut a_dummy = Side::new(Role::Initiator, ca.clone());
        convo::setup_memory(&mut a_dummy, &mut b2);
        feed_split(&mut b2, &a_stream[..req_len], &cut_req);
        b2.collect_events();
        prop_assert!(matches!(b2.events.as_slice(), [Event::ConnectRequest(_)]));
        b2.conn.accept(0, b"dat-pd-b", None, None).unwrap();
        b2.conn.post_recv(101, 16).unwrap();
        b2.conn.post_recv(102, 8000).unwrap();
        convo::post_b(&mut b2);
        // b's Read Request went out after a's first FPDU: cut there, since a
        // response cannot precede its request.
        let rest = &a_stream[req_len..];
        let ulpdu = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let first = 2 + ulpdu + rdapl_iwarp::fpdu::pad_len(ulpdu) + 4;
        feed_split_direct(&mut b2, &rest[..first], &cut_a, direct);
        feed_split_direct(&mut b2, &rest[first..], &cut_a, direct);
        b2.collect_events();
        prop_assert_eq!(inbound(&b2.events), inbound(&eb));

        // Replay b→a into a fresh initiator that posted the same work.
        let mut a2 = Side::new(Role::Initiator, ca);
        let mut b_dummy = Side::new(Role::Responder, Config::default());
        convo::setup_memory(&mut a2, &mut b_dummy);
        a2.conn.connect(0, b"dat-pd-a").unwrap();
        a2.drain_tx();
        feed_split(&mut a2, &b_stream[..rep_len], &cut_rep);
        a2.conn.post_recv(201, 4000).unwrap();
        a2.conn.post_recv(202, 64).unwrap();
        convo::post_a(&mut a2);
        a2.drain_tx();
        feed_split_direct(&mut a2, &b_stream[rep_len..], &cut_b, direct);
        a2.collect_events();
        prop_assert_eq!(inbound(&a2.events), inbound(&ea));
        // Same bytes placed.
        prop_assert_eq!(&a2.mem.regions[&0x300].data, &convo_a_region(&a_stream, 0x300, &ea));
        prop_assert_eq!(&b2.mem.regions[&0x100].data[100..3100], &convo::pattern(13, 3000)[..]);
        prop_assert_eq!(&a2.mem.recvs[&202][..7], &convo::pattern(23, 7)[..]);
    }
}

fn convo_a_region(_s: &[u8], _stag: u32, _e: &[Event]) -> Vec<u8> {
    let mut v = vec![0u8; 6000];
    v[..4000].copy_from_slice(&convo::pattern(2, 6000)[10..4010]);
    v
}

/// A memory that hands payload out in small pieces ([`Memory::source_with`]),
/// as a provider reading registered regions under their locks does.
struct InPieces<'a>(&'a rdapl_iwarp::VecMemory);

impl rdapl_iwarp::Memory for InPieces<'_> {
    fn lookup(
        &mut self,
        _stag: u32,
        _access: rdapl_iwarp::Access,
    ) -> Result<rdapl_iwarp::Region, rdapl_iwarp::StagError> {
        Err(rdapl_iwarp::StagError::Invalid)
    }
    fn source_with(&self, src: &rdapl_iwarp::Source, f: &mut dyn FnMut(&[u8])) -> bool {
        match rdapl_iwarp::Memory::source(self.0, src) {
            Some(b) => {
                b.chunks(7).for_each(f);
                true
            }
            None => false,
        }
    }
    fn place(&mut self, _dst: &rdapl_iwarp::Place, _data: &[u8]) {}
}

#[test]
fn payload_taken_in_pieces_keeps_the_crc_right() {
    for crc in [true, false] {
        let cfg = Config {
            crc,
            ..Config::default()
        };
        let mut p = Pair::new(cfg.clone(), cfg);
        p.establish();
        let msg = convo::pattern(77, 5000);
        p.b.mem.recvs.insert(9, vec![0; 5000]);
        p.b.conn.post_recv(9, 5000).unwrap();
        p.a.mem.sends.insert(1, msg.clone());
        p.a.conn.post_send(1, 5000).unwrap();
        let mut wire = Vec::new();
        while let Some(t) = p.a.conn.poll_transmit(&InPieces(&p.a.mem)) {
            assert!(t.write_to(&InPieces(&p.a.mem), &mut wire));
        }
        p.b.conn.handle_input(0, &wire, &mut p.b.mem);
        let evs = p.b.take_events();
        assert!(
            evs.contains(&Event::RecvComplete {
                wr_id: 9,
                len: 5000,
                invalidated: None,
                solicited: false,
            }),
            "{evs:?}"
        );
        assert_eq!(&p.b.mem.recvs[&9][..], &msg[..]);
    }
}

/// In every mode the responder sends nothing before the initiator's
/// first FPDU (RFC 5044 §7.1.2), and says so (`awaits_first_fpdu`)
/// while it holds what it has: never with an RTR (it is that FPDU, and
/// the responder is established only after it), until that FPDU without.
#[test]
fn the_responder_awaits_the_initiators_first_fpdu_in_every_mode() {
    for (ca, cb, rtr, _) in modes() {
        let mut p = Pair::new(ca.clone(), cb);
        p.establish();
        assert!(!p.a.conn.awaits_first_fpdu(), "{ca:?}");
        assert_eq!(p.b.conn.awaits_first_fpdu(), rtr.is_none(), "{ca:?}");
        p.b.mem.sends.insert(5, b"held".to_vec());
        p.b.conn.post_send(5, 4).unwrap();
        p.a.mem.recvs.insert(6, vec![0; 8]);
        p.a.conn.post_recv(6, 8).unwrap();
        let out = p.b.drain_tx();
        assert_eq!(!out.is_empty(), rtr.is_some(), "{ca:?}");
        p.a.conn.handle_input(0, &out, &mut p.a.mem);
        p.a.conn.post_write(7, 0, 1, 0).unwrap();
        p.pump();
        assert!(!p.b.conn.awaits_first_fpdu(), "{ca:?}");
        let ea = p.a.take_events();
        assert!(
            ea.iter().any(|e| matches!(
                e,
                Event::RecvComplete {
                    wr_id: 6,
                    len: 4,
                    ..
                }
            )),
            "{ca:?}: {ea:?}"
        );
    }
}
