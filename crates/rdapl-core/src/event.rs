//! DAT events: every event stream an Event Dispatcher carries, with its data.
//!
//! [`Event`] is what an EVD stores (by value) and hands out. Its variants are
//! the six DAT event streams ([`EventStream`]); event numbers, completion
//! statuses and DTO operations convert to and from the exact `dat.h` values.
//!
//! Handles inside events are opaque ids ([`EpHandle`], [`CrHandle`], ...): the
//! object model resolves them, and the C ABI maps them to the pointers a C
//! consumer holds. An event never borrows provider memory.

use std::fmt;

macro_rules! handle {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Copy, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
        pub struct $name(pub u64);

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }
    };
}

handle!(
    /// An interface adapter (`DAT_IA_HANDLE`).
    IaHandle
);
handle!(
    /// An endpoint (`DAT_EP_HANDLE`).
    EpHandle
);
handle!(
    /// An event dispatcher (`DAT_EVD_HANDLE`).
    EvdHandle
);
handle!(
    /// A public, reserved or common service point (`DAT_SP_HANDLE`).
    SpHandle
);
handle!(
    /// A pending connection request (`DAT_CR_HANDLE`).
    CrHandle
);
handle!(
    /// A local memory region (`DAT_LMR_HANDLE`).
    LmrHandle
);
handle!(
    /// A remote memory region / memory window (`DAT_RMR_HANDLE`).
    RmrHandle
);
handle!(
    /// A protection zone (`DAT_PZ_HANDLE`).
    PzHandle
);
handle!(
    /// A shared receive queue (`DAT_SRQ_HANDLE`).
    SrqHandle
);

/// The six DAT event streams, in the index order of
/// `evd_stream_merging_supported[6][6]`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventStream {
    /// Software events (`dat_evd_post_se`).
    Software = 0,
    /// Connection-request arrivals.
    ConnectionRequest = 1,
    /// DTO completions (also memory-window binds and fast-registration in DAT 2.0).
    Dto = 2,
    /// Connection events.
    Connection = 3,
    /// RMR bind completions.
    RmrBind = 4,
    /// Asynchronous errors.
    Async = 5,
}

impl EventStream {
    /// All streams, in index order.
    pub const ALL: [EventStream; 6] = [
        EventStream::Software,
        EventStream::ConnectionRequest,
        EventStream::Dto,
        EventStream::Connection,
        EventStream::RmrBind,
        EventStream::Async,
    ];

    /// Index into the stream-merging matrix.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The `DAT_EVD_*_FLAG` that enables this stream on an EVD.
    pub fn flag(self) -> EvdFlags {
        match self {
            EventStream::Software => EvdFlags::SOFTWARE,
            EventStream::ConnectionRequest => EvdFlags::CR,
            EventStream::Dto => EvdFlags::DTO,
            EventStream::Connection => EvdFlags::CONNECTION,
            EventStream::RmrBind => EvdFlags::RMR_BIND,
            EventStream::Async => EvdFlags::ASYNC,
        }
    }
}

/// `DAT_EVD_FLAGS`: which streams an EVD accepts.
#[derive(Copy, Clone, PartialEq, Eq, Hash, Default)]
pub struct EvdFlags(u32);

impl EvdFlags {
    /// `DAT_EVD_SOFTWARE_FLAG`.
    pub const SOFTWARE: EvdFlags = EvdFlags(0x001);
    /// `DAT_EVD_CR_FLAG`.
    pub const CR: EvdFlags = EvdFlags(0x010);
    /// `DAT_EVD_DTO_FLAG`.
    pub const DTO: EvdFlags = EvdFlags(0x020);
    /// `DAT_EVD_CONNECTION_FLAG`.
    pub const CONNECTION: EvdFlags = EvdFlags(0x040);
    /// `DAT_EVD_RMR_BIND_FLAG`.
    pub const RMR_BIND: EvdFlags = EvdFlags(0x080);
    /// `DAT_EVD_ASYNC_FLAG`.
    pub const ASYNC: EvdFlags = EvdFlags(0x100);
    /// `DAT_EVD_DEFAULT_FLAG`: every DAT stream but software events.
    pub const DEFAULT: EvdFlags = EvdFlags(0x1F0);
    /// Every stream, software included.
    pub const ALL: EvdFlags = EvdFlags(0x1F1);

    /// The flags from raw bits; `None` if an unknown bit is set or no stream is.
    pub fn from_bits(bits: u32) -> Option<EvdFlags> {
        if bits & !Self::ALL.0 != 0 || bits == 0 {
            None
        } else {
            Some(EvdFlags(bits))
        }
    }

    /// The raw `DAT_EVD_FLAGS` bits.
    pub fn bits(self) -> u32 {
        self.0
    }

    /// True if every flag of `other` is set here.
    pub fn contains(self, other: EvdFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// True if the EVD accepts events of `stream`.
    pub fn accepts(self, stream: EventStream) -> bool {
        self.contains(stream.flag())
    }

    /// The streams these flags enable.
    pub fn streams(self) -> impl Iterator<Item = EventStream> {
        EventStream::ALL
            .into_iter()
            .filter(move |s| self.accepts(*s))
    }
}

impl std::ops::BitOr for EvdFlags {
    type Output = EvdFlags;
    fn bitor(self, rhs: EvdFlags) -> EvdFlags {
        EvdFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for EvdFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.streams().map(|s| format!("{s:?}")).collect();
        write!(f, "EvdFlags({:#x}: {})", self.0, names.join("|"))
    }
}

macro_rules! dat_enum {
    ($(#[$m:meta])* $name:ident : $repr:ty { $($(#[$vm:meta])* $v:ident = $val:expr,)* }) => {
        $(#[$m])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
        #[repr($repr)]
        pub enum $name { $($(#[$vm])* $v = $val,)* }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$v,)*];
            /// The DAT value.
            pub fn to_dat(self) -> $repr { self as $repr }
            /// The variant for a DAT value, if it names one.
            pub fn from_dat(v: $repr) -> Option<$name> {
                match v { $(x if x == $val => Some($name::$v),)* _ => None }
            }
        }

        impl TryFrom<$repr> for $name {
            type Error = crate::Error;
            fn try_from(v: $repr) -> Result<$name, crate::Error> {
                $name::from_dat(v).ok_or(crate::Error::InvalidParameter {
                    arg: 1,
                    what: concat!("not a ", stringify!($name), " value"),
                })
            }
        }

        impl From<$name> for $repr {
            fn from(v: $name) -> $repr { v as $repr }
        }
    };
}

dat_enum!(
    /// `DAT_EVENT_NUMBER`.
    EventNumber: u32 {
        /// `DAT_DTO_COMPLETION_EVENT`
        DtoCompletion = 0x00001,
        /// `DAT_RMR_BIND_COMPLETION_EVENT`
        RmrBindCompletion = 0x01001,
        /// `DAT_CONNECTION_REQUEST_EVENT`
        ConnectionRequest = 0x02001,
        /// `DAT_CONNECTION_EVENT_ESTABLISHED`
        ConnectionEstablished = 0x04001,
        /// `DAT_CONNECTION_EVENT_PEER_REJECTED`
        ConnectionPeerRejected = 0x04002,
        /// `DAT_CONNECTION_EVENT_NON_PEER_REJECTED`
        ConnectionNonPeerRejected = 0x04003,
        /// `DAT_CONNECTION_EVENT_ACCEPT_COMPLETION_ERROR`
        ConnectionAcceptCompletionError = 0x04004,
        /// `DAT_CONNECTION_EVENT_DISCONNECTED`
        ConnectionDisconnected = 0x04005,
        /// `DAT_CONNECTION_EVENT_BROKEN`
        ConnectionBroken = 0x04006,
        /// `DAT_CONNECTION_EVENT_TIMED_OUT`
        ConnectionTimedOut = 0x04007,
        /// `DAT_CONNECTION_EVENT_UNREACHABLE`
        ConnectionUnreachable = 0x04008,
        /// `DAT_ASYNC_ERROR_EVD_OVERFLOW`
        AsyncEvdOverflow = 0x08001,
        /// `DAT_ASYNC_ERROR_IA_CATASTROPHIC`
        AsyncIaCatastrophic = 0x08002,
        /// `DAT_ASYNC_ERROR_EP_BROKEN`
        AsyncEpBroken = 0x08003,
        /// `DAT_ASYNC_ERROR_TIMED_OUT`
        AsyncTimedOut = 0x08004,
        /// `DAT_ASYNC_ERROR_PROVIDER_INTERNAL_ERROR`
        AsyncProviderInternalError = 0x08005,
        /// `DAT_SOFTWARE_EVENT`
        Software = 0x10001,
    }
);

impl EventNumber {
    /// The stream an event of this number travels on.
    pub fn stream(self) -> EventStream {
        match self {
            EventNumber::DtoCompletion => EventStream::Dto,
            EventNumber::RmrBindCompletion => EventStream::RmrBind,
            EventNumber::ConnectionRequest => EventStream::ConnectionRequest,
            EventNumber::Software => EventStream::Software,
            n if (n as u32) & 0x4000 != 0 => EventStream::Connection,
            _ => EventStream::Async,
        }
    }
}

dat_enum!(
    /// `DAT_DTO_COMPLETION_STATUS` (also the RMR bind status).
    DtoStatus: u32 {
        /// `DAT_DTO_SUCCESS`
        Success = 0,
        /// `DAT_DTO_ERR_FLUSHED`: the endpoint left the connected state first.
        Flushed = 1,
        /// `DAT_DTO_ERR_LOCAL_LENGTH`: the local buffer was too small.
        LocalLength = 2,
        /// `DAT_DTO_ERR_LOCAL_EP`
        LocalEp = 3,
        /// `DAT_DTO_ERR_LOCAL_PROTECTION`: a local key, range or right was wrong.
        LocalProtection = 4,
        /// `DAT_DTO_ERR_BAD_RESPONSE`
        BadResponse = 5,
        /// `DAT_DTO_ERR_REMOTE_ACCESS`: the remote key, range or right was wrong.
        RemoteAccess = 6,
        /// `DAT_DTO_ERR_REMOTE_RESPONDER`: the remote side failed the operation.
        RemoteResponder = 7,
        /// `DAT_DTO_ERR_TRANSPORT`
        Transport = 8,
        /// `DAT_DTO_ERR_RECEIVER_NOT_READY`: no receive was posted in time.
        ReceiverNotReady = 9,
        /// `DAT_DTO_ERR_PARTIAL_PACKET`
        PartialPacket = 10,
        /// `DAT_RMR_OPERATION_FAILED`
        RmrOperationFailed = 11,
        /// `DAT_DTO_ERR_LOCAL_MM_ERROR` (kDAT fast registration).
        LocalMmError = 12,
    }
);

impl DtoStatus {
    /// True for `DAT_DTO_SUCCESS`.
    pub fn is_success(self) -> bool {
        self == DtoStatus::Success
    }
}

dat_enum!(
    /// `DAT_DTOS`: the operation a DTO completion reports.
    DtoOp: u32 {
        /// `DAT_DTO_SEND`
        Send = 0,
        /// `DAT_DTO_RDMA_WRITE`
        RdmaWrite = 1,
        /// `DAT_DTO_RDMA_READ`
        RdmaRead = 2,
        /// `DAT_DTO_RECEIVE`
        Receive = 3,
        /// `DAT_DTO_RECEIVE_WITH_INVALIDATE`
        ReceiveWithInvalidate = 4,
        /// `DAT_DTO_BIND_MW`
        BindMw = 5,
        /// `DAT_DTO_LMR_FMR` (kDAT fast registration).
        LmrFmr = 6,
        /// `DAT_DTO_LMR_INVALIDATE` (kDAT).
        LmrInvalidate = 7,
    }
);

/// Data of a `DAT_DTO_COMPLETION_EVENT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DtoCompletion {
    /// The endpoint the DTO was posted on.
    pub ep: EpHandle,
    /// The endpoint's consumer context when the event was made (its
    /// `consumer_context()`: what a consumer, or the C ABI, keeps there to
    /// find its own object without a lookup).
    pub consumer_context: u64,
    /// The consumer's cookie from the post.
    pub cookie: u64,
    /// Completion status.
    pub status: DtoStatus,
    /// Bytes transferred (defined only on success).
    pub transferred_length: u64,
    /// The operation.
    pub operation: DtoOp,
    /// For receive-with-invalidate: the invalidated RMR context.
    pub rmr_context: u32,
    /// The owned buffer of a request posted with one
    /// ([`Ep::post_send_buf`](crate::Ep::post_send_buf),
    /// [`Ep::post_recv_buf`](crate::Ep::post_recv_buf)), handed back
    /// whatever the status; `None` for requests posted with LMR triplets.
    pub buf: Option<crate::buf::Buf>,
}

/// Data of a `DAT_RMR_BIND_COMPLETION_EVENT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RmrBindCompletion {
    /// The RMR that was bound.
    pub rmr: RmrHandle,
    /// The RMR's consumer context when the event was made (its
    /// `consumer_context()`: what a consumer, or the C ABI, keeps there to
    /// find its own object without a lookup).
    pub consumer_context: u64,
    /// The consumer's cookie from the bind.
    pub cookie: u64,
    /// `Success` or a failure status.
    pub status: DtoStatus,
}

/// Data of a `DAT_CONNECTION_REQUEST_EVENT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrArrival {
    /// The service point that took the request (`None` for a reserved SP,
    /// which is consumed by the arrival).
    pub sp: Option<SpHandle>,
    /// The service point's (public or reserved) consumer context when the event was made (its
    /// `consumer_context()`: what a consumer, or the C ABI, keeps there to
    /// find its own object without a lookup).
    pub consumer_context: u64,
    /// The connection qualifier the request arrived on.
    pub conn_qual: u64,
    /// The request, to accept or reject.
    pub cr: CrHandle,
    /// True if the remote private data did not fit and was truncated.
    pub truncated: bool,
}

dat_enum!(
    /// The kind of a connection event (`DAT_CONNECTION_EVENT_*`).
    ConnectionEventKind: u32 {
        /// Established.
        Established = 0x04001,
        /// The peer rejected the request.
        PeerRejected = 0x04002,
        /// Rejected by someone other than the peer consumer (no listener, provider refusal).
        NonPeerRejected = 0x04003,
        /// The accept could not complete.
        AcceptCompletionError = 0x04004,
        /// Disconnected (graceful or abrupt).
        Disconnected = 0x04005,
        /// The connection broke.
        Broken = 0x04006,
        /// The connect timed out.
        TimedOut = 0x04007,
        /// The remote address could not be reached.
        Unreachable = 0x04008,
    }
);

/// Data of a connection event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionEvent {
    /// What happened.
    pub kind: ConnectionEventKind,
    /// The endpoint it happened to.
    pub ep: EpHandle,
    /// The endpoint's consumer context when the event was made (its
    /// `consumer_context()`: what a consumer, or the C ABI, keeps there to
    /// find its own object without a lookup).
    pub consumer_context: u64,
    /// Private data from the peer, if any (e.g. the accept's private data on
    /// the active side of `Established`, or a reject's).
    pub private_data: Option<Box<[u8]>>,
}

dat_enum!(
    /// The kind of an asynchronous error (`DAT_ASYNC_ERROR_*`).
    AsyncErrorKind: u32 {
        /// An EVD overflowed; the handle names the EVD.
        EvdOverflow = 0x08001,
        /// The IA failed.
        IaCatastrophic = 0x08002,
        /// An endpoint broke.
        EpBroken = 0x08003,
        /// A timeout.
        TimedOut = 0x08004,
        /// The provider failed internally.
        ProviderInternalError = 0x08005,
    }
);

/// The object an asynchronous error is about (`dat_handle`).
#[allow(missing_docs)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum DatObject {
    Ia(IaHandle),
    Ep(EpHandle),
    Evd(EvdHandle),
    Srq(SrqHandle),
    Lmr(LmrHandle),
    Rmr(RmrHandle),
    Pz(PzHandle),
}

/// Data of an asynchronous error event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AsyncError {
    /// What happened.
    pub kind: AsyncErrorKind,
    /// The object affected.
    pub object: DatObject,
    /// The affected object's consumer context when the event was made (its
    /// `consumer_context()`: what a consumer, or the C ABI, keeps there to
    /// find its own object without a lookup).
    pub consumer_context: u64,
    /// The object-specific reason (`DAT_EVD_OVERFLOW_ERROR` = 0, ...).
    pub reason: i32,
}

/// `DAT_EVD_OVERFLOW_ERROR`, the reason of an overflow event.
pub const DAT_EVD_OVERFLOW_ERROR: i32 = 0;

/// A DAT event: one of the six streams with its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A DTO completion.
    Dto(DtoCompletion),
    /// An RMR bind completion.
    RmrBind(RmrBindCompletion),
    /// A connection request arrived.
    ConnectionRequest(CrArrival),
    /// A connection event.
    Connection(ConnectionEvent),
    /// An asynchronous error.
    AsyncError(AsyncError),
    /// A software event posted by the consumer; the value is opaque
    /// (`software_event_data.pointer`).
    Software(u64),
}

impl Event {
    /// The stream this event travels on.
    pub fn stream(&self) -> EventStream {
        match self {
            Event::Dto(_) => EventStream::Dto,
            Event::RmrBind(_) => EventStream::RmrBind,
            Event::ConnectionRequest(_) => EventStream::ConnectionRequest,
            Event::Connection(_) => EventStream::Connection,
            Event::AsyncError(_) => EventStream::Async,
            Event::Software(_) => EventStream::Software,
        }
    }

    /// The `DAT_EVENT_NUMBER` of this event.
    pub fn number(&self) -> EventNumber {
        match self {
            Event::Dto(_) => EventNumber::DtoCompletion,
            Event::RmrBind(_) => EventNumber::RmrBindCompletion,
            Event::ConnectionRequest(_) => EventNumber::ConnectionRequest,
            Event::Connection(c) => {
                EventNumber::from_dat(c.kind.to_dat()).unwrap_or(EventNumber::ConnectionBroken)
            }
            Event::AsyncError(a) => EventNumber::from_dat(a.kind.to_dat())
                .unwrap_or(EventNumber::AsyncProviderInternalError),
            Event::Software(_) => EventNumber::Software,
        }
    }

    /// The EVD-overflow async event for `evd` (whose consumer context is
    /// `context`).
    pub fn evd_overflow(evd: EvdHandle, context: u64) -> Event {
        Event::AsyncError(AsyncError {
            kind: AsyncErrorKind::EvdOverflow,
            object: DatObject::Evd(evd),
            consumer_context: context,
            reason: DAT_EVD_OVERFLOW_ERROR,
        })
    }

    /// The DTO completion, if this is one.
    pub fn as_dto(&self) -> Option<&DtoCompletion> {
        match self {
            Event::Dto(d) => Some(d),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_numbers_round_trip_and_map_to_streams() {
        for n in EventNumber::ALL {
            assert_eq!(EventNumber::from_dat(n.to_dat()), Some(*n));
            assert_eq!(EventNumber::try_from(n.to_dat()).unwrap(), *n);
        }
        assert_eq!(EventNumber::DtoCompletion.to_dat(), 0x1);
        assert_eq!(EventNumber::Software.to_dat(), 0x10001);
        assert_eq!(
            EventNumber::ConnectionUnreachable.stream(),
            EventStream::Connection
        );
        assert_eq!(EventNumber::AsyncEvdOverflow.stream(), EventStream::Async);
        assert_eq!(
            EventNumber::ConnectionRequest.stream(),
            EventStream::ConnectionRequest
        );
        assert!(EventNumber::from_dat(0x4009).is_none());
        assert!(EventNumber::try_from(0x20000).is_err());
        // Every connection and async kind names an event number of its stream.
        for k in ConnectionEventKind::ALL {
            let n = EventNumber::from_dat(k.to_dat()).unwrap();
            assert_eq!(n.stream(), EventStream::Connection);
        }
        for k in AsyncErrorKind::ALL {
            let n = EventNumber::from_dat(k.to_dat()).unwrap();
            assert_eq!(n.stream(), EventStream::Async);
        }
    }

    #[test]
    fn statuses_and_operations_have_dat_values() {
        assert_eq!(DtoStatus::ALL.len(), 13);
        for (i, s) in DtoStatus::ALL.iter().enumerate() {
            assert_eq!(s.to_dat(), i as u32);
            assert_eq!(DtoStatus::from_dat(i as u32), Some(*s));
        }
        assert_eq!(DtoStatus::ReceiverNotReady.to_dat(), 9);
        assert!(DtoStatus::from_dat(13).is_none());
        for (i, o) in DtoOp::ALL.iter().enumerate() {
            assert_eq!(o.to_dat(), i as u32);
        }
        assert_eq!(DtoOp::LmrInvalidate.to_dat(), 7);
        assert!(DtoOp::try_from(8).is_err());
    }

    #[test]
    fn event_number_and_stream_of_each_variant() {
        let ev = Event::Connection(ConnectionEvent {
            kind: ConnectionEventKind::Disconnected,
            ep: EpHandle(1),
            consumer_context: 0,
            private_data: None,
        });
        assert_eq!(ev.number(), EventNumber::ConnectionDisconnected);
        assert_eq!(ev.stream(), EventStream::Connection);
        let ov = Event::evd_overflow(EvdHandle(7), 0);
        assert_eq!(ov.number(), EventNumber::AsyncEvdOverflow);
        assert_eq!(ov.stream(), EventStream::Async);
        assert_eq!(Event::Software(3).number().to_dat(), 0x10001);
    }

    #[test]
    fn evd_flags() {
        assert_eq!(EvdFlags::DEFAULT.bits(), 0x1F0);
        assert!(EvdFlags::DEFAULT.accepts(EventStream::Dto));
        assert!(!EvdFlags::DEFAULT.accepts(EventStream::Software));
        assert_eq!(EvdFlags::from_bits(0x2), None);
        assert_eq!(EvdFlags::from_bits(0), None);
        assert_eq!(
            EvdFlags::from_bits(0x21),
            Some(EvdFlags::DTO | EvdFlags::SOFTWARE)
        );
        assert_eq!(EvdFlags::ALL.streams().count(), 6);
        for s in EventStream::ALL {
            assert_eq!(EventStream::ALL[s.index()], s);
        }
    }
}
