//! The server (`-s`): listens on the qualifier and serves one client at
//! a time, echoing control messages and pingpong messages, acknowledging
//! `bw` windows, and offering a region for the RDMA phases.

use super::side::{check_at, read_offer, stamp_at, write_pingpong};
use super::*;

/// The number of the last of `count` messages that went to piece `j` of
/// `slots` (message `seq` goes to piece `seq % slots`); `None` if none did.
pub(super) fn last_to(j: usize, slots: usize, count: usize) -> Option<usize> {
    (j < count).then(|| j + (count - 1 - j) / slots * slots)
}

pub(super) fn serve(o: &PerfOptions) -> Result<(), String> {
    serve_then(o, || {})
}

/// The server: listens, then `listening()`, then serves clients one at a
/// time, each `pingpong` or `bw` as its control messages say (with
/// `once`: one client). Requests that come while a client is served wait
/// on their own EVD and are served in turn; without `once` a client's
/// failure (a request its client gave up, a bad control message) is
/// reported on stderr and the server goes on with the next.
pub(super) fn serve_then(o: &PerfOptions, listening: impl FnOnce()) -> Result<(), String> {
    let side = Side::open(o, o.max_size, o.window)?;
    let crs = side
        .ia
        .evd_create(64, EvdFlags::CR)
        .map_err(|e| format!("creating the request EVD: {e}"))?;
    let psp = side
        .ia
        .psp_create(o.qual, &crs)
        .map_err(|e| format!("listening on {}: {e}", o.qual))?;
    listening();
    let r = loop {
        let r = serve_one(&side, &crs);
        if o.once {
            break r;
        }
        if let Err(e) = r {
            eprintln!("rdapl: serving a client: {e}");
            // What the connection left on the EVD (its flushed requests,
            // its end) goes before the next client's turn, whether it
            // ended already (a client's bad message broke it) or not: the
            // next client's accept would take it for its own.
            if !side.end_seen.get() {
                let _ = side.ep.disconnect(false);
                let _ = side.drain_to_end();
            }
        }
        side.ep.reset().map_err(|e| e.to_string())?;
    };
    let _ = crs.free();
    let _ = psp.free();
    let _ = side.ep.free();
    let _ = side.ia.close(CloseFlags::Abrupt);
    r
}

fn serve_one(s: &Side, crs: &Evd) -> Result<(), String> {
    // No connection yet: nothing of one to drain.
    s.end_seen.set(true);
    // A request, accepted.
    let cr = match next_forever(crs)? {
        Event::ConnectionRequest(a) => a.cr,
        other => return Err(format!("waiting for a client: {other:?}")),
    };
    for i in 0..=s.window {
        s.post_recv(i)?;
    }
    let offer = s.offer()?;
    // The client's own region, for a pingpong of Writes.
    let mut peer = None;
    s.ia.cr(cr)
        .and_then(|c| {
            peer = read_offer(Some(c.private_data()));
            c.accept(&s.ep, &offer)
        })
        .map_err(|e| {
            if e.dat_return().subtype() == Some(rdapl::error::Subtype::InvalidHandleCr) {
                // Its connect timed out while an earlier client was served.
                "a client gave up waiting before it was served".to_string()
            } else {
                format!("accepting: {e}")
            }
        })?;
    s.end_seen.set(false);
    loop {
        match s.next()? {
            Event::Connection(c) if c.kind == ConnectionEventKind::Established => break,
            // A request whose client is gone: the receives are flushed,
            // then the connection's end says so.
            Event::Dto(d) if d.status == DtoStatus::Flushed => {}
            Event::Connection(c) => return Err(format!("accepting: {:?}", c.kind)),
            other => return Err(format!("expected Established, got {other:?}")),
        }
    }
    // A post refused because the client went away ends the connection.
    let gone = |r: Result<(), String>| match r {
        Err(_) if s.ended() && s.end_seen.get() => Ok(true),
        Err(_) if s.ended() => s.drain_to_end().map(|()| true),
        Err(e) => Err(e),
        Ok(()) => Ok(false),
    };
    loop {
        let Some((i, len)) = s.next_recv()? else {
            return Ok(());
        };
        let ctl = s.read_control(i, len)?;
        let Control {
            test,
            op,
            size,
            count,
            ..
        } = ctl;
        // Bytes are checked when the client stamped them and no later
        // message can land in a buffer before it is read.
        let checked = test == Test::PingPong || (ctl.stamped && s.recvs_distinct());
        if gone(s.post_recv(i))? {
            return Ok(());
        }
        if size == 0 || size > s.slot {
            return Err(format!(
                "the client asked for {size}-byte messages (the largest this server takes, --max-size, is {})",
                s.slot
            ));
        }
        if test == Test::PingPong && op == Op::Write {
            let peer = peer.ok_or("the client offers no region for its pingpong of Writes")?;
            if serve_write_pingpong(s, &ctl, peer, &gone)? {
                return Ok(());
            }
            continue;
        }
        if op != Op::Send {
            if serve_rdma(s, &ctl, &gone)? {
                return Ok(());
            }
            continue;
        }
        // Read: the phase may begin.
        if gone(s.control(ctl))? {
            return Ok(());
        }
        for seq in 0..count {
            let Some((i, len)) = s.next_recv()? else {
                return Ok(());
            };
            if len != size {
                return Err(format!("message {seq}: {len} bytes, expected {size}"));
            }
            if checked {
                s.check(i, len, seq as u64)?;
            }
            if gone(s.post_recv(i))? {
                return Ok(());
            }
            if test == Test::PingPong {
                s.stamp(seq, size, seq as u64)?;
                if gone(s.post_send(seq, size, seq as u64))? {
                    return Ok(());
                }
            }
        }
        if test == Test::Bw && gone(s.control(ctl))? {
            return Ok(());
        }
    }
}

/// The server's side of an RDMA phase (its control message read): the
/// pieces stamped for Reads, the echo; then, passive while the client
/// works, its closing control message, the pieces checked after Writes,
/// and the echo again. True if the client went away (its connection's
/// end taken).
fn serve_rdma(
    s: &Side,
    ctl: &Control,
    gone: &dyn Fn(Result<(), String>) -> Result<bool, String>,
) -> Result<bool, String> {
    let Control {
        op,
        size,
        count,
        slots,
        ..
    } = *ctl;
    let target = s
        .target
        .as_ref()
        .ok_or("this server offers no RDMA region")?;
    let room = target.whole().map_err(|e| e.to_string())?.segment_length as usize;
    if slots == 0 || slots.saturating_mul(size) > room {
        return Err(format!(
            "the client asked for {slots} pieces of {size} bytes; this server's RDMA region holds {room} bytes"
        ));
    }
    if op == Op::Read {
        for j in 0..slots {
            stamp_at(target, j * size, size, j as u64)?;
        }
    }
    if gone(s.control(*ctl))? {
        return Ok(true);
    }
    let Some((i, len)) = s.next_recv()? else {
        return Ok(true);
    };
    if s.read_control(i, len)? != *ctl {
        return Err("the client's closing control message did not match its opening one".into());
    }
    if op == Op::Write && ctl.stamped {
        for j in 0..slots {
            if let Some(last) = last_to(j, slots, count) {
                check_at(target, j * size, size, last as u64)?;
            }
        }
    }
    if gone(s.post_recv(i))? {
        return Ok(true);
    }
    gone(s.control(*ctl))
}

/// The next event of `evd`, however long it takes (a server waits for
/// its clients).
fn next_forever(evd: &Evd) -> Result<Event, String> {
    loop {
        match evd.wait(Some(Duration::from_millis(200)), 1) {
            Ok((ev, _)) => return Ok(ev),
            Err(rdapl::Error::TimeoutExpired { .. }) => continue,
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The server's side of a pingpong of Writes (its control message read):
/// the echo, the pingpong into the client's region `peer`, then the
/// client's closing control message and the echo again. True if the
/// client went away.
fn serve_write_pingpong(
    s: &Side,
    ctl: &Control,
    peer: RmrTriplet,
    gone: &dyn Fn(Result<(), String>) -> Result<bool, String>,
) -> Result<bool, String> {
    // A fresh start: piece 0 holds no stamp of this phase yet.
    let mine = s
        .target
        .as_ref()
        .ok_or("this server offers no RDMA region")?;
    mine.write_at(0, &vec![CLEAR; ctl.size.min(s.slot)])
        .map_err(|e| e.to_string())?;
    if gone(s.control(*ctl))? {
        return Ok(true);
    }
    let early = write_pingpong(s, ctl, peer, false)?;
    let Some((i, len)) = early.map_or_else(|| s.next_recv(), |m| Ok(Some(m)))? else {
        return Ok(true);
    };
    if s.read_control(i, len)? != *ctl {
        return Err("the client's closing control message did not match its opening one".into());
    }
    if gone(s.post_recv(i))? {
        return Ok(true);
    }
    gone(s.control(*ctl))
}
