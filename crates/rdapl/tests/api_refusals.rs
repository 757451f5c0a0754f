//! Calls the core refuses with a clear error where they once succeeded
//! or ended the process: objects of another IA, private data above the
//! limit, an IA's async EVD freed under it, a buffer larger than memory,
//! an object beyond the IA's `max_*` limits, an LMR or RMR freed after
//! its IA closed.

mod common;
use common::*;
use rdapl::error::Subtype;
use rdapl::*;

/// The IA's async EVD is in use for as long as the IA is open: freeing it
/// is refused (`InvalidState(EVD_IN_USE)`), as freeing an EVD that an
/// endpoint feeds is; otherwise the IA's async events are lost.
#[test]
fn the_ias_async_evd_cannot_be_freed_while_the_ia_is_open() {
    let ia = open("127.0.250.5");
    state_err(ia.async_evd().free(), Subtype::InvalidStateEvdInUse);
    assert!(!ia.async_evd().is_freed());
    ia.close(CloseFlags::Abrupt).unwrap();
}

/// `IaOptions::async_evd` refuses an EVD that was freed already.
#[test]
fn open_refuses_a_freed_async_evd() {
    let evd = Evd::create(8, EvdFlags::ASYNC).unwrap();
    evd.free().unwrap();
    let r = Ia::open_provider(
        provider(),
        IaOptions {
            async_evd: Some(evd),
            ..ia_options("127.0.250.6")
        },
    );
    assert!(
        matches!(
            r,
            Err(Error::InvalidHandle(_)) | Err(Error::InvalidParameter { .. })
        ),
        "{r:?}"
    );
}

/// `Cr::reject` checks its private data against `max_private_data_size`
/// as `Ep::connect` and `Cr::accept` do: a reject carrying more is
/// refused (`InvalidParameter`), the request stays pending, and the
/// active side sees nothing larger than the limit.
#[test]
fn reject_refuses_private_data_above_the_limit() {
    let (c, s, _psp) = listening("127.0.250.1", "127.0.250.2", 9001);
    let max = s.ia.query().unwrap().0.max_private_data_size;
    c.ep.connect(s.ia.address(), 9001, Some(T), b"").unwrap();
    let cr = next_cr(&s.ia, &s.cr);
    let big = vec![7u8; max + 1];
    let r = cr.reject(&big);
    assert!(
        matches!(r, Err(Error::InvalidParameter { .. })),
        "reject with {} bytes of private data (max {max}): {r:?}",
        big.len()
    );
    assert_eq!(cr.state(), CrState::Pending);
    // Still answerable, within the limit.
    cr.reject(b"no").unwrap();
    let ev = conn_ev(&c.conn);
    assert_eq!(ev.kind, ConnectionEventKind::PeerRejected);
    assert!(ev.private_data.as_deref().map_or(0, <[u8]>::len) <= max);
}

/// `Ia::srq_create` refuses a protection zone of another IA, as
/// `ep_create` does (`InvalidHandle(Pz)`).
#[test]
fn srq_create_refuses_a_pz_of_another_ia() {
    let a = open("127.0.250.3");
    let b = open("127.0.250.4");
    let pz_b = b.pz_create().unwrap();
    handle_err(a.srq_create(&pz_b, 4, 1), Subtype::InvalidHandlePz);
    // Nothing was left using the other IA's zone.
    pz_b.free().unwrap();
}

/// `Ia::rsp_create` refuses an endpoint of another IA
/// (`InvalidHandle(Ep)`) and leaves it `Unconnected`.
#[test]
fn rsp_create_refuses_an_endpoint_of_another_ia() {
    let a = Node::new("127.0.250.8");
    let b = Node::new("127.0.250.9");
    handle_err(
        a.ia.rsp_create(9002, &b.ep, &a.cr),
        Subtype::InvalidHandleEp,
    );
    assert_eq!(b.ep.state(), EpState::Unconnected);
}

/// `Cr::accept` refuses an endpoint of another IA than the request's
/// (`InvalidHandle(Ep)`); the request stays pending.
#[test]
fn accept_refuses_an_endpoint_of_another_ia() {
    let (c, s, _psp) = listening("127.0.250.10", "127.0.250.11", 9003);
    let other = Node::new("127.0.250.12");
    c.ep.connect(s.ia.address(), 9003, Some(T), b"").unwrap();
    let cr = next_cr(&s.ia, &s.cr);
    handle_err(cr.accept(&other.ep, b""), Subtype::InvalidHandleEp);
    assert_eq!(other.ep.state(), EpState::Unconnected);
    assert_eq!(cr.state(), CrState::Pending);
    cr.reject(b"").unwrap();
}

/// `Pz::buf_create` of a length the IA allows (`max_lmr_block_size`) but
/// memory cannot hold is refused with `InsufficientResources`; it does
/// not abort the process. (Run in a child process: an abort would end
/// this test binary.)
#[test]
fn buf_create_of_more_than_memory_is_refused_not_aborted() {
    const CHILD: &str = "RDAPL_BUF_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let ia = open("127.0.250.15");
        let pz = ia.pz_create().unwrap();
        let max = ia.query().unwrap().0.max_lmr_block_size;
        // Far more than memory and swap (a kernel that overcommits
        // without limit, `vm.overcommit_memory=1`, grants it untouched).
        match pz.buf_create(max as usize) {
            Ok(b) => eprintln!("granted {} bytes (overcommitted)", b.len()),
            r => resource_err(r.map(|_| ()), Subtype::ResourceMemory),
        }
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "buf_create_of_more_than_memory_is_refused_not_aborted",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the child ended with {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The loopback with every `max_*` object limit of its IAs cut to `.1`.
struct Few(std::sync::Arc<dyn provider::Provider>, usize);

impl provider::Provider for Few {
    fn attr(&self) -> ProviderAttr {
        self.0.attr()
    }
    fn ia_attr(&self, address: std::net::IpAddr) -> IaAttr {
        IaAttr {
            max_eps: self.1,
            max_evds: self.1,
            max_lmrs: self.1,
            max_pzs: self.1,
            max_rmrs: self.1,
            ..self.0.ia_attr(address)
        }
    }
    fn open(
        &self,
        address: Option<std::net::IpAddr>,
        params: &str,
    ) -> Result<std::sync::Arc<dyn provider::Transport>> {
        self.0.open(address, params)
    }
}

fn no_room<T: std::fmt::Debug>(r: Result<T>, want: Subtype) {
    match r {
        Err(Error::InsufficientResources { resource, .. }) if resource == want => {}
        other => panic!("expected InsufficientResources({want:?}), got {other:?}"),
    }
}

/// The IA's object limits (`max_eps`, `max_evds`, `max_lmrs`, `max_pzs`,
/// `max_rmrs`) hold: a creation beyond one is refused with
/// `InsufficientResources` naming the resource, a free (or, for an EVD,
/// dropping its last handle) makes room again, and a refused creation
/// takes no room.
#[test]
fn the_ias_object_limits_hold() {
    let ia = Ia::open_provider(
        std::sync::Arc::new(Few(provider(), 2)),
        ia_options("127.0.250.20"),
    )
    .unwrap();
    let flags = EvdFlags::DTO | EvdFlags::CONNECTION;
    let evd = ia.evd_create(8, flags).unwrap();
    let e2 = ia.evd_create(8, flags).unwrap();
    no_room(ia.evd_create(8, flags), Subtype::ResourceTevd);
    no_room(ia.evd_create(8, flags), Subtype::ResourceTevd);
    e2.free().unwrap();
    let e2 = ia.evd_create(8, flags).unwrap();
    drop(e2);
    let _e2 = ia.evd_create(8, flags).unwrap();
    no_room(ia.evd_create(8, flags), Subtype::ResourceTevd);

    let pz = ia.pz_create().unwrap();
    let p2 = ia.pz_create().unwrap();
    no_room(ia.pz_create(), Subtype::ResourceProtectionDomain);
    p2.free().unwrap();
    let _p2 = ia.pz_create().unwrap();
    no_room(ia.pz_create(), Subtype::ResourceProtectionDomain);

    let region = || Region::zeroed(64);
    let _l1 = pz.lmr_create(region(), MemPriv::ALL).unwrap();
    let l2 = pz.lmr_create_fmr(64).unwrap();
    no_room(
        pz.lmr_create(region(), MemPriv::ALL),
        Subtype::ResourceMemoryRegion,
    );
    no_room(pz.lmr_create_fmr(64), Subtype::ResourceMemoryRegion);
    l2.free().unwrap();
    let _l2 = pz.lmr_create(region(), MemPriv::ALL).unwrap();
    no_room(pz.lmr_create_fmr(64), Subtype::ResourceMemoryRegion);

    let _r1 = pz.rmr_create().unwrap();
    let r2 = pz.rmr_create().unwrap();
    no_room(pz.rmr_create(), Subtype::ResourceMemoryRegion);
    r2.free().unwrap();
    let _r2 = pz.rmr_create().unwrap();
    no_room(pz.rmr_create(), Subtype::ResourceMemoryRegion);

    let ep = || ia.ep_create(&pz, Some(&evd), Some(&evd), Some(&evd), None);
    let _ep1 = ep().unwrap();
    let ep2 = ep().unwrap();
    no_room(ep(), Subtype::ResourceTep);
    ep2.free().unwrap();
    let _ep2 = ep().unwrap();
    no_room(ep(), Subtype::ResourceTep);
    ia.close(CloseFlags::Abrupt).unwrap();
}

/// `Ep::post_rmr_bind` refuses an LMR of another protection zone, of
/// this IA or another (`ProtectionViolation`, as DAT names a zone
/// mismatch), even one registering the same memory: its context is a key
/// of the other IA's table, which must never be looked up in this one.
#[test]
fn rmr_bind_refuses_an_lmr_of_another_ia() {
    let p = pair("127.0.250.21", "127.0.250.22", 9010);
    let other = Node::new("127.0.250.23");
    let region = Region::zeroed(4096);
    let mine = p.c.pz.lmr_create(region.clone(), MemPriv::ALL).unwrap();
    let theirs = other.pz.lmr_create(region.clone(), MemPriv::ALL).unwrap();
    let rmr = p.c.pz.rmr_create().unwrap();
    let t = theirs.triplet(0, 64).unwrap();
    eprintln!(
        "contexts: mine {:#x}, theirs {:#x}",
        mine.context().unwrap(),
        theirs.context().unwrap()
    );
    let r =
        p.c.ep
            .post_rmr_bind(&rmr, &theirs, t, MemPriv::REMOTE_READ, 1, D);
    assert!(
        matches!(r, Err(Error::ProtectionViolation(_))),
        "another IA's LMR: {r:?}"
    );
    let pz2 = p.c.ia.pz_create().unwrap();
    let zoned = pz2.lmr_create(region, MemPriv::ALL).unwrap();
    let t = zoned.triplet(0, 64).unwrap();
    let r =
        p.c.ep
            .post_rmr_bind(&rmr, &zoned, t, MemPriv::REMOTE_READ, 2, D);
    assert!(
        matches!(r, Err(Error::ProtectionViolation(_))),
        "another zone's LMR: {r:?}"
    );
    assert!(p.c.req.dequeue().unwrap().is_none());
    zoned.free().unwrap();
    pz2.free().unwrap();
}

/// An abrupt close destroys every object of the IA (DAT): an LMR, an RMR
/// or a zone freed after it is refused as a freed handle is
/// (`InvalidHandle`), and the provider hears nothing more of them.
#[test]
fn objects_of_an_abruptly_closed_ia_are_gone() {
    let ia = open("127.0.250.24");
    let pz = ia.pz_create().unwrap();
    let lmr = pz.lmr_create(Region::zeroed(64), MemPriv::ALL).unwrap();
    let fmr = pz.lmr_create_fmr(64).unwrap();
    let rmr = pz.rmr_create().unwrap();
    ia.close(CloseFlags::Abrupt).unwrap();
    handle_err(lmr.free(), Subtype::InvalidHandleLmr);
    handle_err(fmr.free(), Subtype::InvalidHandleLmr);
    handle_err(rmr.free(), Subtype::InvalidHandleRmr);
    handle_err(pz.free(), Subtype::InvalidHandlePz);
    handle_err(lmr.context(), Subtype::InvalidHandleLmr);
    handle_err(rmr.context(), Subtype::InvalidHandleRmr);
}
