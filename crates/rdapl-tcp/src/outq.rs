//! A connection's output: what the engine transmits, queued for the socket
//! without copying large payload.
//!
//! Headers, trailers and small payloads are copied into byte segments;
//! the payload of a Send or RDMA Write of at least [`SHARE_MIN`] bytes is
//! queued by reference to its gathered buffer (shared with the
//! connection's memory, which may drop its own reference as soon as the
//! engine is done with it), and the socket gets everything with vectored
//! writes (header, payload and CRC of many FPDUs in one system call).

use std::collections::VecDeque;
use std::io::{self, IoSlice, Write};
use std::sync::Arc;

/// The smallest payload queued by reference rather than copied.
pub(crate) const SHARE_MIN: usize = 2048;

/// Most slices one vectored write takes.
const MAX_IOV: usize = 64;

enum Seg {
    Bytes(Vec<u8>),
    Shared(Arc<Vec<u8>>, usize, usize),
}

impl Seg {
    fn bytes(&self) -> &[u8] {
        match self {
            Seg::Bytes(b) => b,
            Seg::Shared(a, s, e) => &a[*s..*e],
        }
    }
}

/// The output queue.
#[derive(Default)]
pub(crate) struct OutQueue {
    segs: VecDeque<Seg>,
    /// Bytes of the front segment already written.
    off: usize,
    /// Bytes queued and not written.
    len: usize,
    /// A written byte segment kept for reuse.
    spare: Vec<u8>,
    /// Shared payload buffers written and no longer referenced elsewhere.
    pub freed: Vec<Vec<u8>>,
}

impl OutQueue {
    /// Bytes queued and not yet written.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops everything queued.
    pub fn clear(&mut self) {
        self.segs.clear();
        self.off = 0;
        self.len = 0;
    }

    /// Queues a copy of `b`.
    pub fn push_bytes(&mut self, b: &[u8]) {
        if b.is_empty() {
            return;
        }
        self.len += b.len();
        if let Some(Seg::Bytes(last)) = self.segs.back_mut()
            && last.len() < 64 << 10
        {
            last.extend_from_slice(b);
            return;
        }
        let mut v = std::mem::take(&mut self.spare);
        v.extend_from_slice(b);
        self.segs.push_back(Seg::Bytes(v));
    }

    /// Queues bytes `start..end` of `data` by reference (a copy if short).
    /// False (nothing queued) if the range is not inside `data`.
    pub fn push_shared(&mut self, data: &Arc<Vec<u8>>, start: usize, end: usize) -> bool {
        if start > end || end > data.len() {
            return false;
        }
        if end - start < SHARE_MIN {
            self.push_bytes(&data[start..end]);
        } else {
            self.len += end - start;
            self.segs.push_back(Seg::Shared(data.clone(), start, end));
        }
        true
    }

    /// Writes as much as the socket takes. `Ok(true)` if bytes moved.
    pub fn write_to(&mut self, w: &mut impl Write) -> io::Result<bool> {
        let mut moved = false;
        while self.len > 0 {
            let n = {
                let mut iov: [IoSlice<'_>; MAX_IOV] = [IoSlice::new(&[]); MAX_IOV];
                let mut k = 0;
                for (i, s) in self.segs.iter().take(MAX_IOV).enumerate() {
                    let b = s.bytes();
                    iov[k] = IoSlice::new(if i == 0 { &b[self.off..] } else { b });
                    k += 1;
                }
                match w.write_vectored(&iov[..k]) {
                    Ok(0) => return Ok(moved),
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(moved),
                    Err(e) => return Err(e),
                }
            };
            moved = true;
            self.advance(n);
        }
        Ok(moved)
    }

    fn advance(&mut self, mut n: usize) {
        self.len -= n;
        while n > 0 {
            let Some(front) = self.segs.front() else {
                break;
            };
            let left = front.bytes().len() - self.off;
            if n < left {
                self.off += n;
                return;
            }
            n -= left;
            self.off = 0;
            match self.segs.pop_front() {
                Some(Seg::Bytes(mut b))
                    if self.spare.capacity() < b.capacity() && b.capacity() <= 1 << 20 =>
                {
                    b.clear();
                    self.spare = b;
                }
                Some(Seg::Shared(a, ..)) => {
                    if let Ok(v) = Arc::try_unwrap(a) {
                        crate::memory::recycle(&mut self.freed, v);
                    }
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most `max` bytes per call.
    struct Trickle {
        out: Vec<u8>,
        max: usize,
    }

    impl Write for Trickle {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let n = b.len().min(self.max);
            if n == 0 && !b.is_empty() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.out.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn bytes_and_shared_come_out_in_order_across_partial_writes() {
        let big = Arc::new((0..10_000u32).map(|i| i as u8).collect::<Vec<u8>>());
        let mut q = OutQueue::default();
        let mut want = Vec::new();
        for round in 0..5u8 {
            q.push_bytes(&[round; 7]);
            want.extend_from_slice(&[round; 7]);
            assert!(q.push_shared(&big, 100, 9_000));
            want.extend_from_slice(&big[100..9_000]);
            assert!(q.push_shared(&big, 10, 20));
            want.extend_from_slice(&big[10..20]);
        }
        assert!(!q.push_shared(&big, 5, 10_001));
        assert_eq!(q.len(), want.len());
        for max in [1, 333, 4096, 1 << 20] {
            let mut q2 = OutQueue::default();
            q2.push_bytes(&want[..3]);
            assert!(q2.push_shared(&Arc::new(want[3..].to_vec()), 0, want.len() - 3));
            let mut w = Trickle {
                out: Vec::new(),
                max,
            };
            while !q2.is_empty() {
                assert!(q2.write_to(&mut w).unwrap());
            }
            assert_eq!(w.out, want);
        }
        let mut w = Trickle {
            out: Vec::new(),
            max: 777,
        };
        while !q.is_empty() {
            q.write_to(&mut w).unwrap();
        }
        assert_eq!(w.out, want);
    }
}
