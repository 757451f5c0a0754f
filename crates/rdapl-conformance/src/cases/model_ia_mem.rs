//! Model tests of the IA, protection zones and registered memory (LMR, RMR,
//! fast registration) on the loopback provider, through the public API only.
//!
//! Every test opens its IAs at its own address (`127.0.21.<m>`) and uses its
//! own connection qualifiers, so the tests run in parallel. Every wait has a
//! timeout. A remote access error breaks the connection (RC semantics), so
//! the window tests reconnect (`Pair::reconnect`) between failing accesses.

use crate::case;
use crate::support as common;

use common::{
    D, Inject, Node, Pair, T, conn_kind, empty, handle_err, ia_options, ip, next_dto, open, pair,
    rt, state_err, within,
};
use rdapl::error::Subtype;
use rdapl::*;
use std::time::Duration;

/// RDMA and window helpers of a [`common::pair`] for this module's cases.
impl Pair {
    /// Client RDMA write of `len` bytes of `src` to `remote`; its completion.
    fn write(&self, src: &Lmr, len: u64, remote: RmrTriplet, cookie: u64) -> DtoCompletion {
        self.c
            .ep
            .post_rdma_write(&[src.triplet(0, len).unwrap()], remote, cookie, D)
            .unwrap();
        let d = next_dto(&self.c.req);
        assert_eq!((d.cookie, d.operation), (cookie, DtoOp::RdmaWrite));
        d
    }

    /// Client RDMA read of `len` bytes of `remote` into `dst`; its completion.
    fn read(&self, dst: &Lmr, len: u64, remote: RmrTriplet, cookie: u64) -> DtoCompletion {
        self.c
            .ep
            .post_rdma_read(&[dst.triplet(0, len).unwrap()], remote, cookie, D)
            .unwrap();
        let d = next_dto(&self.c.req);
        assert_eq!((d.cookie, d.operation), (cookie, DtoOp::RdmaRead));
        d
    }

    /// Server binds `rmr` to `len` bytes at `off` of `lmr`; waits for the
    /// `BindMw` completion and returns the window's context.
    fn bind(&self, rmr: &Rmr, lmr: &Lmr, off: u64, len: u64, privs: MemPriv, cookie: u64) -> u32 {
        let k = self
            .s
            .ep
            .post_rmr_bind(rmr, lmr, lmr.triplet(off, len).unwrap(), privs, cookie, D)
            .unwrap();
        let d = next_dto(&self.s.req);
        assert_eq!(
            (d.cookie, d.status, d.operation),
            (cookie, DtoStatus::Success, DtoOp::BindMw)
        );
        assert_eq!(rmr.context().unwrap(), k);
        k
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed))
        .collect()
}

// ----- IA ------------------------------------------------------------------

#[case]
fn open_by_name_and_query() {
    for name in ["", "loopback"] {
        let ia = Ia::open(name).unwrap();
        let (attr, prov) = ia.query().unwrap();
        assert_eq!(prov.name, "loopback");
        assert_eq!(prov.dapl_version, (2, 0));
        assert!(prov.fmr_supported);
        assert!(prov.thread_safe);
        assert_eq!(attr.adapter_name, "loopback0");
        assert_eq!(attr.address, ip("127.0.0.1"));
        assert_eq!(ia.address(), attr.address);
        assert!(attr.max_iov_segments_per_dto >= 1);
        assert_eq!(attr.max_private_data_size, prov.max_private_data_size);
        assert!(ia.async_evd().flags().contains(EvdFlags::ASYNC));
        ia.close(CloseFlags::Graceful).unwrap();
    }
    let ia = open("127.0.21.1");
    assert_eq!(ia.address(), ip("127.0.21.1"));
    assert_eq!(ia.query().unwrap().0.address, ip("127.0.21.1"));
    let other = open("127.0.21.1");
    assert_ne!(ia.handle(), other.handle(), "every open gives a new IA");
    ia.close(CloseFlags::Graceful).unwrap();
    other.close(CloseFlags::Graceful).unwrap();
}

#[case]
fn unknown_provider_is_not_found() {
    let e = Ia::open("ibverbs").unwrap_err();
    assert!(
        matches!(&e, Error::ProviderNotFound(n) if n == "ibverbs"),
        "{e:?}"
    );
    assert_eq!(
        e.dat_return().ty(),
        Some(rdapl::error::DatType::ProviderNotFound)
    );
    assert!(matches!(
        Ia::open_with("Loopback", IaOptions::default()),
        Err(Error::ProviderNotFound(_))
    ));
}

#[case]
fn bad_open_and_create_parameters() {
    for params in ["addr=not-an-ip", "bogus=1", "addr"] {
        let r = Ia::open_with(
            "loopback",
            IaOptions {
                params: params.into(),
                ..Default::default()
            },
        );
        assert!(
            matches!(r, Err(Error::InvalidParameter { arg: 1, .. })),
            "{params}: {r:?}"
        );
    }
    let r = Ia::open_with(
        "loopback",
        IaOptions {
            async_qlen: 0,
            ..ia_options("127.0.21.2")
        },
    );
    assert!(
        matches!(r, Err(Error::InvalidParameter { arg: 2, .. })),
        "{r:?}"
    );
    let not_async = Evd::create(8, EvdFlags::DTO).unwrap();
    let r = Ia::open_with(
        "loopback",
        IaOptions {
            async_evd: Some(not_async),
            ..ia_options("127.0.21.2")
        },
    );
    assert!(
        matches!(r, Err(Error::InvalidParameter { arg: 3, .. })),
        "{r:?}"
    );

    // A consumer-made async EVD is used as is.
    let mine = Evd::create(8, EvdFlags::ASYNC).unwrap();
    let ia = Ia::open_with(
        "loopback",
        IaOptions {
            async_evd: Some(mine.clone()),
            ..ia_options("127.0.21.2")
        },
    )
    .unwrap();
    assert_eq!(ia.async_evd().handle(), mine.handle());

    let (attr, _) = ia.query().unwrap();
    assert!(matches!(
        ia.evd_create(attr.max_evd_qlen + 1, EvdFlags::DTO),
        Err(Error::InsufficientResources {
            resource: Subtype::ResourceTevd,
            ..
        })
    ));
    assert!(matches!(
        ia.evd_create(0, EvdFlags::DTO),
        Err(Error::InvalidParameter { .. })
    ));

    let pz = ia.pz_create().unwrap();
    let dto_evd = ia.evd_create(8, EvdFlags::DTO).unwrap();
    let conn_evd = ia.evd_create(8, EvdFlags::CONNECTION).unwrap();
    // Endpoint attributes beyond the IA's limits.
    let too_big = EpAttr {
        max_request_iov: attr.max_iov_segments_per_dto + 1,
        ..Default::default()
    };
    assert!(matches!(
        ia.ep_create(&pz, None, None, None, Some(too_big)),
        Err(Error::InvalidParameter { arg: 6, .. })
    ));
    let too_deep = EpAttr {
        max_recv_dtos: attr.max_dto_per_ep + 1,
        ..Default::default()
    };
    assert!(ia.ep_create(&pz, None, None, None, Some(too_deep)).is_err());
    // EVDs without the stream they are used for.
    assert!(matches!(
        ia.ep_create(&pz, Some(&conn_evd), None, None, None),
        Err(Error::InvalidHandle(Subtype::InvalidHandleEvdRecv))
    ));
    assert!(matches!(
        ia.ep_create(&pz, None, Some(&conn_evd), None, None),
        Err(Error::InvalidHandle(Subtype::InvalidHandleEvdRequest))
    ));
    assert!(matches!(
        ia.ep_create(&pz, None, None, Some(&dto_evd), None),
        Err(Error::InvalidHandle(Subtype::InvalidHandleEvdConn))
    ));
    assert!(matches!(
        ia.psp_create(1, &dto_evd),
        Err(Error::InvalidHandle(Subtype::InvalidHandleEvdCr))
    ));
    // A PZ of another IA.
    let other = open("127.0.21.3");
    let other_pz = other.pz_create().unwrap();
    assert!(matches!(
        ia.ep_create(&other_pz, None, None, None, None),
        Err(Error::InvalidHandle(Subtype::InvalidHandlePz))
    ));
    // Private data larger than the provider allows.
    let ep = ia
        .ep_create(&pz, None, None, Some(&conn_evd), None)
        .unwrap();
    let big = vec![0u8; attr.max_private_data_size + 1];
    assert!(matches!(
        ep.connect(ip("127.0.21.3"), 1, Some(T), &big),
        Err(Error::InvalidParameter { .. })
    ));
    assert_eq!(ep.state(), EpState::Unconnected);
    ia.close(CloseFlags::Abrupt).unwrap();
    other.close(CloseFlags::Abrupt).unwrap();
}

#[case]
fn failed_open_leaves_no_reachable_address() {
    let r = Ia::open_with(
        "loopback",
        IaOptions {
            async_qlen: 0,
            ..ia_options("127.0.21.4")
        },
    );
    assert!(r.is_err());
    let c = Node::new("127.0.21.5");
    c.ep.connect(ip("127.0.21.4"), 1, Some(T), b"").unwrap();
    let k = conn_kind(&c.conn);
    assert!(
        common::no_ia_kind(k),
        "no IA was opened at 127.0.21.4: {k:?}"
    );
}

#[case]
fn graceful_close_refused_while_objects_live() {
    let n = Node::new("127.0.21.6");
    let in_use = |r: Result<()>| state_err(r, Subtype::InvalidStateIaInUse);
    in_use(n.ia.close(CloseFlags::Graceful));
    n.ep.free().unwrap();
    let psp = n.ia.psp_create(600, &n.cr).unwrap();
    in_use(n.ia.close(CloseFlags::Graceful));
    psp.free().unwrap();
    // An RSP holds the IA too.
    let ep2 =
        n.ia.ep_create(&n.pz, None, None, Some(&n.conn), None)
            .unwrap();
    let rsp = n.ia.rsp_create(601, &ep2, &n.cr).unwrap();
    in_use(n.ia.close(CloseFlags::Graceful));
    rsp.free().unwrap();
    in_use(n.ia.close(CloseFlags::Graceful));
    ep2.free().unwrap();
    // Protection zones and memory regions hold it too.
    let lmr = n.buf(8);
    let rmr = n.pz.rmr_create().unwrap();
    in_use(n.ia.close(CloseFlags::Graceful));
    lmr.free().unwrap();
    in_use(n.ia.close(CloseFlags::Graceful));
    rmr.free().unwrap();
    in_use(n.ia.close(CloseFlags::Graceful));
    n.pz.free().unwrap();
    // EVDs do not.
    n.ia.close(CloseFlags::Graceful).unwrap();

    // Every IA operation after close names an invalid IA handle.
    let bad = |r: Result<()>| handle_err(r, Subtype::InvalidHandleIa);
    bad(n.ia.query().map(drop));
    bad(n.ia.pz_create().map(drop));
    bad(n.ia.evd_create(4, EvdFlags::DTO).map(drop));
    bad(n.ia.ep_create(&n.pz, None, None, None, None).map(drop));
    bad(n.ia.psp_create(602, &n.cr).map(drop));
    bad(n.ia.close(CloseFlags::Graceful));
    bad(n.ia.close(CloseFlags::Abrupt));
}

#[case]
fn abrupt_close_tears_down() {
    let p = pair("127.0.21.7", "127.0.21.8", 700);
    let buf = p.c.buf(16);
    p.c.recv(&buf, 0, 16, 1);
    p.s.ia.close(CloseFlags::Abrupt).unwrap();

    // The peer sees Disconnected and its outstanding receive is flushed.
    assert_eq!(conn_kind(&p.c.conn), ConnectionEventKind::Disconnected);
    let d = next_dto(&p.c.rcv);
    assert_eq!((d.cookie, d.status), (1, DtoStatus::Flushed));
    assert_eq!(p.c.ep.state(), EpState::Disconnected);
    // The closed side's endpoint saw the end of its connection too.
    assert_eq!(conn_kind(&p.s.conn), ConnectionEventKind::Disconnected);

    // Its endpoint and service point are gone.
    assert!(matches!(
        p.s.ep.post_recv(&[], 2, D),
        Err(Error::InvalidHandle(Subtype::InvalidHandleEp))
    ));
    assert!(matches!(
        p.s.ep.free(),
        Err(Error::InvalidHandle(Subtype::InvalidHandleEp))
    ));
    assert!(matches!(
        p.psp.free(),
        Err(Error::InvalidHandle(Subtype::InvalidHandlePsp))
    ));
    assert!(matches!(
        p.s.ia.query(),
        Err(Error::InvalidHandle(Subtype::InvalidHandleIa))
    ));
    // Its address is no longer reachable.
    p.c.ep.reset().unwrap();
    p.c.ep.connect(p.s.ia.address(), 700, Some(T), b"").unwrap();
    let k = conn_kind(&p.c.conn);
    assert!(common::no_ia_kind(k), "{k:?}");
    empty(&p.c.conn);
}

#[case]
fn objects_of_an_abruptly_closed_ia_are_invalid() {
    let ia = open("127.0.21.9");
    let pz = ia.pz_create().unwrap();
    ia.close(CloseFlags::Abrupt).unwrap();
    let r = pz.lmr_create(Region::zeroed(8), MemPriv::ALL);
    assert!(matches!(r, Err(Error::InvalidHandle(_))), "{r:?}");
    assert!(pz.rmr_create().is_err());
}

// ----- PZ ------------------------------------------------------------------

#[case]
fn pz_free_refused_while_used() {
    let ia = open("127.0.21.10");
    let pz = ia.pz_create().unwrap();
    let pz_in_use = |r: Result<()>| state_err(r, Subtype::InvalidStatePzInUse);
    let lmr = pz.lmr_create(Region::zeroed(8), MemPriv::ALL).unwrap();
    pz_in_use(pz.free());
    lmr.free().unwrap();
    let rmr = pz.rmr_create().unwrap();
    pz_in_use(pz.free());
    rmr.free().unwrap();
    let fmr = pz.lmr_create_fmr(64).unwrap();
    pz_in_use(pz.free());
    fmr.free().unwrap();
    let ep = ia.ep_create(&pz, None, None, None, None).unwrap();
    pz_in_use(pz.free());
    ep.free().unwrap();
    pz.free().unwrap();

    let dead = |r: Result<()>| handle_err(r, Subtype::InvalidHandlePz);
    dead(pz.free());
    dead(pz.lmr_create(Region::zeroed(8), MemPriv::ALL).map(drop));
    dead(pz.rmr_create().map(drop));
    dead(pz.lmr_create_fmr(8).map(drop));
    dead(ia.ep_create(&pz, None, None, None, None).map(drop));
    ia.close(CloseFlags::Graceful).unwrap();
}

// ----- LMR -----------------------------------------------------------------

#[case]
fn lmr_create_free_keys_and_rights() {
    let ia = open("127.0.21.11");
    let pz = ia.pz_create().unwrap();
    let region = Region::from_vec(pattern(32, 1));
    let privs = MemPriv::LOCAL_READ | MemPriv::REMOTE_READ;
    let lmr = pz.lmr_create(region.clone(), privs).unwrap();
    let k = lmr.context().unwrap();
    assert_eq!(lmr.rmr_context().unwrap(), k);
    assert_eq!(lmr.privileges(), privs);
    assert!(!lmr.privileges().contains(MemPriv::REMOTE_WRITE));
    assert_eq!(lmr.address().unwrap(), region.address());
    assert_eq!(
        lmr.triplet(4, 8).unwrap(),
        LmrTriplet {
            lmr_context: k,
            virtual_address: region.address() + 4,
            segment_length: 8
        }
    );
    assert_eq!(
        lmr.rmr_triplet(4, 8).unwrap(),
        rt(k, region.address() + 4, 8)
    );
    assert_eq!(lmr.to_vec().unwrap(), pattern(32, 1));
    lmr.write_at(30, b"xy").unwrap();
    let mut two = [0u8; 2];
    lmr.read_at(30, &mut two).unwrap();
    assert_eq!(&two, b"xy");
    assert!(matches!(
        lmr.write_at(31, b"xy"),
        Err(Error::InvalidParameter { .. })
    ));
    assert!(lmr.read_at(usize::MAX, &mut two).is_err());

    // Rights are DAT bits; unknown bits are refused.
    assert_eq!(MemPriv::from_bits(0x33), Some(MemPriv::ALL));
    assert_eq!(MemPriv::from_bits(0x40), None);
    assert!(MemPriv::ALL.any_remote() && !MemPriv::LOCAL_READ.any_remote());

    // Different registrations have different keys, even of one region.
    let again = pz.lmr_create(region.clone(), MemPriv::ALL).unwrap();
    assert_ne!(again.context().unwrap(), k);

    // A freed LMR's handle is dead, and its key never comes back.
    lmr.free().unwrap();
    let dead = |r: Result<()>| handle_err(r, Subtype::InvalidHandleLmr);
    dead(lmr.context().map(drop));
    dead(lmr.free());
    dead(lmr.triplet(0, 1).map(drop));
    dead(lmr.to_vec().map(drop));
    for _ in 0..20 {
        let l = pz.lmr_create(Region::zeroed(4), MemPriv::ALL).unwrap();
        assert_ne!(l.context().unwrap(), k, "a dead key was handed out again");
        l.free().unwrap();
    }
    again.free().unwrap();
    pz.free().unwrap();
    ia.close(CloseFlags::Graceful).unwrap();
}

#[case]
fn lmr_free_refused_while_rmr_bound() {
    let p = pair("127.0.21.12", "127.0.21.13", 1200);
    let lmr = p.s.buf(64);
    let rmr = p.s.pz.rmr_create().unwrap();
    let unbound = rmr.context().unwrap();
    let k = p.bind(&rmr, &lmr, 0, 32, MemPriv::REMOTE_WRITE, 5);
    assert_ne!(k, unbound, "a bind gives the window a new key");
    empty(&p.s.req);
    assert!(matches!(
        lmr.free(),
        Err(Error::InvalidState {
            state: Subtype::InvalidStateLmrInUse,
            ..
        })
    ));
    // Still registered and usable.
    assert_eq!(lmr.context().unwrap(), lmr.rmr_context().unwrap());
    rmr.free().unwrap();
    assert!(matches!(
        rmr.free(),
        Err(Error::InvalidHandle(Subtype::InvalidHandleRmr))
    ));
    assert!(rmr.context().is_err());
    lmr.free().unwrap();
}

// ----- RMR (memory windows) ------------------------------------------------

#[case]
fn rmr_bind_argument_checks() {
    let p = pair("127.0.21.14", "127.0.21.15", 1400);
    let lmr =
        p.s.pz
            .lmr_create(
                Region::zeroed(64),
                MemPriv::LOCAL_READ | MemPriv::LOCAL_WRITE | MemPriv::REMOTE_READ,
            )
            .unwrap();
    let rmr = p.s.pz.rmr_create().unwrap();
    let ep = &p.s.ep;
    let t = lmr.triplet(0, 16).unwrap();
    // A window grants remote rights only.
    assert!(matches!(
        ep.post_rmr_bind(&rmr, &lmr, t, MemPriv::LOCAL_READ, 1, D),
        Err(Error::InvalidParameter { .. })
    ));
    // Only rights the LMR has.
    assert!(matches!(
        ep.post_rmr_bind(&rmr, &lmr, t, MemPriv::REMOTE_WRITE, 1, D),
        Err(Error::PrivilegesViolation(_))
    ));
    // Only inside the LMR.
    let outside = LmrTriplet {
        virtual_address: lmr.address().unwrap() + 60,
        segment_length: 8,
        ..t
    };
    assert!(matches!(
        ep.post_rmr_bind(&rmr, &lmr, outside, MemPriv::REMOTE_READ, 1, D),
        Err(Error::InvalidParameter { .. })
    ));
    // The triplet must name the LMR.
    let other_key = LmrTriplet {
        lmr_context: t.lmr_context ^ 0x100,
        ..t
    };
    assert!(matches!(
        ep.post_rmr_bind(&rmr, &lmr, other_key, MemPriv::REMOTE_READ, 1, D),
        Err(Error::InvalidParameter { .. })
    ));
    // Window and LMR must be in the endpoint's PZ.
    let pz2 = p.s.ia.pz_create().unwrap();
    let lmr2 = pz2.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    let rmr2 = pz2.rmr_create().unwrap();
    assert!(matches!(
        ep.post_rmr_bind(
            &rmr,
            &lmr2,
            lmr2.triplet(0, 8).unwrap(),
            MemPriv::REMOTE_READ,
            1,
            D
        ),
        Err(Error::ProtectionViolation(_))
    ));
    assert!(matches!(
        ep.post_rmr_bind(&rmr2, &lmr, t, MemPriv::REMOTE_READ, 1, D),
        Err(Error::ProtectionViolation(_))
    ));
    // Nothing was posted.
    empty(&p.s.req);
    // A freed window cannot be bound.
    rmr2.free().unwrap();
    assert!(matches!(
        p.s.ep.post_rmr_bind(
            &rmr2,
            &lmr2,
            lmr2.triplet(0, 8).unwrap(),
            MemPriv::REMOTE_READ,
            1,
            D
        ),
        Err(Error::InvalidHandle(Subtype::InvalidHandleRmr))
    ));
    // The valid bind still works.
    p.bind(&rmr, &lmr, 0, 16, MemPriv::REMOTE_READ, 2);
}

#[case]
fn refused_bind_keeps_the_window_context() {
    let n = Node::new("127.0.21.16");
    let lmr = n.buf(64);
    let rmr = n.pz.rmr_create().unwrap();
    let before = rmr.context().unwrap();
    // The endpoint is not connected: the bind is refused.
    let r = n.ep.post_rmr_bind(
        &rmr,
        &lmr,
        lmr.triplet(0, 8).unwrap(),
        MemPriv::REMOTE_READ,
        1,
        D,
    );
    assert!(matches!(r, Err(Error::InvalidState { .. })), "{r:?}");
    assert_eq!(
        rmr.context().unwrap(),
        before,
        "a refused call changed state"
    );

    // A refused re-bind of a bound window leaves the window bound and working.
    within(Duration::from_secs(10), "the scenario (deadlock?)", || {
        let p = pair("127.0.21.37", "127.0.21.38", 3700);
        let tgt = target(&p);
        let rmr = p.s.pz.rmr_create().unwrap();
        let k = p.bind(&rmr, &tgt, 0, 64, MemPriv::REMOTE_WRITE, 1);
        p.s.ep.inject_break();
        p.expect_end(ConnectionEventKind::Broken);
        let r = p.s.ep.post_rmr_bind(
            &rmr,
            &tgt,
            tgt.triplet(64, 64).unwrap(),
            MemPriv::REMOTE_WRITE,
            2,
            D,
        );
        assert!(matches!(r, Err(Error::InvalidState { .. })), "{r:?}");
        assert_eq!(rmr.context().unwrap(), k);
        p.reconnect();
        let src = p.c.lmr(vec![4; 8]);
        let base = tgt.address().unwrap();
        assert_eq!(
            p.write(&src, 8, rt(k, base, 8), 3).status,
            DtoStatus::Success,
            "the window no longer works after a refused re-bind"
        );
    });
}

/// Server target: 256 patterned bytes registered with every right.
fn target(p: &Pair) -> Lmr {
    p.s.pz
        .lmr_create(Region::from_vec(pattern(256, 3)), MemPriv::ALL)
        .unwrap()
}

/// A window over `len` bytes at `off` of a new [`target`], bound by the
/// server with `privs`: the target, its address, the window, its context.
fn target_window(
    p: &Pair,
    off: u64,
    len: u64,
    privs: MemPriv,
    cookie: u64,
) -> (Lmr, u64, Rmr, u32) {
    let tgt = target(p);
    let base = tgt.address().unwrap();
    let rmr = p.s.pz.rmr_create().unwrap();
    let k = p.bind(&rmr, &tgt, off, len, privs, cookie);
    (tgt, base, rmr, k)
}

#[case]
fn window_access_within_range_and_rights() {
    let p = pair("127.0.21.17", "127.0.21.18", 1700);
    let (tgt, base, _rmr, k) =
        target_window(&p, 64, 64, MemPriv::REMOTE_READ | MemPriv::REMOTE_WRITE, 9);
    let src = p.c.lmr(vec![0xAB; 64]);
    // The whole window, then its last 8 bytes.
    let d = p.write(&src, 64, rt(k, base + 64, 64), 1);
    assert_eq!((d.status, d.transferred_length), (DtoStatus::Success, 64));
    let mut want = pattern(256, 3);
    want[64..128].fill(0xAB);
    common::assert_placed(|| tgt.to_vec().unwrap(), &want);
    src.write_at(0, &[0xCD; 8]).unwrap();
    assert_eq!(
        p.write(&src, 8, rt(k, base + 120, 8), 2).status,
        DtoStatus::Success
    );
    want[120..128].fill(0xCD);
    common::assert_placed(|| tgt.to_vec().unwrap(), &want);
    // Read it back through the window.
    let sink = p.c.buf(64);
    let d = p.read(&sink, 64, rt(k, base + 64, 64), 3);
    assert_eq!((d.status, d.transferred_length), (DtoStatus::Success, 64));
    assert_eq!(sink.to_vec().unwrap(), want[64..128]);
    assert_eq!(p.c.ep.state(), EpState::Connected);
    empty(&p.c.conn);
}

#[case]
fn window_access_outside_range_or_right_fails() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.21.19", "127.0.21.20", 1900);
    let (tgt, base, _rmr, k) =
        target_window(&p, 64, 64, MemPriv::REMOTE_READ | MemPriv::REMOTE_WRITE, 1);
    let src = p.c.lmr(vec![0xEE; 64]);
    let sink = p.c.buf(64);
    let before = tgt.to_vec().unwrap();

    // Straddling the start, straddling the end, entirely past it.
    for (i, addr) in [base + 60, base + 124, base + 128].into_iter().enumerate() {
        let d = p.write(&src, 8, rt(k, addr, 8), 10 + i as u64);
        assert_eq!(
            d.status,
            DtoStatus::RemoteAccess,
            "write at +{}",
            addr - base
        );
        assert_eq!(d.transferred_length, 0);
        p.expect_end(ConnectionEventKind::Broken);
        assert_eq!(tgt.to_vec().unwrap(), before, "no byte may change");
        p.reconnect();
    }
    // A read outside the window moves nothing either.
    let d = p.read(&sink, 16, rt(k, base + 120, 16), 20);
    assert_eq!(d.status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(sink.to_vec().unwrap(), vec![0; 64]);
    p.reconnect();

    // A read-only window refuses writes, inside its range.
    let ro = p.s.pz.rmr_create().unwrap();
    let kro = p.bind(&ro, &tgt, 0, 64, MemPriv::REMOTE_READ, 2);
    let d = p.write(&src, 8, rt(kro, base, 8), 30);
    assert_eq!(d.status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(tgt.to_vec().unwrap(), before);
    p.reconnect();
    // ... and allows reads.
    let d = p.read(&sink, 8, rt(kro, base, 8), 31);
    assert_eq!(d.status, DtoStatus::Success);
    assert_eq!(sink.to_vec().unwrap()[..8], before[..8]);
    // A write-only window refuses reads.
    let wo = p.s.pz.rmr_create().unwrap();
    let kwo = p.bind(&wo, &tgt, 0, 64, MemPriv::REMOTE_WRITE, 3);
    let d = p.read(&sink, 8, rt(kwo, base, 8), 32);
    assert_eq!(d.status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
}

#[case]
fn window_after_rmr_free_is_refused() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.21.21", "127.0.21.22", 2100);
    let (tgt, base, rmr, k) = target_window(&p, 0, 32, MemPriv::REMOTE_WRITE, 1);
    let src = p.c.lmr(vec![1; 32]);
    assert_eq!(
        p.write(&src, 32, rt(k, base, 32), 1).status,
        DtoStatus::Success
    );
    let before = tgt.to_vec().unwrap();
    src.write_at(0, &[2; 32]).unwrap();
    rmr.free().unwrap();
    let d = p.write(&src, 32, rt(k, base, 32), 2);
    assert_eq!(d.status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(tgt.to_vec().unwrap(), before);
    // The LMR is free to go now.
    tgt.free().unwrap();
}

#[case]
fn window_old_key_dead_after_rebind_and_unbind() {
    if crate::support::skip_unless_placed() {
        return;
    }
    within(Duration::from_secs(10), "the scenario (deadlock?)", || {
        let p = pair("127.0.21.23", "127.0.21.24", 2300);
        let (tgt, base, rmr, k1) = target_window(&p, 0, 64, MemPriv::REMOTE_WRITE, 1);
        let src = p.c.lmr(vec![9; 64]);
        // Re-bind to another range: the old key dies, the new one works.
        let k2 = p.bind(&rmr, &tgt, 128, 64, MemPriv::REMOTE_WRITE, 2);
        assert_ne!(k1, k2);
        let before = tgt.to_vec().unwrap();
        assert_eq!(
            p.write(&src, 8, rt(k1, base, 8), 3).status,
            DtoStatus::RemoteAccess
        );
        p.expect_end(ConnectionEventKind::Broken);
        assert_eq!(tgt.to_vec().unwrap(), before);
        p.reconnect();
        assert_eq!(
            p.write(&src, 8, rt(k2, base + 128, 8), 4).status,
            DtoStatus::Success
        );
        // The LMR stays in use while the window is bound.
        assert!(tgt.free().is_err());
        // Unbind: neither key works, and the LMR may be freed.
        let k3 = p.s.ep.post_rmr_unbind(&rmr, 5, D).unwrap();
        let d = next_dto(&p.s.req);
        assert_eq!(
            (d.cookie, d.status, d.operation),
            (5, DtoStatus::Success, DtoOp::BindMw)
        );
        assert!(k3 != k1 && k3 != k2);
        let before = tgt.to_vec().unwrap();
        for (i, k) in [k2, k3].into_iter().enumerate() {
            assert_eq!(
                p.write(&src, 8, rt(k, base + 128, 8), 6 + i as u64).status,
                DtoStatus::RemoteAccess
            );
            p.expect_end(ConnectionEventKind::Broken);
            assert_eq!(tgt.to_vec().unwrap(), before);
            p.reconnect();
        }
        rmr.free().unwrap();
        tgt.free().unwrap();
    });
}

// ----- fast registration ---------------------------------------------------

#[case]
fn fmr_map_access_invalidate() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.21.25", "127.0.21.26", 2500);
    let fmr = p.s.pz.lmr_create_fmr(64).unwrap();
    let k0 = fmr.context().unwrap();
    assert!(fmr.region().is_none());
    assert!(matches!(
        fmr.address(),
        Err(Error::InvalidState {
            state: Subtype::InvalidStateLmrFree,
            ..
        })
    ));
    // A plain LMR is not fast-registration.
    let plain = p.s.buf(8);
    assert!(matches!(
        p.s.ep
            .post_lmr_fmr(&plain, Region::zeroed(8), MemPriv::ALL, 1, D),
        Err(Error::InvalidParameter { .. })
    ));
    assert!(matches!(
        p.s.ep.post_lmr_invalidate(&plain, 1, D),
        Err(Error::InvalidParameter { .. })
    ));
    // Larger than its maximum.
    assert!(matches!(
        p.s.ep
            .post_lmr_fmr(&fmr, Region::zeroed(65), MemPriv::ALL, 1, D),
        Err(Error::Length(_))
    ));
    empty(&p.s.req);

    // Map.
    let region = Region::from_vec(pattern(64, 5));
    let k1 =
        p.s.ep
            .post_lmr_fmr(&fmr, region.clone(), MemPriv::ALL, 2, D)
            .unwrap();
    let d = next_dto(&p.s.req);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (2, DtoStatus::Success, DtoOp::LmrFmr)
    );
    assert_ne!(k1, k0);
    assert_eq!(fmr.context().unwrap(), k1);
    assert_eq!(fmr.privileges(), MemPriv::ALL);
    assert_eq!(fmr.address().unwrap(), region.address());
    // Remote access through the mapping.
    let src = p.c.lmr(vec![0x5A; 16]);
    let d = p.write(&src, 16, fmr.rmr_triplet(8, 16).unwrap(), 3);
    assert_eq!(d.status, DtoStatus::Success);
    let mut want = pattern(64, 5);
    want[8..24].fill(0x5A);
    assert_eq!(fmr.to_vec().unwrap(), want);
    let sink = p.c.buf(64);
    assert_eq!(
        p.read(&sink, 64, fmr.rmr_triplet(0, 64).unwrap(), 4).status,
        DtoStatus::Success
    );
    assert_eq!(sink.to_vec().unwrap(), want);
    let mapped = fmr.rmr_triplet(0, 16).unwrap();

    // Invalidate: the key dies at once.
    let k2 = p.s.ep.post_lmr_invalidate(&fmr, 5, D).unwrap();
    assert!(k2 != k1 && k2 != k0);
    let d = next_dto(&p.s.req);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (5, DtoStatus::Success, DtoOp::LmrInvalidate)
    );
    assert_eq!(fmr.context().unwrap(), k2);
    assert!(fmr.region().is_none());
    let d = p.write(&src, 16, mapped, 6);
    assert_eq!(d.status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(&*region.read(), &want[..], "no byte may change");
    p.reconnect();
    // The unmapped key gives no access either.
    let d = p.write(&src, 16, rt(k2, region.address(), 16), 7);
    assert_eq!(d.status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    p.reconnect();

    // Map again (a new region) and free.
    let region2 = Region::zeroed(32);
    let k3 =
        p.s.ep
            .post_lmr_fmr(&fmr, region2.clone(), MemPriv::ALL, 8, D)
            .unwrap();
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
    assert!(![k0, k1, k2].contains(&k3));
    assert_eq!(
        p.write(&src, 16, fmr.rmr_triplet(0, 16).unwrap(), 9).status,
        DtoStatus::Success
    );
    assert_eq!(region2.read()[..16], [0x5A; 16]);
    fmr.free().unwrap();
    let d = p.write(&src, 16, rt(k3, region2.address(), 16), 10);
    assert_eq!(d.status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
}

#[case]
fn fmr_remap_after_invalidate_up_to_max_len() {
    let p = pair("127.0.21.27", "127.0.21.28", 2700);
    let fmr = p.s.pz.lmr_create_fmr(64).unwrap();
    p.s.ep
        .post_lmr_fmr(&fmr, Region::zeroed(32), MemPriv::ALL, 1, D)
        .unwrap();
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
    p.s.ep.post_lmr_invalidate(&fmr, 2, D).unwrap();
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
    // 64 bytes is within the maximum given at creation.
    let r =
        p.s.ep
            .post_lmr_fmr(&fmr, Region::zeroed(64), MemPriv::ALL, 3, D);
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
}

#[case]
fn fmr_remap_beyond_max_len_refused() {
    let p = pair("127.0.21.29", "127.0.21.30", 2900);
    let fmr = p.s.pz.lmr_create_fmr(64).unwrap();
    p.s.ep
        .post_lmr_fmr(&fmr, Region::zeroed(32), MemPriv::ALL, 1, D)
        .unwrap();
    assert_eq!(next_dto(&p.s.req).status, DtoStatus::Success);
    let r =
        p.s.ep
            .post_lmr_fmr(&fmr, Region::zeroed(4096), MemPriv::ALL, 2, D);
    assert!(matches!(r, Err(Error::Length(_))), "{r:?}");
}

#[case]
fn fmr_of_another_pz_refused() {
    let p = pair("127.0.21.31", "127.0.21.32", 3100);
    let pz2 = p.s.ia.pz_create().unwrap();
    let fmr = pz2.lmr_create_fmr(64).unwrap();
    let r =
        p.s.ep
            .post_lmr_fmr(&fmr, Region::zeroed(64), MemPriv::ALL, 1, D);
    match r {
        Err(_) => empty(&p.s.req),
        Ok(_) => {
            let d = next_dto(&p.s.req);
            assert_ne!(
                d.status,
                DtoStatus::Success,
                "an endpoint mapped an FMR of another protection zone"
            );
        }
    }
}

// ----- keys that must be refused on the data path ---------------------------

#[case]
fn freed_lmr_key_refused() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.21.33", "127.0.21.34", 3300);
    // Remote: the server frees its LMR.
    let tgt = target(&p);
    let remote = tgt.rmr_triplet(0, 16).unwrap();
    let region = tgt.region().unwrap();
    let before = region.read().to_vec();
    tgt.free().unwrap();
    let src = p.c.lmr(vec![7; 16]);
    let d = p.write(&src, 16, remote, 1);
    assert_eq!(d.status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(region.read().to_vec(), before);
    p.reconnect();

    // Local: the client frees its source LMR; a receive is waiting.
    let rbuf = p.s.buf(16);
    p.s.recv(&rbuf, 0, 16, 2);
    let stale = src.triplet(0, 16).unwrap();
    src.free().unwrap();
    p.c.ep.post_send(&[stale], 3, D).unwrap();
    let d = next_dto(&p.c.req);
    assert_eq!(
        (d.cookie, d.status, d.operation),
        (3, DtoStatus::LocalProtection, DtoOp::Send)
    );
    let d = next_dto(&p.s.rcv);
    assert_eq!((d.cookie, d.status), (2, DtoStatus::Flushed));
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(rbuf.to_vec().unwrap(), vec![0; 16]);
}

#[case]
fn lmr_of_another_pz_refused() {
    if crate::support::skip_unless_placed() {
        return;
    }
    let p = pair("127.0.21.35", "127.0.21.36", 3500);
    // Remote: the target LMR lives in another PZ of the server's IA.
    let spz2 = p.s.ia.pz_create().unwrap();
    let tgt = spz2
        .lmr_create(Region::from_vec(pattern(32, 9)), MemPriv::ALL)
        .unwrap();
    let src = p.c.lmr(vec![1; 32]);
    let d = p.write(&src, 32, tgt.rmr_triplet(0, 32).unwrap(), 1);
    assert_eq!(d.status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(tgt.to_vec().unwrap(), pattern(32, 9));
    p.reconnect();
    let sink = p.c.buf(32);
    let d = p.read(&sink, 32, tgt.rmr_triplet(0, 32).unwrap(), 2);
    assert_eq!(d.status, DtoStatus::RemoteAccess);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(sink.to_vec().unwrap(), vec![0; 32]);
    p.reconnect();

    // Local: the source (or sink) LMR lives in another PZ of the client's IA.
    let good = target(&p);
    let before = good.to_vec().unwrap();
    let cpz2 = p.c.ia.pz_create().unwrap();
    let foreign = cpz2.lmr_create_from(vec![2; 32], MemPriv::ALL).unwrap();
    let d = p.write(&foreign, 32, good.rmr_triplet(0, 32).unwrap(), 3);
    assert_eq!(d.status, DtoStatus::LocalProtection);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(good.to_vec().unwrap(), before);
    p.reconnect();
    let d = p.read(&foreign, 32, good.rmr_triplet(0, 32).unwrap(), 4);
    assert_eq!(d.status, DtoStatus::LocalProtection);
    p.expect_end(ConnectionEventKind::Broken);
    assert_eq!(foreign.to_vec().unwrap(), vec![2; 32]);
}

/// `read_at` and `write_at` of a plain LMR (which reach its region without
/// the LMR's lock): refused once the LMR is freed (through any handle),
/// and refused once its region is retired.
#[case]
fn lmr_read_write_at_follow_free_and_retirement() {
    let ia = common::open("127.0.21.90");
    let pz = ia.pz_create().unwrap();
    let lmr = pz.lmr_create_from(pattern(16, 3), MemPriv::ALL).unwrap();
    let other = lmr.clone();
    other.write_at(2, b"ab").unwrap();
    let mut two = [0u8; 2];
    lmr.read_at(2, &mut two).unwrap();
    assert_eq!(&two, b"ab");
    lmr.free().unwrap();
    let handle = |r: Result<()>| {
        assert!(
            matches!(r, Err(Error::InvalidHandle(Subtype::InvalidHandleLmr))),
            "{r:?}"
        )
    };
    handle(other.read_at(0, &mut two));
    handle(other.write_at(0, b"xy"));
    handle(lmr.read_at(0, &mut two));

    let region = Region::zeroed(8);
    let lmr = pz.lmr_create(region.clone(), MemPriv::ALL).unwrap();
    region.retire();
    let retired = |r: Result<()>| {
        assert!(
            matches!(
                r,
                Err(Error::InvalidState {
                    state: Subtype::InvalidStateLmrFree,
                    ..
                })
            ),
            "{r:?}"
        )
    };
    retired(lmr.read_at(0, &mut two));
    retired(lmr.write_at(0, b"xy"));
    lmr.free().unwrap();
}
