//! Calls the core refuses with a clear error where they once succeeded
//! and left something wrong behind: objects of another IA, private data
//! above the limit, an IA's async EVD freed under it.

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
