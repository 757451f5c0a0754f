//! Typed errors and their DAT return codes.
//!
//! Every fallible rdapl call returns [`Error`]. Each variant maps to exactly one
//! `DAT_RETURN` *type* and *subtype* (the values of `dat_error.h`), through
//! [`Error::dat_return`], so the C ABI can hand back the code a DAPL program
//! expects while Rust callers match on a precise variant.

use std::fmt;

/// A raw `DAT_RETURN` value: class (bits 31-30), type (29-16), subtype (15-0).
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct DatReturn(pub u32);

impl DatReturn {
    /// `DAT_SUCCESS`.
    pub const SUCCESS: DatReturn = DatReturn(0);
    /// `DAT_CLASS_ERROR`.
    pub const CLASS_ERROR: u32 = 0x8000_0000;
    /// `DAT_CLASS_WARNING`.
    pub const CLASS_WARNING: u32 = 0x4000_0000;
    /// `DAT_TYPE_MASK`.
    pub const TYPE_MASK: u32 = 0x3fff_0000;
    /// `DAT_SUBTYPE_MASK`.
    pub const SUBTYPE_MASK: u32 = 0x0000_ffff;

    /// `DAT_ERROR(type, subtype)`: an error-class return.
    pub const fn error(ty: DatType, subtype: Subtype) -> DatReturn {
        DatReturn(Self::CLASS_ERROR | ty as u32 | subtype as u32)
    }

    /// The type bits (`DAT_GET_TYPE`), if they name a known type.
    pub fn ty(self) -> Option<DatType> {
        DatType::from_u32(self.0 & Self::TYPE_MASK)
    }

    /// The subtype bits (`DAT_GET_SUBTYPE`), if they name a known subtype.
    pub fn subtype(self) -> Option<Subtype> {
        Subtype::from_u16((self.0 & Self::SUBTYPE_MASK) as u16)
    }

    /// True for `DAT_SUCCESS` (type bits zero, no error class).
    pub fn is_success(self) -> bool {
        self.0 & (Self::CLASS_ERROR | Self::TYPE_MASK) == 0
    }
}

impl fmt::Debug for DatReturn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "DatReturn({:#010x} {:?}|{:?})",
            self.0,
            self.ty(),
            self.subtype()
        )
    }
}

/// `DAT_RETURN_TYPE` values (already shifted into bits 29-16).
#[allow(missing_docs)]
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum DatType {
    Success = 0x0000_0000,
    Abort = 0x0001_0000,
    ConnQualInUse = 0x0002_0000,
    InsufficientResources = 0x0003_0000,
    InternalError = 0x0004_0000,
    InvalidHandle = 0x0005_0000,
    InvalidParameter = 0x0006_0000,
    InvalidState = 0x0007_0000,
    LengthError = 0x0008_0000,
    ModelNotSupported = 0x0009_0000,
    ProviderNotFound = 0x000A_0000,
    PrivilegesViolation = 0x000B_0000,
    ProtectionViolation = 0x000C_0000,
    QueueEmpty = 0x000D_0000,
    QueueFull = 0x000E_0000,
    TimeoutExpired = 0x000F_0000,
    ProviderAlreadyRegistered = 0x0010_0000,
    ProviderInUse = 0x0011_0000,
    InvalidAddress = 0x0012_0000,
    InterruptedCall = 0x0013_0000,
    ConnQualUnavailable = 0x0014_0000,
    ReservedLmr = 0x0015_0000,
    PortInUse = 0x0016_0000,
    CommNotSupported = 0x0017_0000,
    NotImplemented = 0x3FFF_0000,
}

impl DatType {
    const ALL: [DatType; 25] = [
        DatType::Success,
        DatType::Abort,
        DatType::ConnQualInUse,
        DatType::InsufficientResources,
        DatType::InternalError,
        DatType::InvalidHandle,
        DatType::InvalidParameter,
        DatType::InvalidState,
        DatType::LengthError,
        DatType::ModelNotSupported,
        DatType::ProviderNotFound,
        DatType::PrivilegesViolation,
        DatType::ProtectionViolation,
        DatType::QueueEmpty,
        DatType::QueueFull,
        DatType::TimeoutExpired,
        DatType::ProviderAlreadyRegistered,
        DatType::ProviderInUse,
        DatType::InvalidAddress,
        DatType::InterruptedCall,
        DatType::ConnQualUnavailable,
        DatType::ReservedLmr,
        DatType::PortInUse,
        DatType::CommNotSupported,
        DatType::NotImplemented,
    ];

    /// The type whose value is `v` (already masked with `DAT_TYPE_MASK`).
    pub fn from_u32(v: u32) -> Option<DatType> {
        Self::ALL.iter().copied().find(|t| *t as u32 == v)
    }
}

/// `DAT_RETURN_SUBTYPE` values, in the order of `dat_error.h` (DAT 2.0).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Subtype {
    /// `DAT_NO_SUBTYPE`
    NoSubtype = 0,
    /// `DAT_SUB_INTERRUPTED`
    SubInterrupted = 1,
    /// `DAT_RESOURCE_MEMORY`
    ResourceMemory = 2,
    /// `DAT_RESOURCE_DEVICE`
    ResourceDevice = 3,
    /// `DAT_RESOURCE_TEP`
    ResourceTep = 4,
    /// `DAT_RESOURCE_TEVD`
    ResourceTevd = 5,
    /// `DAT_RESOURCE_PROTECTION_DOMAIN`
    ResourceProtectionDomain = 6,
    /// `DAT_RESOURCE_MEMORY_REGION`
    ResourceMemoryRegion = 7,
    /// `DAT_RESOURCE_ERROR_HANDLER`
    ResourceErrorHandler = 8,
    /// `DAT_RESOURCE_CREDITS`
    ResourceCredits = 9,
    /// `DAT_RESOURCE_SRQ`
    ResourceSrq = 10,
    /// `DAT_INVALID_HANDLE_IA`
    InvalidHandleIa = 11,
    /// `DAT_INVALID_HANDLE_EP`
    InvalidHandleEp = 12,
    /// `DAT_INVALID_HANDLE_LMR`
    InvalidHandleLmr = 13,
    /// `DAT_INVALID_HANDLE_RMR`
    InvalidHandleRmr = 14,
    /// `DAT_INVALID_HANDLE_PZ`
    InvalidHandlePz = 15,
    /// `DAT_INVALID_HANDLE_PSP`
    InvalidHandlePsp = 16,
    /// `DAT_INVALID_HANDLE_RSP`
    InvalidHandleRsp = 17,
    /// `DAT_INVALID_HANDLE_CR`
    InvalidHandleCr = 18,
    /// `DAT_INVALID_HANDLE_CNO`
    InvalidHandleCno = 19,
    /// `DAT_INVALID_HANDLE_EVD_CR`
    InvalidHandleEvdCr = 20,
    /// `DAT_INVALID_HANDLE_EVD_REQUEST`
    InvalidHandleEvdRequest = 21,
    /// `DAT_INVALID_HANDLE_EVD_RECV`
    InvalidHandleEvdRecv = 22,
    /// `DAT_INVALID_HANDLE_EVD_CONN`
    InvalidHandleEvdConn = 23,
    /// `DAT_INVALID_HANDLE_EVD_ASYNC`
    InvalidHandleEvdAsync = 24,
    /// `DAT_INVALID_HANDLE_SRQ`
    InvalidHandleSrq = 25,
    /// `DAT_INVALID_HANDLE_CSP`
    InvalidHandleCsp = 26,
    /// `DAT_INVALID_HANDLE1`
    InvalidHandle1 = 27,
    /// `DAT_INVALID_HANDLE2`
    InvalidHandle2 = 28,
    /// `DAT_INVALID_HANDLE3`
    InvalidHandle3 = 29,
    /// `DAT_INVALID_HANDLE4`
    InvalidHandle4 = 30,
    /// `DAT_INVALID_HANDLE5`
    InvalidHandle5 = 31,
    /// `DAT_INVALID_HANDLE6`
    InvalidHandle6 = 32,
    /// `DAT_INVALID_HANDLE7`
    InvalidHandle7 = 33,
    /// `DAT_INVALID_HANDLE8`
    InvalidHandle8 = 34,
    /// `DAT_INVALID_HANDLE9`
    InvalidHandle9 = 35,
    /// `DAT_INVALID_HANDLE10`
    InvalidHandle10 = 36,
    /// `DAT_INVALID_ARG1`
    InvalidArg1 = 37,
    /// `DAT_INVALID_ARG2`
    InvalidArg2 = 38,
    /// `DAT_INVALID_ARG3`
    InvalidArg3 = 39,
    /// `DAT_INVALID_ARG4`
    InvalidArg4 = 40,
    /// `DAT_INVALID_ARG5`
    InvalidArg5 = 41,
    /// `DAT_INVALID_ARG6`
    InvalidArg6 = 42,
    /// `DAT_INVALID_ARG7`
    InvalidArg7 = 43,
    /// `DAT_INVALID_ARG8`
    InvalidArg8 = 44,
    /// `DAT_INVALID_ARG9`
    InvalidArg9 = 45,
    /// `DAT_INVALID_ARG10`
    InvalidArg10 = 46,
    /// `DAT_INVALID_STATE_EP_UNCONNECTED`
    InvalidStateEpUnconnected = 47,
    /// `DAT_INVALID_STATE_EP_ACTCONNPENDING`
    InvalidStateEpActconnpending = 48,
    /// `DAT_INVALID_STATE_EP_PASSCONNPENDING`
    InvalidStateEpPassconnpending = 49,
    /// `DAT_INVALID_STATE_EP_TENTCONNPENDING`
    InvalidStateEpTentconnpending = 50,
    /// `DAT_INVALID_STATE_EP_CONNECTED`
    InvalidStateEpConnected = 51,
    /// `DAT_INVALID_STATE_EP_DISCONNECTED`
    InvalidStateEpDisconnected = 52,
    /// `DAT_INVALID_STATE_EP_RESERVED`
    InvalidStateEpReserved = 53,
    /// `DAT_INVALID_STATE_EP_COMPLPENDING`
    InvalidStateEpComplpending = 54,
    /// `DAT_INVALID_STATE_EP_DISCPENDING`
    InvalidStateEpDiscpending = 55,
    /// `DAT_INVALID_STATE_EP_PROVIDERCONTROL`
    InvalidStateEpProvidercontrol = 56,
    /// `DAT_INVALID_STATE_EP_NOTREADY`
    InvalidStateEpNotready = 57,
    /// `DAT_INVALID_STATE_EP_RECV_WATERMARK`
    InvalidStateEpRecvWatermark = 58,
    /// `DAT_INVALID_STATE_EP_PZ`
    InvalidStateEpPz = 59,
    /// `DAT_INVALID_STATE_EP_EVD_REQUEST`
    InvalidStateEpEvdRequest = 60,
    /// `DAT_INVALID_STATE_EP_EVD_RECV`
    InvalidStateEpEvdRecv = 61,
    /// `DAT_INVALID_STATE_EP_EVD_CONNECT`
    InvalidStateEpEvdConnect = 62,
    /// `DAT_INVALID_STATE_EP_UNCONFIGURED`
    InvalidStateEpUnconfigured = 63,
    /// `DAT_INVALID_STATE_EP_UNCONFRESERVED`
    InvalidStateEpUnconfreserved = 64,
    /// `DAT_INVALID_STATE_EP_UNCONFPASSIVE`
    InvalidStateEpUnconfpassive = 65,
    /// `DAT_INVALID_STATE_EP_UNCONFTENTATIVE`
    InvalidStateEpUnconftentative = 66,
    /// `DAT_INVALID_STATE_CNO_IN_USE`
    InvalidStateCnoInUse = 67,
    /// `DAT_INVALID_STATE_CNO_DEAD`
    InvalidStateCnoDead = 68,
    /// `DAT_INVALID_STATE_EVD_OPEN`
    InvalidStateEvdOpen = 69,
    /// `DAT_INVALID_STATE_EVD_ENABLED`
    InvalidStateEvdEnabled = 70,
    /// `DAT_INVALID_STATE_EVD_DISABLED`
    InvalidStateEvdDisabled = 71,
    /// `DAT_INVALID_STATE_EVD_WAITABLE`
    InvalidStateEvdWaitable = 72,
    /// `DAT_INVALID_STATE_EVD_UNWAITABLE`
    InvalidStateEvdUnwaitable = 73,
    /// `DAT_INVALID_STATE_EVD_IN_USE`
    InvalidStateEvdInUse = 74,
    /// `DAT_INVALID_STATE_EVD_CONFIG_NOTIFY`
    InvalidStateEvdConfigNotify = 75,
    /// `DAT_INVALID_STATE_EVD_CONFIG_SOLICITED`
    InvalidStateEvdConfigSolicited = 76,
    /// `DAT_INVALID_STATE_EVD_CONFIG_THRESHOLD`
    InvalidStateEvdConfigThreshold = 77,
    /// `DAT_INVALID_STATE_EVD_WAITER`
    InvalidStateEvdWaiter = 78,
    /// `DAT_INVALID_STATE_EVD_ASYNC`
    InvalidStateEvdAsync = 79,
    /// `DAT_INVALID_STATE_IA_IN_USE`
    InvalidStateIaInUse = 80,
    /// `DAT_INVALID_STATE_LMR_IN_USE`
    InvalidStateLmrInUse = 81,
    /// `DAT_INVALID_STATE_LMR_FREE`
    InvalidStateLmrFree = 82,
    /// `DAT_INVALID_STATE_PZ_IN_USE`
    InvalidStatePzInUse = 83,
    /// `DAT_INVALID_STATE_PZ_FREE`
    InvalidStatePzFree = 84,
    /// `DAT_INVALID_STATE_SRQ_OPERATIONAL`
    InvalidStateSrqOperational = 85,
    /// `DAT_INVALID_STATE_SRQ_ERROR`
    InvalidStateSrqError = 86,
    /// `DAT_INVALID_STATE_SRQ_IN_USE`
    InvalidStateSrqInUse = 87,
    /// `DAT_INVALID_STATE_SRQ_SHUTDOWN`
    InvalidStateSrqShutdown = 88,
    /// `DAT_PRIVILEGES_READ`
    PrivilegesRead = 89,
    /// `DAT_PRIVILEGES_WRITE`
    PrivilegesWrite = 90,
    /// `DAT_PRIVILEGES_RDMA_READ`
    PrivilegesRdmaRead = 91,
    /// `DAT_PRIVILEGES_RDMA_WRITE`
    PrivilegesRdmaWrite = 92,
    /// `DAT_PROTECTION_READ`
    ProtectionRead = 93,
    /// `DAT_PROTECTION_WRITE`
    ProtectionWrite = 94,
    /// `DAT_PROTECTION_RDMA_READ`
    ProtectionRdmaRead = 95,
    /// `DAT_PROTECTION_RDMA_WRITE`
    ProtectionRdmaWrite = 96,
    /// `DAT_INVALID_ADDRESS_UNSUPPORTED`
    InvalidAddressUnsupported = 97,
    /// `DAT_INVALID_ADDRESS_UNREACHABLE`
    InvalidAddressUnreachable = 98,
    /// `DAT_INVALID_ADDRESS_MALFORMED`
    InvalidAddressMalformed = 99,
    /// `DAT_NAME_NOT_REGISTERED`
    NameNotRegistered = 100,
    /// `DAT_MAJOR_NOT_FOUND`
    MajorNotFound = 101,
    /// `DAT_MINOR_NOT_FOUND`
    MinorNotFound = 102,
    /// `DAT_THREAD_SAFETY_NOT_FOUND`
    ThreadSafetyNotFound = 103,
}

impl Subtype {
    /// The subtype whose value is `v`.
    pub fn from_u16(v: u16) -> Option<Subtype> {
        if v <= Subtype::ThreadSafetyNotFound as u16 {
            // Values are dense from 0 to the last variant.
            Some(SUBTYPE_TABLE[v as usize])
        } else {
            None
        }
    }

    /// `DAT_INVALID_ARGn` for argument position `n` (1-based, 1..=10).
    pub fn invalid_arg(n: u8) -> Subtype {
        let n = n.clamp(1, 10) as u16;
        Subtype::from_u16(Subtype::InvalidArg1 as u16 + n - 1).unwrap_or(Subtype::InvalidArg1)
    }
}

/// A typed rdapl error. Each variant maps to one DAT type and subtype
/// ([`Error::dat_return`]).
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The object the call waited on was closed or destroyed (`DAT_ABORT`).
    #[error("operation aborted: {0}")]
    Abort(&'static str),
    /// A connection qualifier is already bound (`DAT_CONN_QUAL_IN_USE`).
    #[error("connection qualifier {0} is already in use")]
    ConnQualInUse(u64),
    /// A resource limit was hit (`DAT_INSUFFICIENT_RESOURCES | resource`).
    #[error("insufficient resources ({resource:?}): {what}")]
    InsufficientResources {
        /// One of the `DAT_RESOURCE_*` subtypes.
        resource: Subtype,
        /// What ran out.
        what: &'static str,
    },
    /// The provider detected an internal inconsistency (`DAT_INTERNAL_ERROR`).
    #[error("provider internal error: {0}")]
    Internal(String),
    /// The handle does not name a live object (`DAT_INVALID_HANDLE | kind`).
    #[error("invalid handle ({0:?})")]
    InvalidHandle(Subtype),
    /// An argument is out of range (`DAT_INVALID_PARAMETER | DAT_INVALID_ARGn`).
    #[error("invalid parameter {arg}: {what}")]
    InvalidParameter {
        /// 1-based argument position, as in the DAT prototype.
        arg: u8,
        /// What is wrong with it.
        what: &'static str,
    },
    /// The object is not in a state that allows the call (`DAT_INVALID_STATE | state`).
    #[error("invalid state ({state:?}): {what}")]
    InvalidState {
        /// One of the `DAT_INVALID_STATE_*` subtypes (or `NoSubtype`).
        state: Subtype,
        /// Why the call was refused.
        what: &'static str,
    },
    /// Strict re-enable refused: events are still queued, upcalls stay
    /// disabled and the caller keeps polling (`DAT_INVALID_STATE |
    /// DAT_INVALID_STATE_EVD_IN_USE`; the kDAPL 2005 patch returned `-EBUSY`).
    #[error("upcalls not enabled: {pending} event(s) still queued")]
    Busy {
        /// Events queued at the moment of the atomic check.
        pending: usize,
    },
    /// A length does not fit (`DAT_LENGTH_ERROR`).
    #[error("length error: {0}")]
    Length(&'static str),
    /// The call asks for a model the provider does not offer (`DAT_MODEL_NOT_SUPPORTED`).
    #[error("model not supported: {0}")]
    ModelNotSupported(&'static str),
    /// No provider of that name is registered (`DAT_PROVIDER_NOT_FOUND`).
    #[error("provider {0:?} not found")]
    ProviderNotFound(String),
    /// Memory access without the needed privilege (`DAT_PRIVILEGES_VIOLATION | kind`).
    #[error("privileges violation ({0:?})")]
    PrivilegesViolation(Subtype),
    /// Protection zone or key mismatch (`DAT_PROTECTION_VIOLATION | kind`).
    #[error("protection violation ({0:?})")]
    ProtectionViolation(Subtype),
    /// Nothing to dequeue (`DAT_QUEUE_EMPTY`). Also a CNO wait that timed out.
    #[error("queue empty")]
    QueueEmpty,
    /// The queue cannot take another entry (`DAT_QUEUE_FULL`).
    #[error("queue full")]
    QueueFull,
    /// A wait ran out of time (`DAT_TIMEOUT_EXPIRED`); `nmore` is the queue
    /// depth seen when it gave up.
    #[error("timeout expired ({nmore} event(s) queued)")]
    TimeoutExpired {
        /// Events queued when the wait gave up.
        nmore: usize,
    },
    /// The address is unusable (`DAT_INVALID_ADDRESS | kind`).
    #[error("invalid address ({0:?})")]
    InvalidAddress(Subtype),
    /// A blocking call was interrupted (`DAT_INTERRUPTED_CALL`).
    #[error("interrupted call")]
    InterruptedCall,
    /// No connection qualifier could be allocated (`DAT_CONN_QUAL_UNAVAILABLE`).
    #[error("no connection qualifier available")]
    ConnQualUnavailable,
    /// The feature is not implemented by this provider (`DAT_NOT_IMPLEMENTED`).
    #[error("not implemented: {0}")]
    NotImplemented(&'static str),
}

impl Error {
    /// The `DAT_RETURN` for this error: class error, its type and subtype.
    pub fn dat_return(&self) -> DatReturn {
        let (ty, sub) = match self {
            Error::Abort(_) => (DatType::Abort, Subtype::NoSubtype),
            Error::ConnQualInUse(_) => (DatType::ConnQualInUse, Subtype::NoSubtype),
            Error::InsufficientResources { resource, .. } => {
                (DatType::InsufficientResources, *resource)
            }
            Error::Internal(_) => (DatType::InternalError, Subtype::NoSubtype),
            Error::InvalidHandle(s) => (DatType::InvalidHandle, *s),
            Error::InvalidParameter { arg, .. } => {
                (DatType::InvalidParameter, Subtype::invalid_arg(*arg))
            }
            Error::InvalidState { state, .. } => (DatType::InvalidState, *state),
            Error::Busy { .. } => (DatType::InvalidState, Subtype::InvalidStateEvdInUse),
            Error::Length(_) => (DatType::LengthError, Subtype::NoSubtype),
            Error::ModelNotSupported(_) => (DatType::ModelNotSupported, Subtype::NoSubtype),
            Error::ProviderNotFound(_) => (DatType::ProviderNotFound, Subtype::NameNotRegistered),
            Error::PrivilegesViolation(s) => (DatType::PrivilegesViolation, *s),
            Error::ProtectionViolation(s) => (DatType::ProtectionViolation, *s),
            Error::QueueEmpty => (DatType::QueueEmpty, Subtype::NoSubtype),
            Error::QueueFull => (DatType::QueueFull, Subtype::NoSubtype),
            Error::TimeoutExpired { .. } => (DatType::TimeoutExpired, Subtype::NoSubtype),
            Error::InvalidAddress(s) => (DatType::InvalidAddress, *s),
            Error::InterruptedCall => (DatType::InterruptedCall, Subtype::NoSubtype),
            Error::ConnQualUnavailable => (DatType::ConnQualUnavailable, Subtype::NoSubtype),
            Error::NotImplemented(_) => (DatType::NotImplemented, Subtype::NoSubtype),
        };
        DatReturn::error(ty, sub)
    }

    /// Shorthand for an `InvalidParameter` error.
    pub fn param(arg: u8, what: &'static str) -> Error {
        Error::InvalidParameter { arg, what }
    }

    /// Shorthand for an `InvalidState` error.
    pub(crate) fn state(state: Subtype, what: &'static str) -> Error {
        Error::InvalidState { state, what }
    }
}

/// `Result` with an rdapl [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

const SUBTYPE_TABLE: [Subtype; 104] = [
    Subtype::NoSubtype,
    Subtype::SubInterrupted,
    Subtype::ResourceMemory,
    Subtype::ResourceDevice,
    Subtype::ResourceTep,
    Subtype::ResourceTevd,
    Subtype::ResourceProtectionDomain,
    Subtype::ResourceMemoryRegion,
    Subtype::ResourceErrorHandler,
    Subtype::ResourceCredits,
    Subtype::ResourceSrq,
    Subtype::InvalidHandleIa,
    Subtype::InvalidHandleEp,
    Subtype::InvalidHandleLmr,
    Subtype::InvalidHandleRmr,
    Subtype::InvalidHandlePz,
    Subtype::InvalidHandlePsp,
    Subtype::InvalidHandleRsp,
    Subtype::InvalidHandleCr,
    Subtype::InvalidHandleCno,
    Subtype::InvalidHandleEvdCr,
    Subtype::InvalidHandleEvdRequest,
    Subtype::InvalidHandleEvdRecv,
    Subtype::InvalidHandleEvdConn,
    Subtype::InvalidHandleEvdAsync,
    Subtype::InvalidHandleSrq,
    Subtype::InvalidHandleCsp,
    Subtype::InvalidHandle1,
    Subtype::InvalidHandle2,
    Subtype::InvalidHandle3,
    Subtype::InvalidHandle4,
    Subtype::InvalidHandle5,
    Subtype::InvalidHandle6,
    Subtype::InvalidHandle7,
    Subtype::InvalidHandle8,
    Subtype::InvalidHandle9,
    Subtype::InvalidHandle10,
    Subtype::InvalidArg1,
    Subtype::InvalidArg2,
    Subtype::InvalidArg3,
    Subtype::InvalidArg4,
    Subtype::InvalidArg5,
    Subtype::InvalidArg6,
    Subtype::InvalidArg7,
    Subtype::InvalidArg8,
    Subtype::InvalidArg9,
    Subtype::InvalidArg10,
    Subtype::InvalidStateEpUnconnected,
    Subtype::InvalidStateEpActconnpending,
    Subtype::InvalidStateEpPassconnpending,
    Subtype::InvalidStateEpTentconnpending,
    Subtype::InvalidStateEpConnected,
    Subtype::InvalidStateEpDisconnected,
    Subtype::InvalidStateEpReserved,
    Subtype::InvalidStateEpComplpending,
    Subtype::InvalidStateEpDiscpending,
    Subtype::InvalidStateEpProvidercontrol,
    Subtype::InvalidStateEpNotready,
    Subtype::InvalidStateEpRecvWatermark,
    Subtype::InvalidStateEpPz,
    Subtype::InvalidStateEpEvdRequest,
    Subtype::InvalidStateEpEvdRecv,
    Subtype::InvalidStateEpEvdConnect,
    Subtype::InvalidStateEpUnconfigured,
    Subtype::InvalidStateEpUnconfreserved,
    Subtype::InvalidStateEpUnconfpassive,
    Subtype::InvalidStateEpUnconftentative,
    Subtype::InvalidStateCnoInUse,
    Subtype::InvalidStateCnoDead,
    Subtype::InvalidStateEvdOpen,
    Subtype::InvalidStateEvdEnabled,
    Subtype::InvalidStateEvdDisabled,
    Subtype::InvalidStateEvdWaitable,
    Subtype::InvalidStateEvdUnwaitable,
    Subtype::InvalidStateEvdInUse,
    Subtype::InvalidStateEvdConfigNotify,
    Subtype::InvalidStateEvdConfigSolicited,
    Subtype::InvalidStateEvdConfigThreshold,
    Subtype::InvalidStateEvdWaiter,
    Subtype::InvalidStateEvdAsync,
    Subtype::InvalidStateIaInUse,
    Subtype::InvalidStateLmrInUse,
    Subtype::InvalidStateLmrFree,
    Subtype::InvalidStatePzInUse,
    Subtype::InvalidStatePzFree,
    Subtype::InvalidStateSrqOperational,
    Subtype::InvalidStateSrqError,
    Subtype::InvalidStateSrqInUse,
    Subtype::InvalidStateSrqShutdown,
    Subtype::PrivilegesRead,
    Subtype::PrivilegesWrite,
    Subtype::PrivilegesRdmaRead,
    Subtype::PrivilegesRdmaWrite,
    Subtype::ProtectionRead,
    Subtype::ProtectionWrite,
    Subtype::ProtectionRdmaRead,
    Subtype::ProtectionRdmaWrite,
    Subtype::InvalidAddressUnsupported,
    Subtype::InvalidAddressUnreachable,
    Subtype::InvalidAddressMalformed,
    Subtype::NameNotRegistered,
    Subtype::MajorNotFound,
    Subtype::MinorNotFound,
    Subtype::ThreadSafetyNotFound,
];
