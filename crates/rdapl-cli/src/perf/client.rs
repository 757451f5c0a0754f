//! The client: connects, runs each size of the test against the server
//! and measures it, as `fi_pingpong` reports.

use super::side::{read_offer, write_pingpong};
use super::*;

pub(super) fn client_run(test: Test, o: &PerfOptions) -> Result<Vec<Row>, String> {
    let max = o.sizes.iter().copied().max().unwrap_or(CONTROL);
    // A pingpong of Writes needs a region of the client's own too.
    let target = usize::from(test == Test::PingPong && o.op == Op::Write);
    let c = Side::open(o, max, target)?;
    let rows = client_session(test, o, &c);
    // Ended either way, so that a server waiting on this client (on a
    // thread of this process, with loopback) sees it go at once.
    let _ = c.ep.disconnect(rows.is_ok());
    let _ = c.ep.free();
    let _ = c.ia.close(CloseFlags::Abrupt);
    rows
}

/// A connected client's run of every size.
fn client_session(test: Test, o: &PerfOptions, c: &Side) -> Result<Vec<Row>, String> {
    for i in 0..=c.window {
        c.post_recv(i)?;
    }
    let remote = o.remote.ok_or("no server address")?;
    c.ep.connect(remote, o.qual, Some(o.timeout), &c.offer()?)
        .map_err(|e| format!("connecting: {e}"))?;
    // The provider's verdict on the connect comes at its timeout at the
    // latest: wait a little longer for it, so that it is what is said.
    let verdict = o.timeout.saturating_add(Duration::from_secs(5));
    let offer = loop {
        match c.next_within(verdict)? {
            Event::Connection(e) if e.kind == ConnectionEventKind::Established => {
                break read_offer(e.private_data.as_deref());
            }
            Event::Connection(e) => {
                return Err(format!(
                    "connecting to {remote} on {}: {:?}{}",
                    o.qual,
                    e.kind,
                    connect_hint(e.kind, o.addr, remote)
                ));
            }
            // A failed attempt flushes the receives first, then says why.
            Event::Dto(d) if d.status == DtoStatus::Flushed => {}
            other => return Err(format!("expected Established, got {other:?}")),
        }
    };
    let mut rows = Vec::new();
    // bw stamps a message's bytes only where no send in flight shares its
    // buffer; pingpong always (one message in flight).
    let stamped = test == Test::PingPong || c.sends_distinct();
    let window = if test == Test::Bw { c.window } else { 1 };
    for &size in &o.sizes {
        let slots = match (o.op, offer) {
            (Op::Send, _) => 0,
            (_, None) => {
                return Err("the server offers no region for RDMA (an older rdapl?)".into());
            }
            // Every piece's address is the region's plus less than its
            // length: a region that wraps past the end of the address
            // space would overflow it.
            (_, Some(t)) if t.target_address.checked_add(t.segment_length).is_none() => {
                return Err(format!(
                    "the server's RDMA region ({} bytes at {:#x}) wraps past the end of the \
                     address space",
                    t.segment_length, t.target_address
                ));
            }
            (_, Some(t)) => match window.min((t.segment_length / size as u64) as usize) {
                0 => {
                    return Err(format!(
                        "the server's RDMA region ({} bytes) is smaller than a {size}-byte message",
                        t.segment_length
                    ));
                }
                n => n,
            },
        };
        let ctl = Control {
            test,
            op: o.op,
            stamped,
            size,
            count: o.iters,
            slots,
        };
        c.exchange_control(ctl)?;
        let t0 = Instant::now();
        let acked = match (test, o.op, offer) {
            (Test::PingPong, Op::Write, Some(t)) => {
                if let Some((_, len)) = write_pingpong(c, &ctl, t, true)? {
                    // The server sends nothing of its own before the
                    // closing control message's echo.
                    return Err(format!(
                        "a {len}-byte message of the server during the pingpong of Writes"
                    ));
                }
                c.exchange_control(ctl)?;
                o.iters
            }
            (_, Op::Write | Op::Read, Some(t)) => {
                rdma_phase(c, &ctl, t, window)?;
                if test == Test::PingPong { o.iters } else { 1 }
            }
            (Test::PingPong, _, _) => {
                for seq in 0..o.iters {
                    c.stamp(0, size, seq as u64)?;
                    c.post_send(0, size, seq as u64)?;
                    let (i, len) = c.next_recv()?.ok_or("the server went away")?;
                    if len != size {
                        return Err(format!("echo {seq}: {len} bytes, expected {size}"));
                    }
                    c.check(i, len, seq as u64)?;
                    c.post_recv(i)?;
                }
                o.iters
            }
            (Test::Bw, _, _) => {
                // The window refilled with what one look at the EVD freed,
                // posted as one batch (`Ep::post_batch`).
                let (mut in_flight, mut seq) = (0, 0);
                while seq < o.iters {
                    if in_flight == c.window {
                        c.sends_done(1)?;
                        in_flight -= 1 + c.more_done(|ev| match ev {
                            Event::Dto(d)
                                if d.operation == DtoOp::Send && d.status == DtoStatus::Success =>
                            {
                                Ok(())
                            }
                            other => Err(format!("expected a send completion, got {other:?}")),
                        })?;
                    }
                    let n = (c.window - in_flight).min(o.iters - seq);
                    c.ep.post_batch(|b| {
                        for seq in seq..seq + n {
                            if stamped {
                                c.stamp(seq, size, seq as u64)?;
                            }
                            let t = c
                                .send
                                .triplet(c.send_off(seq) as u64, size as u64)
                                .map_err(|e| e.to_string())?;
                            b.post_send(&[t], seq as u64, CompletionFlags::DEFAULT)
                                .map_err(|e| format!("posting a send: {e}"))?;
                        }
                        Ok::<_, String>(())
                    })?;
                    in_flight += n;
                    seq += n;
                }
                // The last sends' completions and the server's
                // acknowledgement, in either order (a provider may complete
                // a send only once the peer confirmed it).
                let mut acked = None;
                while in_flight > 0 || acked.is_none() {
                    match c.next()? {
                        Event::Dto(d)
                            if d.operation == DtoOp::Send && d.status == DtoStatus::Success =>
                        {
                            in_flight = in_flight.checked_sub(1).ok_or("a send too many")?;
                        }
                        Event::Dto(d)
                            if d.operation == DtoOp::Receive
                                && d.status == DtoStatus::Success
                                && acked.is_none() =>
                        {
                            let (i, len) = (d.cookie as usize, d.transferred_length as usize);
                            if c.read_control(i, len)? != ctl {
                                return Err("the server's acknowledgement did not match".into());
                            }
                            c.post_recv(i)?;
                            acked = Some(());
                        }
                        other => return Err(format!("during bw: {other:?}")),
                    }
                }
                1
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        let ways = if test == Test::PingPong && o.op != Op::Read {
            2
        } else {
            1
        };
        rows.push(Row {
            bytes: size,
            sent: o.iters,
            acked,
            secs,
            ways,
        });
    }
    Ok(rows)
}

/// The client's RDMA phase of `ctl` against the server's region `t`:
/// `window` operations in flight, message `seq` from or into send slot
/// `seq` and piece `seq % slots` of the region; then the closing control
/// message, which the server echoes once it has checked.
fn rdma_phase(c: &Side, ctl: &Control, t: RmrTriplet, window: usize) -> Result<(), String> {
    let size = ctl.size;
    // A Read is checked where it has a buffer of its own until it is read.
    let checked = ctl.op == Op::Read && c.send_slots >= window;
    // The window refilled with what one look at the EVD freed, posted as
    // one batch, as `bw` does with Sends.
    let (mut in_flight, mut seq) = (0, 0);
    while seq < ctl.count {
        if in_flight == window {
            c.rdma_done(ctl, checked)?;
            in_flight -= 1 + c.more_done(|ev| c.rdma_check(ev, ctl, checked).map(|_| ()))?;
        }
        let n = (window - in_flight).min(ctl.count - seq);
        c.ep.post_batch(|b| {
            for seq in seq..seq + n {
                let local = c
                    .send
                    .triplet(c.send_off(seq) as u64, size as u64)
                    .map_err(|e| e.to_string())?;
                let remote = RmrTriplet {
                    target_address: t.target_address + ((seq % ctl.slots) * size) as u64,
                    segment_length: size as u64,
                    ..t
                };
                let cookie = seq as u64;
                let posted = if ctl.op == Op::Write {
                    if ctl.stamped {
                        c.stamp(seq, size, cookie)?;
                    }
                    b.post_rdma_write(&[local], remote, cookie, CompletionFlags::DEFAULT)
                } else {
                    b.post_rdma_read(&[local], remote, cookie, CompletionFlags::DEFAULT)
                };
                posted.map_err(|e| format!("posting RDMA operation {seq}: {e}"))?;
            }
            Ok::<_, String>(())
        })?;
        in_flight += n;
        seq += n;
    }
    for _ in 0..in_flight {
        c.rdma_done(ctl, checked)?;
    }
    c.exchange_control(*ctl)
}

/// What the user can do about a connect that failed with `kind` from
/// `local` to `remote`, where the cause is likely theirs.
fn connect_hint(kind: ConnectionEventKind, local: IpAddr, remote: IpAddr) -> &'static str {
    match kind {
        ConnectionEventKind::Unreachable if local.is_loopback() && !remote.is_loopback() => {
            " (this side's address is a loopback one, which reaches this host only: \
             -a 0.0.0.0, -a ::, or an address of this host's)"
        }
        ConnectionEventKind::NonPeerRejected if !remote.is_loopback() => {
            " (nothing listens there: a server for other hosts needs -a 0.0.0.0, -a ::, \
             or its own address; its default, 127.0.0.1, serves this host only)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_connect_says_what_to_do_where_the_cause_is_the_users() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let k = ConnectionEventKind::Unreachable;
        assert!(connect_hint(k, ip("127.0.0.1"), ip("192.0.2.7")).contains("-a 0.0.0.0"));
        assert_eq!(connect_hint(k, ip("0.0.0.0"), ip("192.0.2.7")), "");
        let k = ConnectionEventKind::NonPeerRejected;
        assert!(connect_hint(k, ip("0.0.0.0"), ip("192.0.2.7")).contains("serves this host only"));
        assert_eq!(connect_hint(k, ip("127.0.0.1"), ip("127.0.0.1")), "");
        let k = ConnectionEventKind::TimedOut;
        assert_eq!(connect_hint(k, ip("127.0.0.1"), ip("192.0.2.7")), "");
    }
}
