//! An I/O-free iWARP protocol engine: MPA (RFC 5044, enhanced setup of
//! RFC 6581), DDP (RFC 5041) and RDMAP (RFC 5040), shaped after quinn-proto.
//!
//! Bytes go in ([`Connection::handle_input`]), frames and events come out
//! ([`Connection::poll_transmit`], [`Connection::poll_event`]), and timers
//! are plain millisecond values ([`Connection::poll_timeout`]). There are no
//! sockets, clocks or threads (one exception, invisible in any output: the
//! [`crc`] module times its two ways to sum once per process to keep the
//! faster). Registered memory stays with the caller,
//! behind the [`Memory`] trait; this crate checks every wire length and
//! offset before it asks the caller to place a byte.
//!
//! The wire behaviour follows Linux soft-iWARP (siw): MPA revision 2 with
//! the Enhanced flag, CRC32c sent little-endian, no markers, FPDUs no larger
//! than the MSS, MSNs from 1, Terminates on QN 2 with MSN 1.
//!
//! ```
//! use rdapl_iwarp::{Config, Connection, Event, Role, VecMemory};
//!
//! let mut mem_a = VecMemory::default();
//! let mut mem_b = VecMemory::default();
//! let mut a = Connection::new(Role::Initiator, Config::default(), 0).unwrap();
//! let mut b = Connection::new(Role::Responder, Config::default(), 0).unwrap();
//! a.connect(0, b"hello").unwrap();
//!
//! // Move bytes one way, then the other, until both sides go quiet.
//! fn pump(from: &mut Connection, fm: &VecMemory, to: &mut Connection, tm: &mut VecMemory) {
//!     let mut wire = Vec::new();
//!     while let Some(t) = from.poll_transmit(fm) {
//!         assert!(t.write_to(fm, &mut wire));
//!     }
//!     to.handle_input(0, &wire, tm);
//! }
//! pump(&mut a, &mem_a, &mut b, &mut mem_b);
//! assert!(matches!(b.poll_event(), Some(Event::ConnectRequest(r)) if r.private_data == b"hello"));
//! b.accept(0, b"welcome", None, None).unwrap();
//! pump(&mut b, &mem_b, &mut a, &mut mem_a);
//! assert!(matches!(a.poll_event(), Some(Event::Established { .. })));
//!
//! // A Send from a to b.
//! mem_a.sends.insert(7, b"ping".to_vec());
//! mem_b.recvs.insert(9, vec![0; 16]);
//! b.post_recv(9, 16).unwrap();
//! a.post_send(7, 4).unwrap();
//! pump(&mut a, &mem_a, &mut b, &mut mem_b);
//! while let Some(ev) = b.poll_event() {
//!     if let Event::RecvComplete { wr_id, len, .. } = ev {
//!         assert_eq!((wr_id, len), (9, 4));
//!         assert_eq!(&mem_b.recvs[&9][..4], b"ping");
//!     }
//! }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod conn;
pub mod crc;
pub mod ddp;
pub mod error;
pub mod fpdu;
pub mod fuzzing;
pub mod mem;
pub mod mpa;
pub mod rdmap;
pub mod setup;
pub mod terminate;

pub use conn::{Config, ConnError, Connection, Event, Role, State, Transmit};
pub use ddp::{Buffer, DdpHeader};
pub use error::{MpaError, PostError, ProtocolError, StagError};
pub use fpdu::{FpduDecoder, FpduEvent, Whole};
pub use mem::{Access, Memory, Place, Region, Source, VecMemory};
pub use mpa::{EnhancedParams, FrameKind, MpaFrame};
pub use rdmap::{Opcode, ReadRequest};
pub use setup::{ConnectRequest, Negotiated, Rtr, RtrOffer};
pub use terminate::{TermCode, Terminate};
