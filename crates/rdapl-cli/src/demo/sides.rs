//! The demo's two sides: the server (its listener, receive upcall and
//! RDMA buffer) and the client (its poller handler), each on an IA of
//! its own, and the checks every completion goes through.

use super::*;

/// The server's `SingleInstance` upcall on its receive EVD: checks every
/// receive completion and the bytes it delivered.
pub(super) struct RecvUpcall {
    pub(super) ep: EpHandle,
    pub(super) lmr: Lmr,
    pub(super) messages: u64,
    pub(super) size: usize,
    /// The thread that posts the sends (an upcall must never run on it).
    pub(super) poster: ThreadId,
    /// Set while an upcall runs (two at once breaks `SingleInstance`).
    pub(super) busy: AtomicBool,
    pub(super) tally: Mutex<Tally>,
    pub(super) cv: Condvar,
}

impl Upcall for RecvUpcall {
    fn upcall(&self, _evd: &Evd, event: Option<Event>, _more_events: bool) {
        let overlapped = self.busy.swap(true, Ordering::SeqCst);
        let mut t = lock(&self.tally);
        if overlapped {
            t.errors
                .push("two receive upcalls ran at once under SingleInstance".into());
        }
        if thread::current().id() == self.poster {
            t.errors
                .push("a receive upcall ran on the posting thread".into());
        }
        match event {
            None => t
                .errors
                .push("a notify-only upcall (no event) under SingleInstance".into()),
            Some(Event::Dto(d)) => {
                t.events += 1;
                let i = t.events - 1;
                if let Some(bad) = check_dto(&d, DtoOp::Receive, self.ep, i, self.size as u64) {
                    t.errors.push(format!("receive completion #{i}: {bad}"));
                } else if i >= self.messages {
                    t.errors
                        .push(format!("receive completion #{i}: more than were posted"));
                } else {
                    let mut got = vec![0; self.size];
                    match self.lmr.read_at(i as usize * self.size, &mut got) {
                        Ok(()) => match first_mismatch(&got, &message(i, self.size)) {
                            None => {
                                t.good += 1;
                                t.bytes += self.size as u64;
                            }
                            Some(off) => t.errors.push(format!(
                                "message {i}: received bytes differ from the sent ones at offset {off}"
                            )),
                        },
                        Err(e) => t
                            .errors
                            .push(format!("message {i}: reading the receive buffer: {e}")),
                    }
                }
            }
            Some(other) => {
                t.events += 1;
                t.errors.push(format!(
                    "unexpected event on the server's receive EVD: {other:?}"
                ));
            }
        }
        drop(t);
        self.busy.store(false, Ordering::SeqCst);
        self.cv.notify_all();
    }
}

/// The client's send-completion checker, fed by the poller thread.
pub(super) struct SendCheck {
    pub(super) ep: EpHandle,
    pub(super) messages: u64,
    pub(super) size: usize,
    pub(super) tally: Mutex<Tally>,
    pub(super) cv: Condvar,
}

impl SendCheck {
    pub(super) fn handle(&self, event: Event) {
        let mut t = lock(&self.tally);
        t.events += 1;
        let i = t.events - 1;
        match event {
            Event::Dto(d) => {
                if let Some(bad) = check_dto(&d, DtoOp::Send, self.ep, i, self.size as u64) {
                    t.errors.push(format!("send completion #{i}: {bad}"));
                } else if i >= self.messages {
                    t.errors
                        .push(format!("send completion #{i}: more than were posted"));
                } else {
                    t.good += 1;
                }
            }
            other => t.errors.push(format!(
                "unexpected event on the client's request EVD: {other:?}"
            )),
        }
        drop(t);
        self.cv.notify_all();
    }
}

/// Checks a DTO completion's fields; returns the problems found.
pub(super) fn check_dto(
    d: &DtoCompletion,
    op: DtoOp,
    ep: EpHandle,
    cookie: u64,
    len: u64,
) -> Option<String> {
    let mut bad = Vec::new();
    if d.status != DtoStatus::Success {
        bad.push(format!("status {:?}", d.status));
    }
    if d.operation != op {
        bad.push(format!("operation {:?} (expected {op:?})", d.operation));
    }
    if d.ep != ep {
        bad.push(format!("endpoint {:?} (expected {ep:?})", d.ep));
    }
    if d.cookie != cookie {
        bad.push(format!("cookie {} (expected {cookie})", d.cookie));
    }
    if d.status == DtoStatus::Success && d.transferred_length != len {
        bad.push(format!(
            "transferred_length {} (expected {len})",
            d.transferred_length
        ));
    }
    (!bad.is_empty()).then(|| bad.join(", "))
}

/// Waits until `tally.events >= n` or `deadline`; true if reached.
pub(super) fn wait_tally(m: &Mutex<Tally>, cv: &Condvar, n: u64, deadline: Instant) -> bool {
    let mut t = lock(m);
    // Bounded: every pass either returns or sleeps until the deadline.
    loop {
        if t.events >= n {
            return true;
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        t = cv
            .wait_timeout(t, deadline - now)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

/// An IA closed abruptly when dropped unless it was closed already (so an
/// early error leaves nothing listening or connected).
pub(super) struct IaGuard(pub(super) Ia);

impl Drop for IaGuard {
    fn drop(&mut self) {
        let _ = self.0.close(CloseFlags::Abrupt);
    }
}

fn open_ia(addr: IpAddr) -> Result<IaGuard, String> {
    Ia::open_with(
        "loopback",
        IaOptions {
            params: format!("addr={addr}"),
            ..Default::default()
        },
    )
    .map(IaGuard)
    .ctx(&format!("opening a loopback IA at {addr}"))
}

pub(super) struct Server {
    pub(super) ia: IaGuard,
    pub(super) pz: Pz,
    pub(super) cr_evd: Evd,
    pub(super) conn_evd: Evd,
    pub(super) recv_evd: Evd,
    pub(super) ep: Ep,
    pub(super) recv_lmr: Lmr,
    pub(super) rdma_lmr: Lmr,
    pub(super) psp: Psp,
    pub(super) conn_qual: u64,
    pub(super) upcall: Arc<RecvUpcall>,
}

impl Server {
    pub(super) fn open(opts: &DemoOptions) -> Result<Server, String> {
        let (n, size, rdma) = (opts.messages(), opts.message_size(), opts.rdma_size());
        let ia = open_ia(SERVER_ADDR)?;
        let (attr, _) = ia.0.query().ctx("server: ia_query")?;
        opts.check_ia_limits(&attr)?;
        let pz = ia.0.pz_create().ctx("server: pz_create")?;
        let cr_evd = ia.0.evd_create(4, EvdFlags::CR).ctx("server: CR EVD")?;
        let conn_evd =
            ia.0.evd_create(4, EvdFlags::CONNECTION)
                .ctx("server: connection EVD")?;
        let recv_evd =
            ia.0.evd_create(n, EvdFlags::DTO)
                .ctx("server: receive EVD")?;
        let ep_attr = EpAttr {
            max_recv_dtos: n.max(EpAttr::default().max_recv_dtos),
            max_message_size: size as u64,
            max_rdma_size: rdma as u64,
            ..EpAttr::default()
        };
        let ep =
            ia.0.ep_create(&pz, Some(&recv_evd), None, Some(&conn_evd), Some(ep_attr))
                .ctx("server: ep_create")?;
        let recv_lmr = pz
            .lmr_create(
                Region::zeroed(n * size),
                MemPriv::LOCAL_WRITE | MemPriv::LOCAL_READ,
            )
            .ctx("server: receive LMR")?;
        let rdma_lmr = pz
            .lmr_create(
                Region::zeroed(rdma),
                MemPriv::LOCAL_READ
                    | MemPriv::LOCAL_WRITE
                    | MemPriv::REMOTE_WRITE
                    | MemPriv::REMOTE_READ,
            )
            .ctx("server: RDMA LMR")?;
        let upcall = Arc::new(RecvUpcall {
            ep: ep.handle(),
            lmr: recv_lmr.clone(),
            messages: n as u64,
            size,
            poster: thread::current().id(),
            busy: AtomicBool::new(false),
            tally: Mutex::new(Tally::default()),
            cv: Condvar::new(),
        });
        let up: Arc<dyn Upcall> = upcall.clone();
        recv_evd
            .modify_upcall(UpcallPolicy::SingleInstance, Some(up), ReEnable::Strict)
            .ctx("server: enabling the receive upcall")?;
        let mut psp = None;
        for q in BASE_CONN_QUAL..BASE_CONN_QUAL + CONN_QUAL_TRIES {
            match ia.0.psp_create(q, &cr_evd) {
                Ok(p) => {
                    psp = Some((p, q));
                    break;
                }
                Err(rdapl::Error::ConnQualInUse(_)) => continue,
                Err(e) => return Err(format!("server: psp_create({q}): {e}")),
            }
        }
        let (psp, conn_qual) = psp.ok_or_else(|| {
            format!(
                "server: connection qualifiers {BASE_CONN_QUAL}..{} are all in use",
                BASE_CONN_QUAL + CONN_QUAL_TRIES
            )
        })?;
        Ok(Server {
            ia,
            pz,
            cr_evd,
            conn_evd,
            recv_evd,
            ep,
            recv_lmr,
            rdma_lmr,
            psp,
            conn_qual,
            upcall,
        })
    }
}

pub(super) struct Client {
    pub(super) ia: IaGuard,
    pub(super) pz: Pz,
    pub(super) conn_evd: Evd,
    pub(super) req_evd: Evd,
    pub(super) ep: Ep,
    pub(super) send_lmr: Lmr,
}

impl Client {
    pub(super) fn open(opts: &DemoOptions) -> Result<Client, String> {
        let (n, size, rdma) = (opts.messages(), opts.message_size(), opts.rdma_size());
        let ia = open_ia(CLIENT_ADDR)?;
        let (attr, _) = ia.0.query().ctx("client: ia_query")?;
        opts.check_ia_limits(&attr)?;
        let pz = ia.0.pz_create().ctx("client: pz_create")?;
        let conn_evd =
            ia.0.evd_create(4, EvdFlags::CONNECTION)
                .ctx("client: connection EVD")?;
        // The sends, then the RDMA write and read.
        let req_evd =
            ia.0.evd_create(n + 4, EvdFlags::DTO)
                .ctx("client: request EVD")?;
        let ep_attr = EpAttr {
            max_request_dtos: n.max(EpAttr::default().max_request_dtos),
            max_message_size: size as u64,
            max_rdma_size: rdma as u64,
            ..EpAttr::default()
        };
        let ep =
            ia.0.ep_create(&pz, None, Some(&req_evd), Some(&conn_evd), Some(ep_attr))
                .ctx("client: ep_create")?;
        let mut all = Vec::with_capacity(n * size);
        for i in 0..n as u64 {
            all.extend_from_slice(&message(i, size));
        }
        let send_lmr = pz
            .lmr_create_from(all, MemPriv::LOCAL_READ)
            .ctx("client: send LMR")?;
        Ok(Client {
            ia,
            pz,
            conn_evd,
            req_evd,
            ep,
            send_lmr,
        })
    }
}
