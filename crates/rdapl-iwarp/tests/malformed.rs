//! Malformed and hostile input: each case gives the right Terminate and a
//! typed error, never a panic.

mod common;

use common::Pair;
use rdapl_iwarp::fpdu::{self, encode_fpdu};
use rdapl_iwarp::mpa::{self, FrameKind, MpaFrame};
use rdapl_iwarp::rdmap::{self, Opcode};
use rdapl_iwarp::terminate::{ddp, llp, rdmap as rc};
use rdapl_iwarp::{
    Buffer, Config, ConnError, DdpHeader, EnhancedParams, Event, MpaError, PostError,
    ProtocolError, ReadRequest, StagError, State, TermCode, Terminate,
};

fn cfg() -> Config {
    Config {
        ird: 2,
        ord: 2,
        ..Config::default()
    }
}

/// An established pair (CRC on) where a has spoken first, b has regions
/// 0x100 (remote write, 4096 at 0x1000), 0x200 (remote read, 256 at 0),
/// 0x300 (no rights) and one posted receive of 64 bytes.
fn pair() -> Pair {
    let mut p = Pair::new(cfg(), cfg());
    p.establish();
    p.b.mem.register(0x100, 0x1000, vec![0; 4096], true, false);
    p.b.mem.register(0x200, 0, vec![9; 256], false, true);
    p.b.mem.register(0x300, 0x3000, vec![0; 64], false, false);
    p.b.mem.recvs.insert(1, vec![0; 64]);
    p.b.conn.post_recv(1, 64).unwrap();
    p
}

/// Feeds `bytes` to b; returns b's events and the Terminate it sent.
fn inject(p: &mut Pair, bytes: &[u8]) -> (Vec<Event>, Option<Terminate>) {
    p.b.conn.handle_input(0, bytes, &mut p.b.mem);
    let out = p.b.drain_tx();
    let (frames, err) = fpdu::decode_all(&out, true);
    assert_eq!(err, None, "b's own output must decode");
    let term = frames
        .iter()
        .find(|f| f.header.opcode == Opcode::Terminate as u8)
        .map(|f| Terminate::decode(&f.payload).expect("our terminate decodes"));
    if let Some(t) = frames
        .iter()
        .find(|f| f.header.opcode == Opcode::Terminate as u8)
    {
        assert_eq!(
            t.header.buffer,
            Buffer::Untagged {
                rsvd_ulp: 0,
                qn: 2,
                msn: 1,
                mo: 0
            }
        );
        assert!(t.header.last);
    }
    (p.b.take_events(), term)
}

fn expect(p: &mut Pair, bytes: &[u8], err: ProtocolError, code: TermCode) -> Terminate {
    let (evs, term) = inject(p, bytes);
    assert!(
        evs.contains(&Event::Error(ConnError::Protocol(err.clone()))),
        "want {err:?} in {evs:?}"
    );
    assert_eq!(evs.last(), Some(&Event::Closed), "{evs:?}");
    assert!(
        evs.contains(&Event::Flushed { wr_id: 1 }) || !matches!(err, ProtocolError::Crc { .. })
    );
    let term = term.expect("a Terminate was sent");
    assert_eq!(term.code, code);
    assert!(p.b.conn.is_closed());
    // Nothing more is accepted.
    p.b.conn.handle_input(0, &[0u8; 64], &mut p.b.mem);
    assert!(p.b.drain_tx().is_empty());
    term
}

/// `a` connects and `b` has the request in hand: one `ConnectRequest`,
/// waiting for its consumer's accept.
fn requested(p: &mut Pair) {
    p.a.conn.connect(0, b"").unwrap();
    p.pump();
    assert!(matches!(
        p.b.take_events().as_slice(),
        [Event::ConnectRequest(_)]
    ));
    assert_eq!(p.b.conn.state(), State::AwaitAccept);
}

fn send_hdr(msn: u32, mo: u32, last: bool) -> DdpHeader {
    rdmap::untagged_header(Opcode::Send, last, 0, msn, mo)
}

fn fpdu(h: &DdpHeader, payload: &[u8]) -> Vec<u8> {
    encode_fpdu(h, &[], payload, true).unwrap()
}

#[test]
fn bad_crc() {
    let mut p = pair();
    let mut b = fpdu(&send_hdr(1, 0, true), b"abcd");
    let n = b.len();
    b[n - 1] ^= 0x55;
    let (evs, term) = inject(&mut p, &b);
    assert!(matches!(
        evs[0],
        Event::Error(ConnError::Protocol(ProtocolError::Crc { .. }))
    ));
    assert_eq!(term.unwrap().code, llp::code(llp::RECEIVED_CRC));
    // Data was placed, but no completion was reported for the bad FPDU.
    assert!(!evs.iter().any(|e| matches!(e, Event::RecvComplete { .. })));
}

#[test]
fn ulpdu_shorter_than_header() {
    let mut p = pair();
    let mut b = fpdu(&send_hdr(1, 0, true), b"");
    b[0] = 0;
    b[1] = 4;
    expect(
        &mut p,
        &b,
        ProtocolError::UlpduTooShort {
            ulpdu_len: 4,
            header_len: 18,
        },
        llp::code(llp::FPDU_START),
    );
}

#[test]
fn unknown_opcode_and_wrong_model() {
    let mut p = pair();
    let h = DdpHeader::new(
        8,
        true,
        Buffer::Untagged {
            rsvd_ulp: 0,
            qn: 0,
            msn: 1,
            mo: 0,
        },
    );
    expect(
        &mut p,
        &fpdu(&h, b""),
        ProtocolError::Opcode {
            opcode: 8,
            tagged: false,
        },
        rc::remote_op(rc::OPCODE),
    );
    let mut p = pair();
    let h = DdpHeader::new(
        0,
        true,
        Buffer::Untagged {
            rsvd_ulp: 0,
            qn: 0,
            msn: 1,
            mo: 0,
        },
    );
    expect(
        &mut p,
        &fpdu(&h, b""),
        ProtocolError::Opcode {
            opcode: 0,
            tagged: false,
        },
        rc::remote_op(rc::OPCODE),
    );
    let mut p = pair();
    let h = DdpHeader::new(
        3,
        true,
        Buffer::Tagged {
            stag: 0x100,
            to: 0x1000,
        },
    );
    expect(
        &mut p,
        &fpdu(&h, b""),
        ProtocolError::Opcode {
            opcode: 3,
            tagged: true,
        },
        rc::remote_op(rc::OPCODE),
    );
}

#[test]
fn wrong_versions() {
    let mut p = pair();
    let mut h = send_hdr(1, 0, true);
    h.ddp_version = 2;
    let t = expect(
        &mut p,
        &fpdu(&h, b"x"),
        ProtocolError::DdpVersion {
            tagged: false,
            version: 2,
        },
        ddp::untagged(ddp::UT_VERSION),
    );
    // The offending header is copied back (M and D set).
    assert!(t.m);
    let d = t.ddp.unwrap();
    assert_eq!(d.segment_length, 19);
    assert_eq!(d.header, h.to_vec());

    let mut p = pair();
    let mut h = rdmap::tagged_header(Opcode::Write, true, 0x100, 0x1000);
    h.ddp_version = 0;
    expect(
        &mut p,
        &fpdu(&h, b"x"),
        ProtocolError::DdpVersion {
            tagged: true,
            version: 0,
        },
        ddp::tagged(ddp::T_VERSION),
    );

    let mut p = pair();
    let mut h = send_hdr(1, 0, true);
    h.rdmap_version = 0;
    expect(
        &mut p,
        &fpdu(&h, b"x"),
        ProtocolError::RdmapVersion(0),
        rc::remote_op(rc::VERSION),
    );
}

#[test]
fn tagged_write_checks() {
    // Beyond the region's end.
    let mut p = pair();
    let h = rdmap::tagged_header(Opcode::Write, true, 0x100, 0x1000 + 4090);
    expect(
        &mut p,
        &fpdu(&h, &[1; 8]),
        ProtocolError::SinkBounds {
            stag: 0x100,
            to: 0x1000 + 4090,
            len: 8,
        },
        ddp::tagged(ddp::T_BASE_BOUNDS),
    );
    assert!(
        p.b.mem.regions[&0x100].data.iter().all(|&x| x == 0),
        "no byte placed"
    );
    // Below the base.
    let mut p = pair();
    let h = rdmap::tagged_header(Opcode::Write, true, 0x100, 0xfff);
    expect(
        &mut p,
        &fpdu(&h, &[1; 4]),
        ProtocolError::SinkBounds {
            stag: 0x100,
            to: 0xfff,
            len: 4,
        },
        ddp::tagged(ddp::T_BASE_BOUNDS),
    );
    // TO wrap.
    let mut p = pair();
    let h = rdmap::tagged_header(Opcode::Write, true, 0x100, u64::MAX - 1);
    expect(
        &mut p,
        &fpdu(&h, &[1; 4]),
        ProtocolError::SinkToWrap {
            to: u64::MAX - 1,
            len: 4,
        },
        ddp::tagged(ddp::T_TO_WRAP),
    );
    // Unknown STag.
    let mut p = pair();
    let h = rdmap::tagged_header(Opcode::Write, true, 0x999, 0);
    expect(
        &mut p,
        &fpdu(&h, &[1; 4]),
        ProtocolError::SinkStag {
            stag: 0x999,
            err: StagError::Invalid,
        },
        ddp::tagged(ddp::T_INVALID_STAG),
    );
    // No remote-write right.
    let mut p = pair();
    let h = rdmap::tagged_header(Opcode::Write, true, 0x300, 0x3000);
    expect(
        &mut p,
        &fpdu(&h, &[1; 4]),
        ProtocolError::SinkStag {
            stag: 0x300,
            err: StagError::Access,
        },
        rc::remote_prot(rc::ACCESS_RIGHTS),
    );
    assert!(p.b.mem.regions[&0x300].data.iter().all(|&x| x == 0));
    // A second segment with a gap in the TO.
    let mut p = pair();
    let mut b = fpdu(
        &rdmap::tagged_header(Opcode::Write, false, 0x100, 0x1000),
        &[1; 8],
    );
    b.extend(fpdu(
        &rdmap::tagged_header(Opcode::Write, true, 0x100, 0x1010),
        &[2; 8],
    ));
    expect(
        &mut p,
        &b,
        ProtocolError::SinkBounds {
            stag: 0x100,
            to: 0x1010,
            len: 8,
        },
        ddp::tagged(ddp::T_BASE_BOUNDS),
    );
    // A zero-length write with any STag is fine (RTR style).
    let mut p = pair();
    let (evs, term) = inject(
        &mut p,
        &fpdu(&rdmap::tagged_header(Opcode::Write, true, 0xdead, 7), b""),
    );
    assert!(evs.is_empty() && term.is_none(), "{evs:?}");
}

#[test]
fn untagged_checks() {
    let mut p = pair();
    expect(
        &mut p,
        &fpdu(&send_hdr(2, 0, true), b"x"),
        ProtocolError::MsnRange {
            qn: 0,
            expected: 1,
            got: 2,
        },
        ddp::untagged(ddp::UT_MSN_RANGE),
    );
    let mut p = pair();
    expect(
        &mut p,
        &fpdu(&send_hdr(1, 4, true), b"x"),
        ProtocolError::InvalidMo {
            qn: 0,
            expected: 0,
            got: 4,
        },
        ddp::untagged(ddp::UT_INVALID_MO),
    );
    let mut p = pair();
    let h = DdpHeader::new(
        3,
        true,
        Buffer::Untagged {
            rsvd_ulp: 0,
            qn: 5,
            msn: 1,
            mo: 0,
        },
    );
    expect(
        &mut p,
        &fpdu(&h, b"x"),
        ProtocolError::InvalidQn(5),
        ddp::untagged(ddp::UT_INVALID_QN),
    );
    let mut p = pair();
    expect(
        &mut p,
        &fpdu(&send_hdr(1, 0, true), &[0; 65]),
        ProtocolError::MessageTooLong {
            capacity: 64,
            end: 65,
        },
        ddp::untagged(ddp::UT_MSG_TOOLONG),
    );
    // Second message with no receive posted.
    let mut p = pair();
    let mut b = fpdu(&send_hdr(1, 0, true), b"one");
    b.extend(fpdu(&send_hdr(2, 0, true), b"two"));
    expect(
        &mut p,
        &b,
        ProtocolError::NoBuffer { msn: 2 },
        ddp::untagged(ddp::UT_MSN_NOBUF),
    );
    // Out-of-order segments of one message.
    let mut p = pair();
    let mut b = fpdu(&send_hdr(1, 0, false), b"abcd");
    b.extend(fpdu(&send_hdr(1, 8, true), b"efgh"));
    expect(
        &mut p,
        &b,
        ProtocolError::InvalidMo {
            qn: 0,
            expected: 4,
            got: 8,
        },
        ddp::untagged(ddp::UT_INVALID_MO),
    );
    // Send with Invalidate of an unknown STag.
    let mut p = pair();
    let h = rdmap::untagged_header(Opcode::SendInvalidate, true, 0x4242, 1, 0);
    expect(
        &mut p,
        &fpdu(&h, b"x"),
        ProtocolError::CannotInvalidate {
            stag: 0x4242,
            err: StagError::Invalid,
        },
        rc::remote_prot(rc::CANNOT_INVALIDATE),
    );
}

/// `needs_recv` is true exactly for the segments the engine refuses for
/// want of a receive (`NoBuffer`): a provider that holds those back until
/// a receive is posted feeds every malformed one at once. Over versions,
/// opcodes, queues, MSNs, offsets and the L bit, with no Send under way
/// and with one (its receive taken).
#[test]
fn needs_recv_is_exactly_the_want_of_a_receive() {
    let mut yes = 0;
    for under_way in [false, true] {
        for (ddp_version, rdmap_version) in [(1, 1), (0, 1), (2, 1), (1, 0), (1, 3)] {
            for opcode in 0..9 {
                for qn in [0, 1, 2, 5] {
                    for (msn, mo, last) in [(1, 0, true), (1, 0, false), (2, 0, true), (1, 4, true)]
                    {
                        let mut p = Pair::new(cfg(), cfg());
                        p.establish();
                        if under_way {
                            p.b.mem.recvs.insert(1, vec![0; 64]);
                            p.b.conn.post_recv(1, 64).unwrap();
                            let first = fpdu(&send_hdr(1, 0, false), b"abcd");
                            p.b.conn.handle_input(0, &first, &mut p.b.mem);
                        }
                        let mut h = DdpHeader::new(
                            opcode,
                            last,
                            Buffer::Untagged {
                                rsvd_ulp: 0,
                                qn,
                                msn,
                                mo,
                            },
                        );
                        (h.ddp_version, h.rdmap_version) = (ddp_version, rdmap_version);
                        let needs = p.b.conn.needs_recv(&h);
                        p.b.conn.handle_input(0, &fpdu(&h, b"wxyz"), &mut p.b.mem);
                        let evs = p.b.take_events();
                        let no_buffer = evs.iter().any(|e| {
                            matches!(
                                e,
                                Event::Error(ConnError::Protocol(ProtocolError::NoBuffer { .. }))
                            )
                        });
                        assert_eq!(needs, no_buffer, "{h:?}, under way {under_way}: {evs:?}");
                        yes += usize::from(needs);
                    }
                }
            }
        }
    }
    // The four Sends with version 1, queue 0, MSN 1 and offset 0, whole
    // or a first segment, none under way.
    assert_eq!(yes, 8);
    // A tagged segment takes no receive.
    let p = pair();
    let h = rdmap::tagged_header(Opcode::Write, true, 0x100, 0x1000);
    assert!(!p.b.conn.needs_recv(&h));
}

fn rreq(msn: u32, rr: &ReadRequest) -> Vec<u8> {
    let h = rdmap::untagged_header(Opcode::ReadRequest, true, 0, msn, 0);
    encode_fpdu(&h, &[], &rr.encode(), true).unwrap()
}

#[test]
fn read_request_checks() {
    let ok = ReadRequest {
        sink_stag: 5,
        sink_to: 0,
        size: 16,
        src_stag: 0x200,
        src_to: 0,
    };
    // More than IRD (2) outstanding: the third is refused.
    let mut p = pair();
    let mut b = rreq(1, &ok);
    b.extend(rreq(2, &ok));
    b.extend(rreq(3, &ok));
    p.b.conn
        .handle_input(0, &b[..b.len() / 3 * 2], &mut p.b.mem);
    let t = expect(
        &mut p,
        &b[b.len() / 3 * 2..],
        ProtocolError::TooManyReads { ird: 2 },
        rc::remote_op(rc::CATASTROPHIC_STREAM),
    );
    assert!(t.ddp.is_some());
    assert_eq!(
        t.rdmap,
        Some(ok.encode()),
        "the read request header is copied"
    );
    // Source outside its region.
    let mut p = pair();
    let bad = ReadRequest { src_to: 250, ..ok };
    expect(
        &mut p,
        &rreq(1, &bad),
        ProtocolError::SourceBounds {
            stag: 0x200,
            to: 250,
            len: 16,
        },
        rc::remote_prot(rc::BASE_BOUNDS),
    );
    let mut p = pair();
    let bad = ReadRequest {
        src_to: u64::MAX - 3,
        ..ok
    };
    expect(
        &mut p,
        &rreq(1, &bad),
        ProtocolError::SourceToWrap {
            to: u64::MAX - 3,
            len: 16,
        },
        rc::remote_prot(rc::TO_WRAP),
    );
    let mut p = pair();
    let bad = ReadRequest {
        src_stag: 0x100,
        ..ok
    };
    expect(
        &mut p,
        &rreq(1, &bad),
        ProtocolError::SourceStag {
            stag: 0x100,
            err: StagError::Access,
        },
        rc::remote_prot(rc::ACCESS_RIGHTS),
    );
    let mut p = pair();
    let bad = ReadRequest {
        src_stag: 0x777,
        ..ok
    };
    expect(
        &mut p,
        &rreq(1, &bad),
        ProtocolError::SourceStag {
            stag: 0x777,
            err: StagError::Invalid,
        },
        rc::remote_prot(rc::INVALID_STAG),
    );
    // Wrong MSN, and a body that is not 28 bytes.
    let mut p = pair();
    expect(
        &mut p,
        &rreq(2, &ok),
        ProtocolError::MsnRange {
            qn: 1,
            expected: 1,
            got: 2,
        },
        ddp::untagged(ddp::UT_MSN_RANGE),
    );
    let mut p = pair();
    let h = rdmap::untagged_header(Opcode::ReadRequest, true, 0, 1, 0);
    expect(
        &mut p,
        &fpdu(&h, &[0; 30]),
        ProtocolError::MalformedReadRequest(30),
        rc::remote_op(rc::CATASTROPHIC_STREAM),
    );
    // A read response nobody asked for.
    let mut p = pair();
    let h = rdmap::tagged_header(Opcode::ReadResponse, true, 5, 0);
    expect(
        &mut p,
        &fpdu(&h, &[0; 4]),
        ProtocolError::UnexpectedReadResponse,
        ddp::tagged(ddp::T_INVALID_STAG),
    );
}

#[test]
fn ord_is_enforced() {
    let mut p = pair();
    p.a.mem.register(0x50, 0, vec![0; 64], false, false);
    for i in 0..5u64 {
        let rr = ReadRequest {
            sink_stag: 0x50,
            sink_to: 0,
            size: 8,
            src_stag: 0x200,
            src_to: 8 * i,
        };
        p.a.conn.post_read(i, rr).unwrap();
    }
    let out = p.a.drain_tx();
    let (frames, _) = fpdu::decode_all(&out, true);
    assert_eq!(frames.len(), 2, "only ORD=2 read requests go out");
    assert_eq!(p.a.conn.outstanding_reads(), 2);
    // Deliver them and let the responses flow: the rest follow.
    p.b.conn.handle_input(0, &out, &mut p.b.mem);
    p.pump();
    let evs = p.a.take_events();
    let done = evs
        .iter()
        .filter(|e| matches!(e, Event::ReadComplete { .. }))
        .count();
    assert_eq!(done, 5, "{evs:?}");
    assert_eq!(p.a.conn.outstanding_reads(), 0);
}

#[test]
fn terminate_from_peer_closes() {
    let mut p = pair();
    let mut body = Vec::new();
    Terminate::new(ddp::tagged(ddp::T_BASE_BOUNDS)).encode(&mut body);
    let h = rdmap::untagged_header(Opcode::Terminate, true, 0, 1, 0);
    let (evs, term) = inject(&mut p, &fpdu(&h, &body));
    assert_eq!(
        evs[0],
        Event::TerminateReceived(Terminate::new(ddp::tagged(ddp::T_BASE_BOUNDS)))
    );
    assert_eq!(evs.last(), Some(&Event::Closed));
    assert!(term.is_none(), "no terminate in answer to a terminate");
    // A bogus terminate (MSN 2) also closes, silently.
    let mut p = pair();
    let h = rdmap::untagged_header(Opcode::Terminate, true, 0, 2, 0);
    let (evs, term) = inject(&mut p, &fpdu(&h, &body));
    assert!(evs.contains(&Event::Error(ConnError::Protocol(
        ProtocolError::BogusTerminate
    ))));
    assert!(term.is_none() && p.b.conn.is_closed());
}

#[test]
fn truncated_stream() {
    let mut p = pair();
    let b = fpdu(&send_hdr(1, 0, true), b"hello");
    p.b.conn.handle_input(0, &b[..b.len() - 3], &mut p.b.mem);
    assert!(p.b.take_events().is_empty());
    p.b.conn.handle_eof();
    let evs = p.b.take_events();
    assert_eq!(
        evs[0],
        Event::Error(ConnError::Protocol(ProtocolError::StreamLost))
    );
    assert_eq!(evs.last(), Some(&Event::Closed));
}

/// The stream ends during the MPA exchange (a client that gave up, a
/// server that went away): a setup error, not "inside an FPDU", and
/// nothing goes out.
#[test]
fn an_end_during_setup_is_the_peers_close() {
    let mut p = Pair::new(cfg(), cfg());
    requested(&mut p);
    assert_eq!(p.a.conn.state(), State::AwaitReply);
    for side in [&mut p.b, &mut p.a] {
        side.conn.handle_eof();
        assert_eq!(
            side.take_events(),
            [
                Event::Error(ConnError::Mpa(MpaError::PeerClosed)),
                Event::Closed
            ]
        );
        assert!(side.drain_tx().is_empty());
        assert_eq!(ConnError::Mpa(MpaError::PeerClosed).term_code(), None);
    }
}

fn request(flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
    let mut v = mpa::KEY_REQ.to_vec();
    v.push(flags);
    v.push(rev);
    v.extend_from_slice(&(pd.len() as u16).to_be_bytes());
    v.extend_from_slice(pd);
    v
}

fn responder() -> common::Side {
    common::Side::new(rdapl_iwarp::Role::Responder, cfg())
}

#[test]
fn mpa_request_refusals() {
    // Huge private-data length: refused from the header alone, no reply.
    let mut b = responder();
    let mut r = request(0x10, 2, &[]);
    r[18] = 0xff;
    r[19] = 0xff;
    b.conn.handle_input(0, &r, &mut b.mem);
    let evs = b.take_events();
    assert_eq!(
        evs[0],
        Event::Error(
            MpaError::PrivateDataTooLong {
                len: 0xffff,
                max: 256
            }
            .into()
        )
    );
    assert!(b.drain_tx().is_empty() && b.conn.is_closed());
    // 257 bytes: over siw's 256 cap.
    let mut b = responder();
    b.conn
        .handle_input(0, &request(0x10, 2, &[0; 257]), &mut b.mem);
    assert!(matches!(
        b.take_events()[0],
        Event::Error(ConnError::Mpa(MpaError::PrivateDataTooLong {
            len: 257,
            ..
        }))
    ));
    // Revision 3: no reply.
    let mut b = responder();
    b.conn.handle_input(0, &request(0, 3, &[]), &mut b.mem);
    assert_eq!(
        b.take_events()[0],
        Event::Error(MpaError::UnsupportedRevision(3).into())
    );
    assert!(b.drain_tx().is_empty());
    // Bad key: no reply.
    let mut b = responder();
    b.conn
        .handle_input(0, b"GET / HTTP/1.1\r\n\r\n", &mut b.mem);
    assert_eq!(b.take_events()[0], Event::Error(MpaError::BadKey.into()));
    assert!(b.drain_tx().is_empty());
    // Markers: a reject reply.
    let mut b = responder();
    let p = EnhancedParams {
        ird: 1,
        ord: 1,
        ..Default::default()
    }
    .encode();
    b.conn.handle_input(0, &request(0x90, 2, &p), &mut b.mem);
    assert_eq!(b.take_events()[0], Event::Error(MpaError::Markers.into()));
    let rep = b.drain_tx();
    let mpa::Decoded::Frame(f, _) = mpa::decode(&rep, 512).unwrap() else {
        panic!()
    };
    assert!(f.reject && !f.markers && f.kind == FrameKind::Reply);
    // Enhanced without the IRD/ORD block: reject.
    let mut b = responder();
    b.conn
        .handle_input(0, &request(0x10, 2, &[1, 2]), &mut b.mem);
    assert_eq!(
        b.take_events()[0],
        Event::Error(MpaError::MissingEnhancedParams(2).into())
    );
    assert!(!b.drain_tx().is_empty());
    // An FPDU queued behind the request: refused (siw's rule).
    let mut b = responder();
    let mut r = request(0x10, 2, &p);
    r.extend(fpdu(&send_hdr(1, 0, true), b"early"));
    b.conn.handle_input(0, &r, &mut b.mem);
    assert_eq!(
        b.take_events()[0],
        Event::Error(MpaError::TrailingBytes.into())
    );
    // A revision 1 request gets a revision 1 reply.
    let mut b = responder();
    b.conn.handle_input(0, &request(0x40, 1, b"v1"), &mut b.mem);
    let evs = b.take_events();
    assert!(
        matches!(&evs[0], Event::ConnectRequest(r) if r.revision == 1 && r.params.is_none() && r.private_data == b"v1")
    );
    b.conn.accept(0, b"ok", None, None).unwrap();
    let rep = b.drain_tx();
    let mpa::Decoded::Frame(f, _) = mpa::decode(&rep, 512).unwrap() else {
        panic!()
    };
    assert_eq!(
        (f.revision, f.enhanced, f.crc, f.private_data.as_slice()),
        (1, false, true, &b"ok"[..])
    );
}

fn initiator(c: Config) -> common::Side {
    let mut a = common::Side::new(rdapl_iwarp::Role::Initiator, c);
    a.conn.connect(0, b"hi").unwrap();
    a.drain_tx();
    a
}

fn reply(crc: bool, flags_extra: u8, params: EnhancedParams) -> Vec<u8> {
    let f = MpaFrame {
        kind: FrameKind::Reply,
        markers: flags_extra & 0x80 != 0,
        crc,
        reject: false,
        enhanced: true,
        reserved: 0,
        revision: 2,
        private_data: params.encode().to_vec(),
    };
    f.to_vec().unwrap()
}

#[test]
fn mpa_reply_refusals() {
    let good = EnhancedParams {
        ird: 2,
        ord: 2,
        ..Default::default()
    };
    // Markers in the reply.
    let mut a = initiator(cfg());
    a.conn.handle_input(0, &reply(true, 0x80, good), &mut a.mem);
    assert_eq!(a.take_events()[0], Event::Error(MpaError::Markers.into()));
    assert!(a.conn.is_closed());
    // A request key where a reply belongs.
    let mut a = initiator(cfg());
    a.conn
        .handle_input(0, &request(0x10, 2, &good.encode()), &mut a.mem);
    assert_eq!(
        a.take_events()[0],
        Event::Error(MpaError::UnexpectedKind.into())
    );
    // Peer ORD above what we can serve: Terminate LLP insufficient IRD.
    let mut a = initiator(cfg());
    a.conn.handle_input(
        0,
        &reply(false, 0, EnhancedParams { ord: 500, ..good }),
        &mut a.mem,
    );
    assert_eq!(
        a.take_events()[0],
        Event::Error(
            MpaError::InsufficientIrd {
                peer_ord: 500,
                max_ird: 128
            }
            .into()
        )
    );
    let out = a.drain_tx();
    let (frames, _) = fpdu::decode_all(&out, false);
    let t = Terminate::decode(&frames[0].payload).unwrap();
    assert_eq!(t.code, llp::code(llp::INSUFFICIENT_IRD));
    // We offered a Write RTR; the reply picks Read: no matching RTR.
    let offer_write = Config {
        peer_to_peer: true,
        rtr_offer: rdapl_iwarp::RtrOffer {
            write: true,
            read: false,
            send: false,
        },
        ..cfg()
    };
    let mut a = initiator(offer_write);
    let pick_read = EnhancedParams {
        peer_to_peer: true,
        read_rtr: true,
        ..good
    };
    a.conn
        .handle_input(0, &reply(true, 0, pick_read), &mut a.mem);
    assert_eq!(
        a.take_events()[0],
        Event::Error(MpaError::NoMatchingRtr.into())
    );
    let (frames, _) = fpdu::decode_all(&a.drain_tx(), true);
    assert_eq!(
        Terminate::decode(&frames[0].payload).unwrap().code,
        llp::code(llp::NO_MATCHING_RTR)
    );
    // A reply with CRC although we did not ask: CRC goes on (RFC 5044: either side).
    let mut a = initiator(Config {
        crc: false,
        ..cfg()
    });
    a.conn.handle_input(0, &reply(true, 0, good), &mut a.mem);
    assert!(a.conn.negotiated().unwrap().crc);
    // A revision 1 reply to our enhanced request: refused.
    let mut a = initiator(cfg());
    let mut r = reply(false, 0, good);
    r[16] = 0;
    r[17] = 1;
    a.conn.handle_input(0, &r, &mut a.mem);
    assert_eq!(
        a.take_events()[0],
        Event::Error(MpaError::RevisionMismatch { sent: 2, got: 1 }.into())
    );
}

#[test]
fn rtr_mismatch() {
    let ca = Config {
        peer_to_peer: true,
        ..cfg()
    };
    let mut p = Pair::new(ca, cfg());
    p.a.conn.connect(0, b"").unwrap();
    p.pump();
    p.b.take_events();
    p.b.conn.accept(0, b"", None, None).unwrap();
    p.b.drain_tx();
    assert_eq!(p.b.conn.state(), State::AwaitRtr);
    // A Send where the zero-length Write RTR belongs.
    let t = expect(
        &mut p,
        &fpdu(&send_hdr(1, 0, true), b""),
        ProtocolError::RtrMismatch,
        llp::code(llp::NO_MATCHING_RTR),
    );
    assert!(t.ddp.is_none());
}

#[test]
fn mpa_timers() {
    let mut b = responder();
    assert_eq!(b.conn.poll_timeout(), Some(5_000));
    b.conn.handle_timeout(4_999);
    assert!(b.take_events().is_empty());
    b.conn.handle_timeout(5_000);
    assert_eq!(
        b.take_events(),
        vec![Event::Error(MpaError::Timeout.into()), Event::Closed]
    );
    let mut a = common::Side::new(rdapl_iwarp::Role::Initiator, cfg());
    a.conn.connect(100, b"").unwrap();
    assert_eq!(a.conn.poll_timeout(), Some(10_100));
    a.conn.handle_timeout(10_100);
    assert_eq!(
        a.take_events(),
        vec![Event::Error(MpaError::Timeout.into()), Event::Closed]
    );
    // Without a Reply timer the initiator waits as long as its caller.
    let mut a = common::Side::new(
        rdapl_iwarp::Role::Initiator,
        Config {
            reply_timeout_ms: None,
            ..cfg()
        },
    );
    a.conn.connect(100, b"").unwrap();
    assert_eq!(a.conn.poll_timeout(), None);
    a.conn.handle_timeout(u64::MAX);
    assert!(a.take_events().is_empty());
    assert_eq!(a.conn.state(), State::AwaitReply);
    // Established connections have no timer.
    let p = pair();
    assert_eq!(p.a.conn.poll_timeout(), None);
    assert_eq!(p.b.conn.poll_timeout(), None);
}

#[test]
fn a_slow_accept_is_not_refused_behind_the_consumers_back() {
    // Peer-to-peer, so the responder waits for the RTR after its Reply.
    let p2p = Config {
        peer_to_peer: true,
        ..cfg()
    };
    let mut p = Pair::new(p2p.clone(), p2p);
    // The Request arrives in time; the consumer takes two minutes to decide.
    requested(&mut p);
    assert_eq!(p.b.conn.poll_timeout(), None);
    p.b.conn.handle_timeout(60_000);
    assert!(p.b.take_events().is_empty());
    assert_eq!(p.b.conn.state(), State::AwaitAccept);
    // It accepts: the RTR's 5 s run from the accept, not from the Request.
    p.b.conn.accept(120_000, b"", None, None).unwrap();
    assert_eq!(p.b.conn.state(), State::AwaitRtr);
    assert_eq!(p.b.conn.poll_timeout(), Some(125_000));
    p.pump();
    assert!(matches!(
        p.a.take_events().as_slice(),
        [Event::Established { .. }]
    ));
    assert!(matches!(
        p.b.take_events().as_slice(),
        [Event::Established { .. }]
    ));
}

#[test]
fn abort_sends_terminate() {
    let mut p = pair();
    p.a.conn.post_send(9, 0).unwrap();
    p.a.conn.abort();
    let (frames, _) = fpdu::decode_all(&p.a.drain_tx(), true);
    assert_eq!(frames.len(), 1);
    let t = Terminate::decode(&frames[0].payload).unwrap();
    assert_eq!(t.code, rc::local_catastrophic());
    let evs = p.a.take_events();
    assert!(evs.contains(&Event::Flushed { wr_id: 9 }));
    assert_eq!(evs.last(), Some(&Event::Closed));
}

/// Bad bytes followed at once by the end of the stream (the peer shut its
/// sending side): the Terminate still goes out, then the connection closes.
#[test]
fn terminate_survives_the_end_of_the_stream() {
    let mut p = pair();
    let mut b = fpdu(&send_hdr(1, 0, true), b"abcd");
    let n = b.len();
    b[n - 1] ^= 0xFF;
    p.b.conn.handle_input(0, &b, &mut p.b.mem);
    p.b.conn.handle_eof();
    assert!(!p.b.conn.is_closed(), "closes once its Terminate is out");
    let out = p.b.drain_tx();
    let (frames, err) = fpdu::decode_all(&out, true);
    assert_eq!(err, None);
    let t = frames
        .iter()
        .find(|f| f.header.opcode == Opcode::Terminate as u8)
        .expect("a Terminate was sent");
    assert_eq!(
        Terminate::decode(&t.payload).unwrap().code,
        llp::code(llp::RECEIVED_CRC)
    );
    assert!(p.b.conn.is_closed());
    let evs = p.b.take_events();
    assert_eq!(evs.last(), Some(&Event::Closed), "{evs:?}");
    // A second end changes nothing.
    p.b.conn.handle_eof();
    assert!(p.b.take_events().is_empty());
}

/// A Send with Invalidate whose STag cannot be invalidated: the receive it
/// took (its data placed) must still complete, with its outcome or as
/// flushed; it must not vanish.
#[test]
fn a_failed_remote_invalidate_does_not_lose_the_receive() {
    let mut p = pair();
    let h = rdmap::untagged_header(Opcode::SendInvalidate, true, 0x4242, 1, 0);
    let (evs, _) = inject(&mut p, &fpdu(&h, b"x"));
    assert!(
        evs.contains(&Event::Error(ConnError::Protocol(
            ProtocolError::CannotInvalidate {
                stag: 0x4242,
                err: StagError::Invalid
            }
        ))),
        "{evs:?}"
    );
    assert_eq!(evs.last(), Some(&Event::Closed), "{evs:?}");
    let n = evs
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::Flushed { wr_id: 1 } | Event::RecvComplete { wr_id: 1, .. }
            )
        })
        .count();
    assert_eq!(n, 1, "receive 1 completes exactly once: {evs:?}");
}

/// The peer invalidates (Send with Invalidate) the STag of the RDMA Write
/// it is in the middle of, then sends the Write's next segment: once the
/// consumer was told the STag is invalidated, no byte may land through it.
#[test]
fn no_write_segment_lands_through_an_stag_the_peer_invalidated() {
    let mut p = pair();
    let mut b = fpdu(
        &rdmap::tagged_header(Opcode::Write, false, 0x100, 0x1000),
        &[1; 8],
    );
    b.extend(fpdu(
        &rdmap::untagged_header(Opcode::SendInvalidate, true, 0x100, 1, 0),
        b"inv",
    ));
    b.extend(fpdu(
        &rdmap::tagged_header(Opcode::Write, true, 0x100, 0x1008),
        &[2; 8],
    ));
    let (evs, _) = inject(&mut p, &b);
    assert!(
        evs.contains(&Event::RecvComplete {
            wr_id: 1,
            len: 3,
            solicited: false,
            invalidated: Some(0x100),
        }),
        "{evs:?}"
    );
    assert!(!p.b.mem.regions[&0x100].valid);
    assert!(
        p.b.mem.regions[&0x100].data[8..16].iter().all(|&x| x == 0),
        "a segment was placed through an invalidated STag"
    );
    assert!(
        evs.contains(&Event::Error(ConnError::Protocol(
            ProtocolError::SinkStag {
                stag: 0x100,
                err: StagError::Invalid
            }
        ))),
        "{evs:?}"
    );
}

/// The initiator advertises IRD 0, so the responder's ORD is 0. An RDMA
/// Read posted there can never go out: it must be refused, not sit at the
/// head of the send queue holding every later request for ever.
#[test]
fn a_read_toward_a_peer_with_ird_0_does_not_hold_the_send_queue() {
    let ca = Config { ird: 0, ..cfg() };
    let mut p = Pair::new(ca, cfg());
    p.establish();
    assert_eq!(p.b.conn.negotiated().unwrap().ord, 0);
    // The initiator speaks first (RFC 5044 7.1.2): a zero-length Write.
    p.a.conn.post_write(99, 0, 1, 0).unwrap();
    p.pump();
    p.b.take_events();
    p.a.mem.recvs.insert(1, vec![0; 64]);
    p.a.conn.post_recv(1, 64).unwrap();
    p.b.mem.register(0x50, 0, vec![0; 64], false, false);
    let rr = ReadRequest {
        sink_stag: 0x50,
        sink_to: 0,
        size: 8,
        src_stag: 0x77,
        src_to: 0,
    };
    let read = p.b.conn.post_read(7, rr);
    p.b.mem.sends.insert(8, b"hi".to_vec());
    p.b.conn.post_send(8, 2).unwrap();
    p.pump();
    let evs = p.b.take_events();
    assert!(
        read.is_err()
            || evs
                .iter()
                .any(|e| matches!(e, Event::ReadComplete { wr_id: 7, .. })),
        "the read neither refused nor done: {read:?} {evs:?}"
    );
    assert!(
        evs.contains(&Event::SendComplete { wr_id: 8 }),
        "the Send behind the read never went out: {evs:?}"
    );
}

/// Sets `p` up: `a` connects, `pre` runs while `b` holds the request,
/// `b` accepts, `a` speaks first. Returns the events of `a` and of `b`.
fn established_after(p: &mut Pair, pre: impl FnOnce(&mut Pair)) -> (Vec<Event>, Vec<Event>) {
    p.a.conn.connect(0, b"").unwrap();
    p.pump();
    assert!(matches!(
        p.b.take_events().as_slice(),
        [Event::ConnectRequest(_)]
    ));
    pre(p);
    p.b.conn.accept(0, b"", None, None).unwrap();
    p.pump();
    // The initiator speaks first (RFC 5044 7.1.2): a zero-length Write.
    p.a.conn.post_write(99, 0, 1, 0).unwrap();
    p.pump();
    (p.a.take_events(), p.b.take_events())
}

fn read_of(sink_stag: u32) -> ReadRequest {
    ReadRequest {
        sink_stag,
        sink_to: 0,
        size: 8,
        src_stag: 0x77,
        src_to: 0,
    }
}

/// A read posted before the set-up was done, toward a peer that turns
/// out to take none (the responder's ORD 0: the initiator's IRD is 0; the
/// initiator's ORD 0: its own ORD is 0): it can never go out, so it must
/// be refused once the set-up says so, not hold the Send behind it for
/// ever.
#[test]
fn a_read_posted_before_the_setup_toward_a_peer_that_takes_none_is_refused() {
    // The responder posts while the consumer decides.
    let mut p = Pair::new(Config { ird: 0, ..cfg() }, cfg());
    let (_, evs) = established_after(&mut p, |p| {
        p.a.mem.recvs.insert(1, vec![0; 64]);
        p.a.conn.post_recv(1, 64).unwrap();
        p.b.mem.register(0x50, 0, vec![0; 64], false, false);
        p.b.conn.post_read(7, read_of(0x50)).unwrap();
        p.b.mem.sends.insert(8, b"hi".to_vec());
        p.b.conn.post_send(8, 2).unwrap();
    });
    assert_eq!(p.b.conn.negotiated().unwrap().ord, 0);
    assert!(
        evs.contains(&Event::SendComplete { wr_id: 8 }),
        "responder: the Send behind the read never went out: {evs:?}"
    );
    assert!(evs.contains(&refused(7)), "{evs:?}");
    assert_eq!(p.b.conn.state(), State::Established);

    // The initiator posts while it waits for the Reply.
    let mut p = Pair::new(Config { ord: 0, ..cfg() }, cfg());
    p.b.mem.recvs.insert(1, vec![0; 64]);
    let (evs, _) = established_after(&mut p, |p| {
        p.b.conn.post_recv(1, 64).unwrap();
        p.a.mem.register(0x50, 0, vec![0; 64], false, false);
        p.a.conn.post_read(7, read_of(0x50)).unwrap();
        p.a.mem.sends.insert(8, b"hi".to_vec());
        p.a.conn.post_send(8, 2).unwrap();
    });
    assert_eq!(p.a.conn.negotiated().unwrap().ord, 0);
    assert!(
        evs.contains(&Event::SendComplete { wr_id: 8 }),
        "initiator: the Send behind the read never went out: {evs:?}"
    );
    // Refused once the Reply is in, after the Established it settled.
    let est = evs
        .iter()
        .position(|e| matches!(e, Event::Established { .. }));
    let refusal = evs.iter().position(|e| *e == refused(7));
    assert!(
        matches!((est, refusal), (Some(e), Some(r)) if r > e),
        "{evs:?}"
    );
    assert_eq!(p.a.conn.state(), State::Established);
}

fn refused(wr_id: u64) -> Event {
    Event::Refused {
        wr_id,
        error: PostError::InvalidState,
    }
}
