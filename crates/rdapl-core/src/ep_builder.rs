//! Named endpoint attributes: [`EpBuilder`], from [`crate::Ia::ep_builder`].
//!
//! `dat_ep_create` takes three EVDs by position, all optional and of one
//! type, easy to swap; the builder names each one. It creates the endpoint
//! with the same checks as [`crate::Ia::ep_create`].

use crate::Result;
use crate::ep::{Ep, EpAttr};
use crate::error::{Error, Subtype};
use crate::evd::Evd;
use crate::ia::Ia;
use crate::pz::Pz;
use crate::srq::Srq;

/// Builds an endpoint of one IA and protection zone.
#[derive(Debug)]
#[must_use = "an EpBuilder does nothing until `create`"]
pub struct EpBuilder<'a> {
    ia: &'a Ia,
    pz: &'a Pz,
    recv_evd: Option<&'a Evd>,
    request_evd: Option<&'a Evd>,
    connect_evd: Option<&'a Evd>,
    srq: Option<&'a Srq>,
    attr: Option<EpAttr>,
}

impl<'a> EpBuilder<'a> {
    pub(crate) fn new(ia: &'a Ia, pz: &'a Pz) -> EpBuilder<'a> {
        EpBuilder {
            ia,
            pz,
            recv_evd: None,
            request_evd: None,
            connect_evd: None,
            srq: None,
            attr: None,
        }
    }

    /// Where receive completions go.
    pub fn recv_evd(mut self, evd: &'a Evd) -> Self {
        self.recv_evd = Some(evd);
        self
    }

    /// Where send, RDMA and memory-operation completions go.
    pub fn request_evd(mut self, evd: &'a Evd) -> Self {
        self.request_evd = Some(evd);
        self
    }

    /// Where connection events go.
    pub fn connect_evd(mut self, evd: &'a Evd) -> Self {
        self.connect_evd = Some(evd);
        self
    }

    /// One EVD for receive and request completions and connection events
    /// (it must accept both streams).
    pub fn evd(self, evd: &'a Evd) -> Self {
        self.recv_evd(evd).request_evd(evd).connect_evd(evd)
    }

    /// Receives come from this shared receive queue
    /// (`dat_ep_create_with_srq`); a receive EVD is then required.
    pub fn srq(mut self, srq: &'a Srq) -> Self {
        self.srq = Some(srq);
        self
    }

    /// Endpoint attributes (default: [`EpAttr::default`]).
    pub fn attr(mut self, attr: EpAttr) -> Self {
        self.attr = Some(attr);
        self
    }

    /// Creates the endpoint. An SRQ without a receive EVD is refused with
    /// `InvalidHandle(EvdRecv)`; every other check is `ep_create`'s.
    pub fn create(self) -> Result<Ep> {
        match self.srq {
            Some(srq) => {
                let recv = self
                    .recv_evd
                    .ok_or(Error::InvalidHandle(Subtype::InvalidHandleEvdRecv))?;
                self.ia.ep_create_with_srq(
                    self.pz,
                    recv,
                    self.request_evd,
                    self.connect_evd,
                    srq,
                    self.attr,
                )
            }
            None => self.ia.ep_create(
                self.pz,
                self.recv_evd,
                self.request_evd,
                self.connect_evd,
                self.attr,
            ),
        }
    }
}
