//! Reservations (the slot of one DTO completion, taken at post time) can
//! be neither leaked nor spent on the wrong EVD: a dropped one gives its
//! slot back and is counted; one spent on another EVD is refused in every
//! build with the event handed back, and nothing is published.

use rdapl::evd::EvdProducer;
use rdapl::*;

fn evd(qlen: usize) -> Evd {
    Evd::create(qlen, EvdFlags::SOFTWARE | EvdFlags::DTO).unwrap()
}

fn full(e: &Evd) -> bool {
    matches!(
        e.reserve(),
        Err(Error::InsufficientResources {
            resource: Subtype::ResourceTevd,
            ..
        })
    )
}

#[test]
fn a_dropped_reservation_gives_its_slot_back_and_is_counted() {
    let e = evd(2);
    let a = e.reserve().unwrap();
    let b = e.reserve().unwrap();
    assert!(full(&e), "two slots, both reserved");
    drop(a);
    let c = e
        .reserve()
        .expect("the dropped reservation's slot came back");
    assert_eq!(e.query().unwrap().dropped_reservations, 1);
    e.complete(b, Event::Software(1)).unwrap();
    e.release(c).unwrap();
    // Spent ones are not counted as dropped.
    assert_eq!(e.query().unwrap().dropped_reservations, 1);
    assert_eq!(e.dequeue().unwrap(), Some(Event::Software(1)));
    assert_eq!(e.dequeue().unwrap(), None);
    // Every slot is free again.
    let (x, y) = (e.reserve().unwrap(), e.reserve().unwrap());
    assert!(full(&e));
    e.release(x).unwrap();
    e.release(y).unwrap();
}

#[test]
fn a_reservation_spent_on_another_evd_is_refused_and_handed_back() {
    let (mine, other) = (evd(1), evd(1));
    let r = mine.reserve().unwrap();
    let m = other
        .complete(r, Event::Software(7))
        .expect_err("another EVD's reservation");
    assert_eq!(m.event, Some(Event::Software(7)));
    assert_eq!(m.reservation.evd(), mine.handle());
    // Nothing was published on either, and the other EVD's slot is free.
    assert_eq!(other.dequeue().unwrap(), None);
    assert_eq!(mine.dequeue().unwrap(), None);
    other.release(other.reserve().unwrap()).unwrap();
    // The same for the unsignalled path and for a release.
    let m = other
        .complete_unsignalled(m.reservation, Event::Software(8))
        .unwrap_err();
    let m = other.release(m.reservation).unwrap_err();
    assert_eq!(m.event, None);
    // Handed back, it completes on its own EVD.
    mine.complete(m.reservation, Event::Software(9)).unwrap();
    assert_eq!(mine.dequeue().unwrap(), Some(Event::Software(9)));
    assert_eq!(mine.query().unwrap().dropped_reservations, 0);
}

#[test]
fn a_misdirected_reservation_turned_into_an_error_frees_its_slot() {
    let (mine, other) = (evd(1), evd(1));
    let r = mine.reserve().unwrap();
    assert!(full(&mine));
    let e: Error = other.release(r).unwrap_err().into();
    assert!(matches!(e, Error::InvalidParameter { arg: 1, .. }), "{e:?}");
    mine.release(mine.reserve().expect("the slot came back"))
        .unwrap();
    assert_eq!(mine.query().unwrap().dropped_reservations, 1);
}

#[test]
fn a_reservation_outliving_its_evd_drops_quietly() {
    let e = evd(1);
    let r = e.reserve().unwrap();
    drop(e);
    drop(r);
}
