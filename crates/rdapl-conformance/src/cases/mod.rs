//! The cases, one module per concern (each was a test file of the `rdapl`
//! crate before the suite had a crate of its own).

mod api_ergonomics;
mod defects_cm;
mod defects_evd;
mod defects_mem;
mod defects_overflow;
mod defects_zero_length;
mod event_context;
mod loopback_basic;
mod loopback_buf;
mod loopback_wakeup;
mod model_dto;
mod model_ep;
mod model_ia_mem;
mod model_proptest;
mod objects_api;
mod provider_lifecycle;
mod provider_public;
mod recv_repost;
mod send_invalidate;
