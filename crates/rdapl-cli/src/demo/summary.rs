//! What a demo run reports: its summary, counters and timings, and how
//! they print.

use super::*;

/// What a demo run did and saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DemoSummary {
    /// The server IA's address.
    pub server_address: IpAddr,
    /// The client IA's address.
    pub client_address: IpAddr,
    /// The connection qualifier the server listened on.
    pub conn_qual: u64,
    /// True once both sides saw `Established`.
    pub established: bool,
    /// Private data of the connection request, as the server received it.
    pub client_private_data: Vec<u8>,
    /// Private data of the accept, as the client received it.
    pub server_private_data: Vec<u8>,
    /// The remote buffer the client took from the accept's private data.
    pub remote_buffer: Option<RmrTriplet>,
    /// Bytes per message.
    pub message_size: usize,
    /// Sends that completed successfully (seen by the poller).
    pub messages_sent: u64,
    /// Receives that completed successfully (seen by the upcall).
    pub messages_received: u64,
    /// Received message bytes found equal to what was sent.
    pub message_bytes_verified: u64,
    /// Time from the first send posted to the last completion consumed.
    pub message_time: Duration,
    /// Bytes the RDMA write completion reported.
    pub rdma_write_bytes: u64,
    /// Bytes of the server's buffer found equal to what was written.
    pub rdma_write_verified: u64,
    /// Time from posting the RDMA write to consuming its completion.
    pub rdma_write_time: Duration,
    /// Bytes the RDMA read completion reported.
    pub rdma_read_bytes: u64,
    /// Bytes read back found equal to what was written.
    pub rdma_read_verified: u64,
    /// Time from posting the RDMA read to consuming its completion.
    pub rdma_read_time: Duration,
    /// Events consumed by the server's receive upcall.
    pub consumed_by_upcall: u64,
    /// Events consumed by the client's poller.
    pub consumed_by_poller: u64,
    /// Events consumed by blocking `wait`.
    pub consumed_by_wait: u64,
    /// What the `wait`s consumed, in order.
    pub waited: Vec<String>,
    /// The client saw `Disconnected`.
    pub client_disconnected: bool,
    /// The server saw `Disconnected`.
    pub server_disconnected: bool,
    /// Wall-clock time of the whole run, setup and teardown included.
    pub elapsed: Duration,
    /// Everything that went wrong (empty on success).
    pub errors: Vec<String>,
    /// Errors beyond the ones kept in `errors`.
    pub errors_dropped: u64,
}

impl DemoSummary {
    pub(super) fn new(conn_qual: u64, message_size: usize) -> DemoSummary {
        DemoSummary {
            server_address: SERVER_ADDR,
            client_address: CLIENT_ADDR,
            conn_qual,
            established: false,
            client_private_data: Vec::new(),
            server_private_data: Vec::new(),
            remote_buffer: None,
            message_size,
            messages_sent: 0,
            messages_received: 0,
            message_bytes_verified: 0,
            message_time: Duration::ZERO,
            rdma_write_bytes: 0,
            rdma_write_verified: 0,
            rdma_write_time: Duration::ZERO,
            rdma_read_bytes: 0,
            rdma_read_verified: 0,
            rdma_read_time: Duration::ZERO,
            consumed_by_upcall: 0,
            consumed_by_poller: 0,
            consumed_by_wait: 0,
            waited: Vec::new(),
            client_disconnected: false,
            server_disconnected: false,
            elapsed: Duration::ZERO,
            errors: Vec::new(),
            errors_dropped: 0,
        }
    }

    /// True if the run saw no error.
    pub fn ok(&self) -> bool {
        self.errors.is_empty() && self.errors_dropped == 0
    }

    /// Number of errors seen.
    pub fn error_count(&self) -> u64 {
        self.errors.len() as u64 + self.errors_dropped
    }

    /// All bytes verified: messages, RDMA write and RDMA read.
    pub fn bytes_verified(&self) -> u64 {
        self.message_bytes_verified + self.rdma_write_verified + self.rdma_read_verified
    }

    /// RDMA write throughput in MB/s (10^6 bytes; context only: one
    /// in-process copy, no wire).
    pub fn rdma_write_mbps(&self) -> f64 {
        mbps(self.rdma_write_bytes, self.rdma_write_time)
    }

    /// RDMA read throughput in MB/s (context only).
    pub fn rdma_read_mbps(&self) -> f64 {
        mbps(self.rdma_read_bytes, self.rdma_read_time)
    }

    pub(super) fn error(&mut self, e: impl Into<String>) {
        if self.errors.len() < MAX_ERRORS_KEPT {
            self.errors.push(e.into());
        } else {
            self.errors_dropped += 1;
        }
    }

    pub(super) fn absorb(&mut self, errors: Vec<String>, dropped: u64) {
        self.errors_dropped += dropped;
        for e in errors {
            self.error(e);
        }
    }
}

fn mbps(bytes: u64, t: Duration) -> f64 {
    bytes as f64 / 1e6 / t.as_secs_f64().max(1e-9)
}

fn ms(t: Duration) -> f64 {
    t.as_secs_f64() * 1e3
}

/// Printable form of private data: the text, then any non-text tail in hex.
pub(super) fn show_private(data: &[u8]) -> String {
    let text_len = data
        .iter()
        .position(|b| !(b.is_ascii_graphic() || *b == b' '))
        .unwrap_or(data.len());
    let mut s = format!("{:?}", String::from_utf8_lossy(&data[..text_len]));
    if text_len < data.len() {
        s.push_str(&format!(" + {} binary byte(s)", data.len() - text_len));
    }
    s
}

impl fmt::Display for DemoSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "rdapl demo on the loopback provider")?;
        writeln!(
            f,
            "  connection  {} -> {}, qualifier {}: {}",
            self.client_address,
            self.server_address,
            self.conn_qual,
            if self.established {
                "established"
            } else {
                "NOT established"
            }
        )?;
        writeln!(
            f,
            "              client private data {} ({} bytes), checked by the server",
            show_private(&self.client_private_data),
            self.client_private_data.len()
        )?;
        writeln!(
            f,
            "              server private data {} ({} bytes), checked by the client",
            show_private(&self.server_private_data),
            self.server_private_data.len()
        )?;
        if let Some(t) = &self.remote_buffer {
            writeln!(
                f,
                "              remote buffer from the accept: rmr_context {:#x}, address {:#x}, {} bytes",
                t.rmr_context, t.target_address, t.segment_length
            )?;
        }
        writeln!(
            f,
            "  messages    {} sent, {} received ({} bytes each), {} bytes verified, {:.2} ms",
            self.messages_sent,
            self.messages_received,
            self.message_size,
            self.message_bytes_verified,
            ms(self.message_time)
        )?;
        writeln!(
            f,
            "  rdma write  {} bytes into the server LMR, {} bytes verified, {:.2} ms, {:.0} MB/s",
            self.rdma_write_bytes,
            self.rdma_write_verified,
            ms(self.rdma_write_time),
            self.rdma_write_mbps()
        )?;
        writeln!(
            f,
            "  rdma read   {} bytes back into a fresh client LMR, {} bytes verified, {:.2} ms, {:.0} MB/s",
            self.rdma_read_bytes,
            self.rdma_read_verified,
            ms(self.rdma_read_time),
            self.rdma_read_mbps()
        )?;
        writeln!(
            f,
            "              (throughput is context only: one in-process copy, no wire)"
        )?;
        writeln!(
            f,
            "  events      {} consumed by upcall (server receives), {} by poller (client sends), {} by wait",
            self.consumed_by_upcall, self.consumed_by_poller, self.consumed_by_wait
        )?;
        if !self.waited.is_empty() {
            writeln!(f, "              by wait: {}", self.waited.join(", "))?;
        }
        writeln!(
            f,
            "  disconnect  graceful; Disconnected seen by the client: {}, by the server: {}",
            yes_no(self.client_disconnected),
            yes_no(self.server_disconnected)
        )?;
        writeln!(
            f,
            "  total       {} bytes verified in {:.2} ms",
            self.bytes_verified(),
            ms(self.elapsed)
        )?;
        if self.ok() {
            writeln!(f, "  result      0 errors")
        } else {
            writeln!(f, "  result      {} error(s):", self.error_count())?;
            for e in &self.errors {
                writeln!(f, "    - {e}")?;
            }
            if self.errors_dropped > 0 {
                writeln!(f, "    - ... and {} more", self.errors_dropped)?;
            }
            Ok(())
        }
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "NO" }
}
