//! MPA connection-setup decisions (RFC 5044 §7.1, RFC 6581), as pure functions.
//!
//! These functions build the Request and Reply and check the peer's frame;
//! the connection calls them and does the I/O-free bookkeeping. The rules:
//!
//! * CRC is used in both directions if either side sets C (RFC 5044
//!   §7.1); a responder echoes the initiator's C, as siw does.
//! * Markers are never used: a request with M gets a reject reply, a reply
//!   with M fails the connection.
//! * Revision 2 with the Enhanced flag carries IRD/ORD. Each side's usable
//!   ORD is the lower of its own ORD and the peer's IRD. A peer ORD above
//!   our IRD raises our IRD up to [`MAX_IRD_ORD`] (siw's relaxed
//!   negotiation), else it is insufficient IRD.
//! * A revision 1 request gets a revision 1 reply with no IRD/ORD block.
//!   A revision 1 reply to our enhanced request is refused, as siw does.
//! * Peer-to-peer: the responder echoes A and selects exactly one RTR:
//!   Write if offered, else Read, else Send, else Write (siw's choice).

use crate::error::MpaError;
use crate::mpa::{EnhancedParams, FrameKind, IRD_ORD_MASK, MpaFrame};

/// siw's limit on IRD and ORD.
pub const MAX_IRD_ORD: u16 = 128;

/// The ready-to-receive message types an initiator offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrOffer {
    /// Zero-length RDMA Write.
    pub write: bool,
    /// Zero-length RDMA Read.
    pub read: bool,
    /// Zero-length Send.
    pub send: bool,
}

impl Default for RtrOffer {
    fn default() -> Self {
        Self {
            write: true,
            read: true,
            send: false,
        }
    }
}

/// The negotiated ready-to-receive message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rtr {
    /// Zero-length RDMA Write, STag 1, TO 0.
    Write,
    /// Zero-length RDMA Read, source STag 1.
    Read,
    /// Zero-length Send (takes MSN 1 of queue 0, no receive buffer).
    Send,
}

/// What the connection setup settled on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// MPA revision in use.
    pub revision: u8,
    /// RFC 6581 enhanced setup in use.
    pub enhanced: bool,
    /// CRC on FPDUs, both directions.
    pub crc: bool,
    /// Our inbound read limit: read requests we accept at once.
    pub ird: u16,
    /// Our outbound read limit: read requests we have outstanding at once.
    pub ord: u16,
    /// The peer's advertised IRD (enhanced only).
    pub peer_ird: Option<u16>,
    /// The peer's advertised ORD (enhanced only).
    pub peer_ord: Option<u16>,
    /// The RTR message, if peer-to-peer mode was negotiated.
    pub rtr: Option<Rtr>,
}

/// A parsed connection request, shown to the responder's consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// Revision of the request.
    pub revision: u8,
    /// The initiator asked for CRC.
    pub crc: bool,
    /// The IRD/ORD block, for an enhanced request.
    pub params: Option<EnhancedParams>,
    /// The ULP (DAT) private data.
    pub private_data: Vec<u8>,
}

/// Inputs to setup from the local side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Local {
    /// Revision we speak (1 or 2).
    pub revision: u8,
    /// We want CRC.
    pub crc: bool,
    /// Our IRD.
    pub ird: u16,
    /// Our ORD.
    pub ord: u16,
    /// We want peer-to-peer mode (initiator).
    pub peer_to_peer: bool,
    /// The RTR types we offer (initiator).
    pub rtr_offer: RtrOffer,
}

fn clamp(v: u16) -> u16 {
    v.min(MAX_IRD_ORD).min(IRD_ORD_MASK)
}

/// Builds the initiator's Request.
pub fn build_request(local: &Local, ulp_pd: &[u8]) -> MpaFrame {
    let enhanced = local.revision >= 2;
    let mut pd = Vec::with_capacity(ulp_pd.len() + 4);
    if enhanced {
        let p2p = local.peer_to_peer;
        let mut offer = local.rtr_offer;
        if !(offer.write || offer.read || offer.send) {
            // Peer-to-peer needs some RTR; offer the one siw prefers.
            offer.write = true;
        }
        let mut ord = clamp(local.ord);
        if p2p && offer.read {
            ord = ord.max(1);
        }
        let params = EnhancedParams {
            ird: clamp(local.ird),
            ord,
            peer_to_peer: p2p,
            send_rtr: p2p && offer.send,
            write_rtr: p2p && offer.write,
            read_rtr: p2p && offer.read,
        };
        pd.extend_from_slice(&params.encode());
    }
    pd.extend_from_slice(ulp_pd);
    MpaFrame {
        kind: FrameKind::Request,
        markers: false,
        crc: local.crc,
        reject: false,
        enhanced,
        reserved: 0,
        revision: if enhanced { 2 } else { 1 },
        private_data: pd,
    }
}

/// Checks a Request. `Err((e, reply))`: refuse; send a reject reply iff
/// `reply` (the request was understood well enough to answer).
pub fn check_request(req: &MpaFrame) -> Result<ConnectRequest, (MpaError, bool)> {
    if req.kind != FrameKind::Request {
        return Err((MpaError::UnexpectedKind, false));
    }
    if req.revision == 0 {
        return Err((MpaError::UnsupportedRevision(0), true));
    }
    if req.markers {
        return Err((MpaError::Markers, true));
    }
    let params = if req.is_enhanced() {
        if req.private_data.len() < 4 {
            return Err((
                MpaError::MissingEnhancedParams(req.private_data.len() as u16),
                true,
            ));
        }
        req.enhanced_params().map(|(p, _)| p)
    } else {
        None
    };
    Ok(ConnectRequest {
        revision: req.revision,
        crc: req.crc,
        params,
        private_data: req.ulp_private_data().to_vec(),
    })
}

/// Builds the responder's Reply; `accept = false` builds a reject (R bit),
/// which still carries the IRD/ORD block and `ulp_pd` (DAT reject data).
/// Returns the frame and, for an accept, what was negotiated.
pub fn build_reply(
    req: &ConnectRequest,
    local: &Local,
    accept: bool,
    ulp_pd: &[u8],
) -> (MpaFrame, Option<Negotiated>) {
    let enhanced = req.params.is_some() && local.revision >= 2;
    let crc = req.crc || local.crc;
    let mut pd = Vec::with_capacity(ulp_pd.len() + 4);
    let mut neg = Negotiated {
        revision: if enhanced {
            2
        } else {
            req.revision.min(local.revision).max(1)
        },
        enhanced,
        crc,
        ird: clamp(local.ird),
        ord: clamp(local.ord),
        peer_ird: None,
        peer_ord: None,
        rtr: None,
    };
    if let (true, Some(p)) = (enhanced, req.params) {
        neg.peer_ird = Some(p.ird);
        neg.peer_ord = Some(p.ord);
        neg.ord = neg.ord.min(p.ird);
        neg.ird = neg.ird.max(clamp(p.ord));
        let rtr = if p.peer_to_peer {
            Some(if p.write_rtr {
                Rtr::Write
            } else if p.read_rtr {
                Rtr::Read
            } else if p.send_rtr {
                Rtr::Send
            } else {
                Rtr::Write
            })
        } else {
            None
        };
        neg.rtr = rtr;
        let block = EnhancedParams {
            ird: neg.ird,
            ord: neg.ord,
            peer_to_peer: p.peer_to_peer,
            send_rtr: rtr == Some(Rtr::Send),
            write_rtr: rtr == Some(Rtr::Write),
            read_rtr: rtr == Some(Rtr::Read),
        };
        pd.extend_from_slice(&block.encode());
    }
    pd.extend_from_slice(ulp_pd);
    let frame = MpaFrame {
        kind: FrameKind::Reply,
        markers: false,
        crc,
        reject: !accept,
        enhanced,
        reserved: 0,
        revision: neg.revision,
        private_data: pd,
    };
    (frame, accept.then_some(neg))
}

/// Checks the Reply against the Request we sent. On success returns what
/// was negotiated and the peer's ULP private data.
pub fn check_reply(
    sent: &MpaFrame,
    rep: &MpaFrame,
    local: &Local,
) -> Result<(Negotiated, Vec<u8>), MpaError> {
    if rep.kind != FrameKind::Reply {
        return Err(MpaError::UnexpectedKind);
    }
    if rep.markers {
        return Err(MpaError::Markers);
    }
    if rep.reject {
        return Err(MpaError::Rejected);
    }
    let crc = sent.crc || rep.crc;
    if !sent.is_enhanced() {
        if rep.revision != sent.revision {
            return Err(MpaError::RevisionMismatch {
                sent: sent.revision,
                got: rep.revision,
            });
        }
        let neg = Negotiated {
            revision: rep.revision,
            enhanced: false,
            crc,
            ird: clamp(local.ird),
            ord: clamp(local.ord),
            peer_ird: None,
            peer_ord: None,
            rtr: None,
        };
        return Ok((neg, rep.private_data.clone()));
    }
    if !rep.is_enhanced() {
        return Err(MpaError::RevisionMismatch {
            sent: sent.revision,
            got: rep.revision,
        });
    }
    let Some((p, ulp)) = rep.enhanced_params() else {
        return Err(MpaError::MissingEnhancedParams(
            rep.private_data.len() as u16
        ));
    };
    let Some((mine, _)) = sent.enhanced_params() else {
        return Err(MpaError::MissingEnhancedParams(0));
    };
    let mut ird = mine.ird;
    if p.ord > ird {
        if p.ord <= MAX_IRD_ORD {
            ird = p.ord;
        } else {
            return Err(MpaError::InsufficientIrd {
                peer_ord: p.ord,
                max_ird: MAX_IRD_ORD,
            });
        }
    }
    let rtr = if mine.peer_to_peer {
        let picked = [
            (p.write_rtr, mine.write_rtr, Rtr::Write),
            (p.read_rtr, mine.read_rtr, Rtr::Read),
            (p.send_rtr, mine.send_rtr, Rtr::Send),
        ];
        let set: Vec<_> = picked.iter().filter(|x| x.0).collect();
        if !p.peer_to_peer || set.len() != 1 || !set[0].1 {
            return Err(MpaError::NoMatchingRtr);
        }
        Some(set[0].2)
    } else {
        None
    };
    let ord = mine.ord.min(p.ird);
    if rtr == Some(Rtr::Read) && ord == 0 {
        return Err(MpaError::NoMatchingRtr);
    }
    let neg = Negotiated {
        revision: 2,
        enhanced: true,
        crc,
        ird,
        ord,
        peer_ird: Some(p.ird),
        peer_ord: Some(p.ord),
        rtr,
    };
    Ok((neg, ulp.to_vec()))
}
