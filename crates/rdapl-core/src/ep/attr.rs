//! Endpoint attributes, states and completion flags: the plain values of
//! the DAT endpoint (`DAT_EP_ATTR`, `DAT_EP_STATE`, `DAT_COMPLETION_FLAGS`).
//!
//! They hold no state of an endpoint. States carry their DAT values and
//! name the `DAT_INVALID_STATE_EP_*` subtype a refusal reports.

use crate::error::Subtype;

/// Endpoint attributes (`DAT_EP_ATTR`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct EpAttr {
    /// Largest send/receive message.
    pub max_message_size: u64,
    /// Largest RDMA transfer.
    pub max_rdma_size: u64,
    /// Most outstanding receives.
    pub max_recv_dtos: usize,
    /// Most outstanding requests (sends, RDMA, binds).
    pub max_request_dtos: usize,
    /// Most scatter/gather entries per receive.
    pub max_recv_iov: usize,
    /// Most scatter/gather entries per request.
    pub max_request_iov: usize,
    /// Most RDMA reads in flight as target (the IRD a network provider
    /// offers its peer; at most the IA's `max_rdma_read_per_ep`).
    pub max_rdma_read_in: usize,
    /// Most RDMA reads in flight as initiator (the ORD; reads posted
    /// beyond it wait their turn; at most the IA's `max_rdma_read_per_ep`).
    pub max_rdma_read_out: usize,
}

impl Default for EpAttr {
    fn default() -> Self {
        EpAttr {
            max_message_size: 1 << 30,
            max_rdma_size: 1 << 30,
            max_recv_dtos: 256,
            max_request_dtos: 256,
            max_recv_iov: 16,
            max_request_iov: 16,
            max_rdma_read_in: 16,
            max_rdma_read_out: 16,
        }
    }
}

/// `DAT_EP_STATE` (values as in `dat.h`).
#[allow(missing_docs)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum EpState {
    Unconnected = 0,
    Reserved = 2,
    PassiveConnectionPending = 4,
    ActiveConnectionPending = 6,
    TentativeConnectionPending = 7,
    Connected = 9,
    DisconnectPending = 10,
    Disconnected = 11,
}

impl EpState {
    /// The `DAT_INVALID_STATE_EP_*` subtype naming this state.
    pub fn subtype(self) -> Subtype {
        match self {
            EpState::Unconnected => Subtype::InvalidStateEpUnconnected,
            EpState::Reserved => Subtype::InvalidStateEpReserved,
            EpState::PassiveConnectionPending => Subtype::InvalidStateEpPassconnpending,
            EpState::ActiveConnectionPending => Subtype::InvalidStateEpActconnpending,
            EpState::TentativeConnectionPending => Subtype::InvalidStateEpTentconnpending,
            EpState::Connected => Subtype::InvalidStateEpConnected,
            EpState::DisconnectPending => Subtype::InvalidStateEpDiscpending,
            EpState::Disconnected => Subtype::InvalidStateEpDisconnected,
        }
    }
}

/// `DAT_COMPLETION_FLAGS` of a posted work request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct CompletionFlags(pub u32);

impl CompletionFlags {
    /// `DAT_COMPLETION_DEFAULT_FLAG`.
    pub const DEFAULT: CompletionFlags = CompletionFlags(0x00);
    /// `DAT_COMPLETION_SUPPRESS_FLAG`: no completion event if successful.
    pub const SUPPRESS: CompletionFlags = CompletionFlags(0x01);
    /// `DAT_COMPLETION_SOLICITED_WAIT_FLAG`: sender-controlled notification.
    /// On a send it marks the message solicited; on a receive, a successful
    /// completion is queued but notifies (upcall, waiter, CNO) only if the
    /// message that filled it was solicited.
    pub const SOLICITED_WAIT: CompletionFlags = CompletionFlags(0x02);
    /// `DAT_COMPLETION_UNSIGNALLED_FLAG`: on a request, no completion event
    /// if successful; on a receive, the successful completion is queued
    /// without notification.
    pub const UNSIGNALLED: CompletionFlags = CompletionFlags(0x04);
    /// `DAT_COMPLETION_BARRIER_FENCE_FLAG`: start only after earlier RDMA
    /// reads completed (always true: requests execute in order).
    pub const BARRIER_FENCE: CompletionFlags = CompletionFlags(0x08);

    /// True if every flag of `o` is set.
    pub fn contains(self, o: CompletionFlags) -> bool {
        self.0 & o.0 == o.0
    }
    /// Set by the provider on a receive filled by a solicited send.
    pub const SOLICITED_ARRIVAL: CompletionFlags = CompletionFlags(0x8000_0000);

    pub(super) fn quiet_on_success(self) -> bool {
        self.0 & (Self::SUPPRESS.0 | Self::UNSIGNALLED.0) != 0
    }
}

impl std::ops::BitOr for CompletionFlags {
    type Output = CompletionFlags;
    fn bitor(self, rhs: CompletionFlags) -> CompletionFlags {
        CompletionFlags(self.0 | rhs.0)
    }
}
