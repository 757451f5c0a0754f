//! The demo's phases in order: connect with private data, messages both
//! ways, RDMA write and read back, disconnect, teardown. Each phase
//! checks every completion and byte and bounds every wait.

use super::*;

/// One blocking `wait` (threshold 1, bounded), counted.
fn wait_one(evd: &Evd, what: &str, s: &mut DemoSummary) -> Result<Event, String> {
    let (ev, _left) = evd
        .wait(Some(WAIT_TIMEOUT), 1)
        .ctx(&format!("waiting for {what}"))?;
    s.consumed_by_wait += 1;
    s.waited.push(what.to_string());
    Ok(ev)
}

/// Waits for a connection event of `kind` on `evd` for endpoint `ep`.
/// Returns its private data.
fn wait_connection(
    evd: &Evd,
    ep: EpHandle,
    kind: ConnectionEventKind,
    what: &str,
    s: &mut DemoSummary,
) -> Result<Option<Box<[u8]>>, String> {
    match wait_one(evd, what, s)? {
        Event::Connection(c) if c.kind == kind => {
            if c.ep != ep {
                s.error(format!("{what}: for endpoint {:?}, expected {ep:?}", c.ep));
            }
            Ok(c.private_data)
        }
        other => Err(format!("{what}: got {other:?} instead")),
    }
}

/// Waits for one DTO completion and checks it; returns the bytes it moved.
fn wait_dto(
    evd: &Evd,
    op: DtoOp,
    ep: EpHandle,
    cookie: u64,
    len: u64,
    what: &str,
    s: &mut DemoSummary,
) -> Result<u64, String> {
    match wait_one(evd, what, s)? {
        Event::Dto(d) => {
            if let Some(bad) = check_dto(&d, op, ep, cookie, len) {
                s.error(format!("{what}: {bad}"));
            }
            Ok(if d.status.is_success() {
                d.transferred_length
            } else {
                0
            })
        }
        other => Err(format!("{what}: got {other:?} instead")),
    }
}

pub(super) fn connect(
    sv: &Server,
    cl: &Client,
    s: &mut DemoSummary,
    log: &Log,
) -> Result<(), String> {
    let client_pd = format!("{CLIENT_GREETING}{CLIENT_ADDR}").into_bytes();
    let remote = sv
        .rdma_lmr
        .rmr_triplet(0, sv.rdma_lmr.region().map_or(0, |r| r.len() as u64))
        .ctx("server: RDMA LMR triplet")?;
    let server_pd = encode_accept(&remote);

    cl.ep
        .connect(SERVER_ADDR, sv.conn_qual, Some(WAIT_TIMEOUT), &client_pd)
        .ctx("client: connect")?;
    log.step(format_args!(
        "client {CLIENT_ADDR} connecting to {SERVER_ADDR} qualifier {}",
        sv.conn_qual
    ));

    // Server: the request, by wait.
    let arrival = match wait_one(&sv.cr_evd, "connection request (server)", s)? {
        Event::ConnectionRequest(a) => a,
        other => {
            return Err(format!(
                "server: expected a connection request, got {other:?}"
            ));
        }
    };
    if arrival.conn_qual != sv.conn_qual || arrival.sp != Some(sv.psp.handle()) {
        s.error(format!(
            "connection request names qualifier {} / {:?}, expected {} / {:?}",
            arrival.conn_qual,
            arrival.sp,
            sv.conn_qual,
            sv.psp.handle()
        ));
    }
    if arrival.truncated {
        s.error("the connection request's private data was truncated");
    }
    let cr = sv.ia.0.cr(arrival.cr).ctx("server: looking the CR up")?;
    s.client_private_data = cr.private_data().to_vec();
    if cr.private_data() != client_pd.as_slice() {
        s.error(format!(
            "server: request private data {} differs from what the client sent ({})",
            show_private(cr.private_data()),
            show_private(&client_pd)
        ));
    }
    if cr.remote_address() != CLIENT_ADDR {
        s.error(format!(
            "server: request comes from {}, expected {CLIENT_ADDR}",
            cr.remote_address()
        ));
    }
    cr.accept(&sv.ep, &server_pd).ctx("server: cr_accept")?;
    log.step(format_args!(
        "server accepted with {} bytes of private data",
        server_pd.len()
    ));

    wait_connection(
        &sv.conn_evd,
        sv.ep.handle(),
        ConnectionEventKind::Established,
        "Established (server)",
        s,
    )?;
    let got = wait_connection(
        &cl.conn_evd,
        cl.ep.handle(),
        ConnectionEventKind::Established,
        "Established (client)",
        s,
    )?
    .unwrap_or_default();
    s.established = true;
    s.server_private_data = got.to_vec();
    if *got != *server_pd {
        s.error(format!(
            "client: accept private data {} differs from what the server sent",
            show_private(&got)
        ));
    }
    match decode_accept(&got) {
        Some(t) if t.segment_length == remote.segment_length => s.remote_buffer = Some(t),
        Some(t) => {
            s.error(format!(
                "client: the remote buffer has {} bytes, expected {}",
                t.segment_length, remote.segment_length
            ));
            s.remote_buffer = Some(t);
        }
        None => s.error("client: the accept's private data does not carry an RMR triplet"),
    }
    let q = cl.ep.query().ctx("client: ep_query")?;
    if q.peer_private_data.as_deref() != Some(&got[..]) {
        s.error("client: ep_query's peer private data differs from the Established event's");
    }
    Ok(())
}

pub(super) fn messages(
    sv: &Server,
    cl: &Client,
    opts: &DemoOptions,
    s: &mut DemoSummary,
    log: &Log,
) -> Result<(), String> {
    let (n, size) = (opts.messages() as u64, opts.message_size());
    let check = Arc::new(SendCheck {
        ep: cl.ep.handle(),
        messages: n,
        size,
        tally: Mutex::new(Tally::default()),
        cv: Condvar::new(),
    });
    let poller = Poller::new(PollerConfig::default()).ctx("client: starting the poller")?;
    let handler = check.clone();
    let entry = poller
        .add(&cl.req_evd, move |ev| handler.handle(ev))
        .ctx("client: attaching the request EVD to the poller")?;

    let start = Instant::now();
    for i in 0..n {
        let t = cl
            .send_lmr
            .triplet(i * size as u64, size as u64)
            .ctx("client: send triplet")?;
        cl.ep
            .post_send(&[t], i, CompletionFlags::DEFAULT)
            .ctx(&format!("client: post_send #{i}"))?;
    }
    log.step(format_args!("client posted {n} sends of {size} bytes"));
    let deadline = Instant::now() + WAIT_TIMEOUT;
    let sends_done = wait_tally(&check.tally, &check.cv, n, deadline);
    let recvs_done = wait_tally(&sv.upcall.tally, &sv.upcall.cv, n, deadline);
    s.message_time = start.elapsed();

    // Back to plain polling for the RDMA phase: what the poller did not
    // handle stays queued on the EVD.
    let stats = entry.stats();
    entry
        .remove(&poller)
        .ctx("client: removing the request EVD from the poller")?;
    drop(poller);

    {
        let t = lock(&check.tally);
        s.consumed_by_poller = t.events;
        s.messages_sent = t.good;
        s.absorb(t.errors.kept.clone(), t.errors.dropped);
        if stats.events != t.events {
            s.error(format!(
                "poller counted {} events, its handler {}",
                stats.events, t.events
            ));
        }
    }
    {
        let t = lock(&sv.upcall.tally);
        s.consumed_by_upcall = t.events;
        s.messages_received = t.good;
        s.message_bytes_verified = t.bytes;
    }
    if !sends_done {
        return Err(format!(
            "client: only {} of {n} send completions within {WAIT_TIMEOUT:?}",
            s.consumed_by_poller
        ));
    }
    if !recvs_done {
        return Err(format!(
            "server: only {} of {n} receive completions within {WAIT_TIMEOUT:?}",
            s.consumed_by_upcall
        ));
    }
    log.step(format_args!(
        "{} sends seen by the poller, {} receives by the upcall",
        s.consumed_by_poller, s.consumed_by_upcall
    ));
    Ok(())
}

pub(super) fn rdma(
    sv: &Server,
    cl: &Client,
    opts: &DemoOptions,
    s: &mut DemoSummary,
    log: &Log,
) -> Result<(), String> {
    let size = opts.rdma_size();
    let remote = s
        .remote_buffer
        .ok_or("client: no remote buffer from the accept")?;
    let mut pattern = vec![0; size];
    fill_pattern(RDMA_SEED, &mut pattern);

    // Write the pattern into the server's LMR.
    let src = cl
        .pz
        .lmr_create_from(pattern.clone(), MemPriv::LOCAL_READ)
        .ctx("client: RDMA source LMR")?;
    let start = Instant::now();
    let written = rdma_op(cl, &src, DtoOp::RdmaWrite, remote, size, s);
    s.rdma_write_time = start.elapsed();
    let freed = src.free().ctx("client: freeing the RDMA source LMR");
    s.rdma_write_bytes = written?;
    freed?;
    let landed = sv.rdma_lmr.to_vec().ctx("server: reading the RDMA LMR")?;
    match first_mismatch(&landed[..size.min(landed.len())], &pattern) {
        None => s.rdma_write_verified = size as u64,
        Some(off) => s.error(format!(
            "RDMA write: the server's buffer differs from the written data at offset {off}"
        )),
    }
    log.step(format_args!(
        "RDMA write of {size} bytes checked on the server"
    ));

    // Read it back into a fresh, zero-filled LMR.
    let dst = cl
        .pz
        .lmr_create(
            Region::zeroed(size),
            MemPriv::LOCAL_WRITE | MemPriv::LOCAL_READ,
        )
        .ctx("client: RDMA read LMR")?;
    let start = Instant::now();
    let read = rdma_op(cl, &dst, DtoOp::RdmaRead, remote, size, s);
    s.rdma_read_time = start.elapsed();
    let back = read.and_then(|n| {
        s.rdma_read_bytes = n;
        dst.to_vec().ctx("client: reading the RDMA read LMR")
    });
    let freed = dst.free().ctx("client: freeing the RDMA read LMR");
    match first_mismatch(&back?, &pattern) {
        None => s.rdma_read_verified = size as u64,
        Some(off) => s.error(format!(
            "RDMA read: the data read back differs from the written data at offset {off}"
        )),
    }
    freed?;
    log.step(format_args!(
        "RDMA read of {size} bytes checked on the client"
    ));
    Ok(())
}

/// Posts one RDMA write or read of `size` bytes between `local` and
/// `remote` and consumes its completion by `wait`; returns the bytes moved.
fn rdma_op(
    cl: &Client,
    local: &Lmr,
    op: DtoOp,
    remote: RmrTriplet,
    size: usize,
    s: &mut DemoSummary,
) -> Result<u64, String> {
    let iov = [local
        .triplet(0, size as u64)
        .ctx("client: local RDMA triplet")?];
    let (cookie, what) = match op {
        DtoOp::RdmaWrite => {
            cl.ep
                .post_rdma_write(&iov, remote, RDMA_WRITE_COOKIE, CompletionFlags::DEFAULT)
                .ctx("client: post_rdma_write")?;
            (RDMA_WRITE_COOKIE, "RDMA write completion (client)")
        }
        _ => {
            cl.ep
                .post_rdma_read(&iov, remote, RDMA_READ_COOKIE, CompletionFlags::DEFAULT)
                .ctx("client: post_rdma_read")?;
            (RDMA_READ_COOKIE, "RDMA read completion (client)")
        }
    };
    wait_dto(
        &cl.req_evd,
        op,
        cl.ep.handle(),
        cookie,
        size as u64,
        what,
        s,
    )
}

pub(super) fn disconnect(
    sv: &Server,
    cl: &Client,
    s: &mut DemoSummary,
    log: &Log,
) -> Result<(), String> {
    cl.ep.disconnect(true).ctx("client: ep_disconnect")?;
    wait_connection(
        &cl.conn_evd,
        cl.ep.handle(),
        ConnectionEventKind::Disconnected,
        "Disconnected (client)",
        s,
    )?;
    s.client_disconnected = true;
    wait_connection(
        &sv.conn_evd,
        sv.ep.handle(),
        ConnectionEventKind::Disconnected,
        "Disconnected (server)",
        s,
    )?;
    s.server_disconnected = true;
    for (who, ep) in [("client", &cl.ep), ("server", &sv.ep)] {
        let st = ep.state();
        if st != EpState::Disconnected {
            s.error(format!(
                "{who}: endpoint in state {st:?} after the disconnect"
            ));
        }
    }
    log.step(format_args!("disconnected; both sides saw Disconnected"));
    Ok(())
}

/// Drains `evd` (bounded); every event found is an error.
fn expect_empty(evd: &Evd, what: &str, s: &mut DemoSummary) {
    for _ in 0..=MAX_ERRORS_KEPT {
        match evd.dequeue() {
            Ok(Some(ev)) => s.error(format!("stray event on the {what}: {ev:?}")),
            Ok(None) => return,
            Err(e) => {
                s.error(format!("dequeue on the {what}: {e}"));
                return;
            }
        }
    }
    s.error(format!("the {what} keeps producing events"));
}

/// Stops the upcall, audits every EVD and frees everything; the problems
/// found are recorded in `s`.
pub(super) fn teardown(sv: Server, cl: Client, s: &mut DemoSummary) {
    // No upcall may run past this point; what it saw is final.
    match sv
        .recv_evd
        .modify_upcall(UpcallPolicy::Teardown, None, ReEnable::OnNew)
    {
        Ok(_) => {}
        Err(e) => s.error(format!("server: receive EVD teardown: {e}")),
    }
    {
        let t = lock(&sv.upcall.tally);
        s.consumed_by_upcall = t.events;
        s.messages_received = t.good;
        s.message_bytes_verified = t.bytes;
        s.absorb(t.errors.kept.clone(), t.errors.dropped);
    }
    for (evd, what) in [
        (&sv.cr_evd, "server's CR EVD"),
        (&sv.conn_evd, "server's connection EVD"),
        (&sv.recv_evd, "server's receive EVD"),
        (sv.ia.0.async_evd(), "server's async EVD"),
        (&cl.conn_evd, "client's connection EVD"),
        (&cl.req_evd, "client's request EVD"),
        (cl.ia.0.async_evd(), "client's async EVD"),
    ] {
        expect_empty(evd, what, s);
    }

    let mut steps: Vec<(&str, rdapl::Result<()>)> = vec![
        ("client: ep_free", cl.ep.free()),
        ("server: ep_free", sv.ep.free()),
        ("server: psp_free", sv.psp.free()),
        ("client: send LMR free", cl.send_lmr.free()),
        ("server: receive LMR free", sv.recv_lmr.free()),
        ("server: RDMA LMR free", sv.rdma_lmr.free()),
    ];
    for (what, evd) in [
        ("client: request EVD free", &cl.req_evd),
        ("client: connection EVD free", &cl.conn_evd),
        ("server: receive EVD free", &sv.recv_evd),
        ("server: connection EVD free", &sv.conn_evd),
        ("server: CR EVD free", &sv.cr_evd),
    ] {
        steps.push((what, evd.free()));
    }
    steps.push(("client: pz_free", cl.pz.free()));
    steps.push(("server: pz_free", sv.pz.free()));
    steps.push((
        "client: ia_close(graceful)",
        cl.ia.0.close(CloseFlags::Graceful),
    ));
    steps.push((
        "server: ia_close(graceful)",
        sv.ia.0.close(CloseFlags::Graceful),
    ));
    for (what, r) in steps {
        if let Err(e) = r {
            s.error(format!("{what}: {e}"));
        }
    }
}
