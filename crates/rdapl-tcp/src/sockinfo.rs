//! What the kernel knows of a TCP connection and the socket API does not
//! say: whether sent bytes wait for the peer, whether the kernel is
//! already asking the peer (retransmitting, probing a closed window, or
//! sending keepalive probes), how long ago anything last came from the
//! peer and how long ago data of ours last went out. The watchdog of a
//! silent peer (`conn/liveness.rs`) reads it.
//!
//! * This module is the crate's only `unsafe`: one `getsockopt(TCP_INFO)`
//!   into a zeroed structure of the C library's layout.
//! * A kernel that fills less of the structure than the C library knows
//!   leaves the rest zero: on a kernel without `tcpi_notsent_bytes`
//!   (before 4.6) unsent bytes read as none.
//! * Elsewhere than Linux there is no such call: [`snapshot`] fails with
//!   `Unsupported` and the watchdog leaves the kernel's timers alone.

use std::io;
use std::net::TcpStream;

/// One look at a connection's acknowledgement state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TcpSnapshot {
    /// Segments sent and not yet acknowledged.
    pub unacked: u32,
    /// Bytes written to the socket and not yet sent (a closed window).
    pub notsent: u32,
    /// Probes sent and not answered: zero-window or keepalive probes.
    pub probes: u8,
    /// Retransmissions of the oldest unacknowledged segment.
    pub retransmits: u8,
    /// Milliseconds since anything last came from the peer: an
    /// acknowledgement or data. (Both count: the kernel's receive fast
    /// path may take the peer's data without the acknowledgement it
    /// carries when that acknowledges nothing new, as on a side that only
    /// receives; Linux 6.18 on loopback counted both the same.)
    pub silent_ms: u32,
    /// Milliseconds since data of ours last went out (a retransmission or
    /// a tail loss probe counts).
    pub sent_ms: u32,
}

/// Reads the kernel's `TCP_INFO` of `sock`.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[allow(unsafe_code)]
pub(crate) fn snapshot(sock: &TcpStream) -> io::Result<TcpSnapshot> {
    use std::mem::{MaybeUninit, offset_of, size_of};
    use std::os::fd::AsRawFd;

    let mut info = MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes, the size of the C
    // library's `tcp_info`, and `len` is a valid in/out length; the kernel
    // writes at most `len` bytes and stores how many in `len`. The
    // descriptor is borrowed from `sock`, open for the call's duration.
    let r = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: every field of `tcp_info` is an integer, so the zeroed bytes
    // the kernel did not overwrite are a valid value too.
    let info = unsafe { info.assume_init() };
    let filled = |end: usize| len as usize >= end;
    let notsent_end = offset_of!(libc::tcp_info, tcpi_notsent_bytes) + size_of::<u32>();
    Ok(TcpSnapshot {
        unacked: info.tcpi_unacked,
        notsent: if filled(notsent_end) {
            info.tcpi_notsent_bytes
        } else {
            0
        },
        probes: info.tcpi_probes,
        retransmits: info.tcpi_retransmits,
        silent_ms: info.tcpi_last_ack_recv.min(info.tcpi_last_data_recv),
        sent_ms: info.tcpi_last_data_sent,
    })
}

/// Reads the kernel's `TCP_INFO` of `sock` (not on this system).
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) fn snapshot(_sock: &TcpStream) -> io::Result<TcpSnapshot> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

#[cfg(all(test, any(target_os = "linux", target_os = "android")))]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    /// A connection whose peer reads nothing: the bytes written beyond
    /// what the peer's window and buffers take show as unsent, and an
    /// idle, answered connection shows nothing outstanding.
    #[test]
    fn a_snapshot_sees_unsent_bytes_and_a_quiet_connection() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_b, _) = l.accept().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let quiet = snapshot(&a).unwrap();
        assert_eq!((quiet.unacked, quiet.notsent, quiet.probes), (0, 0, 0));
        assert_eq!(quiet.retransmits, 0);
        a.set_nonblocking(true).unwrap();
        let chunk = vec![7u8; 1 << 16];
        let mut w = &a;
        let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < end {
            match w.write(&chunk) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("{e}"),
            }
        }
        let full = snapshot(&a).unwrap();
        assert!(
            full.notsent > 0 || full.unacked > 0,
            "bytes outstanding: {full:?}"
        );
    }

    /// The time since our data last went out counts from the last write,
    /// not from anything the peer sent.
    #[test]
    fn a_snapshot_says_when_our_data_last_went_out() {
        use std::time::Duration;
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        a.write_all(b"x").unwrap();
        std::thread::sleep(Duration::from_millis(150));
        // The peer's data afterwards changes nothing of it.
        b.write_all(b"y").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let s = snapshot(&a).unwrap();
        assert!(
            (180..2_000).contains(&s.sent_ms),
            "our byte went out 200 ms ago: {s:?}"
        );
        assert!(s.silent_ms < 150, "the peer's byte came 50 ms ago: {s:?}");
    }

    /// A side that only receives hears from its peer through the data:
    /// it is not silent while data flows in, though no acknowledgement of
    /// anything it sent has come for a long time.
    #[test]
    fn data_flowing_in_is_no_silence() {
        use std::io::Read;
        use std::time::{Duration, Instant};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        // Quiet for a while: `a` hears nothing.
        std::thread::sleep(Duration::from_millis(400));
        let end = Instant::now() + Duration::from_millis(400);
        let writer = std::thread::spawn(move || {
            let mut w = &b;
            let chunk = [5u8; 1000];
            while Instant::now() < end {
                w.write_all(&chunk).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            b
        });
        let mut r = &a;
        let mut buf = [0u8; 4096];
        a.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut worst = 0;
        while Instant::now() < end - Duration::from_millis(20) {
            let _ = r.read(&mut buf);
            if Instant::now() > end - Duration::from_millis(300) {
                worst = worst.max(snapshot(&a).unwrap().silent_ms);
            }
        }
        let _b = writer.join().unwrap();
        assert!(worst < 200, "silent for {worst} ms while data came in");
    }
}
