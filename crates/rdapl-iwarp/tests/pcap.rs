//! Builds a byte capture of a full conversation (MPA Request/Reply with
//! CRC, Sends, a multi-segment Write, a Read Request and Response, a
//! Terminate), writes it as a classic pcap with fabricated Ethernet/IPv4/TCP
//! headers over 127.0.0.1, and, if `tshark` is installed, checks that every
//! frame decodes as MPA/DDP/RDMAP with good CRCs and nothing malformed.
//! Without tshark the check is skipped with a message, unless
//! `RDAPL_REQUIRE_EXTERNAL=1`, which makes it fail. `RDAPL_TSHARK` names
//! another tshark binary.

mod common;

use std::process::Command;

use common::Pair;
use rdapl_iwarp::fpdu;
use rdapl_iwarp::{Config, Connection, Event, ReadRequest, Transmit, VecMemory};

const CLIENT_PORT: u16 = 40_001;
const SERVER_PORT: u16 = 50_001;

/// One TCP data segment: direction (true = client→server) and bytes.
struct Seg {
    from_client: bool,
    data: Vec<u8>,
}

fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum = 0u32;
    let mut odd: Option<u8> = None;
    for p in parts {
        for &b in *p {
            match odd.take() {
                Some(h) => sum += u32::from(u16::from_be_bytes([h, b])),
                None => odd = Some(b),
            }
        }
    }
    if let Some(h) = odd {
        sum += u32::from(h) << 8;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

struct PcapWriter {
    out: Vec<u8>,
    seq: [u32; 2], // next seq: [client, server]
    ts: u32,
    ip_id: u16,
}

impl PcapWriter {
    fn new() -> Self {
        let mut out = Vec::new();
        out.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        out.extend_from_slice(&2u16.to_le_bytes());
        out.extend_from_slice(&4u16.to_le_bytes());
        out.extend_from_slice(&0i32.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&65_535u32.to_le_bytes());
        out.extend_from_slice(&1u32.to_le_bytes()); // Ethernet
        Self {
            out,
            seq: [1_000, 5_000_000],
            ts: 0,
            ip_id: 1,
        }
    }

    fn packet(&mut self, from_client: bool, flags: u8, payload: &[u8]) {
        let (sp, dp) = if from_client {
            (CLIENT_PORT, SERVER_PORT)
        } else {
            (SERVER_PORT, CLIENT_PORT)
        };
        let me = usize::from(!from_client);
        let seq = self.seq[me];
        let ack = self.seq[1 - me];
        let mut tcp = Vec::with_capacity(20);
        tcp.extend_from_slice(&sp.to_be_bytes());
        tcp.extend_from_slice(&dp.to_be_bytes());
        tcp.extend_from_slice(&seq.to_be_bytes());
        tcp.extend_from_slice(&(if flags & 0x10 != 0 { ack } else { 0 }).to_be_bytes());
        tcp.push(5 << 4);
        tcp.push(flags);
        tcp.extend_from_slice(&65_535u16.to_be_bytes());
        tcp.extend_from_slice(&[0, 0, 0, 0]);
        let lo = [127u8, 0, 0, 1];
        let tcp_len = (tcp.len() + payload.len()) as u16;
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&lo);
        pseudo.extend_from_slice(&lo);
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&tcp_len.to_be_bytes());
        let c = checksum(&[&pseudo, &tcp, payload]);
        tcp[16..18].copy_from_slice(&c.to_be_bytes());
        let mut ip = vec![0x45, 0];
        ip.extend_from_slice(&(20 + tcp_len).to_be_bytes());
        ip.extend_from_slice(&self.ip_id.to_be_bytes());
        self.ip_id += 1;
        ip.extend_from_slice(&[0x40, 0, 64, 6, 0, 0]);
        ip.extend_from_slice(&lo);
        ip.extend_from_slice(&lo);
        let c = checksum(&[&ip]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let mut frame = vec![0u8; 12];
        frame.extend_from_slice(&[0x08, 0x00]);
        frame.extend_from_slice(&ip);
        frame.extend_from_slice(&tcp);
        frame.extend_from_slice(payload);
        self.ts += 1;
        self.out
            .extend_from_slice(&(1_700_000_000u32).to_le_bytes());
        self.out.extend_from_slice(&(self.ts * 100).to_le_bytes());
        self.out
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out
            .extend_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out.extend_from_slice(&frame);
        let advance = payload.len() as u32 + u32::from(flags & 0x03 != 0); // SYN/FIN take one
        self.seq[me] = seq.wrapping_add(advance);
    }
}

/// Runs the conversation; returns the segments in wire order and the
/// number of FPDUs in them.
fn conversation() -> (Vec<Seg>, usize, Vec<u8>) {
    let cfg = Config {
        crc: true,
        mss: 1460,
        ..Config::default()
    };
    let mut p = Pair::new(cfg.clone(), cfg);
    let mut segs = Vec::new();
    let mut opcodes = Vec::new();
    fn drain(
        c: &mut Connection,
        mem: &VecMemory,
        from_client: bool,
        segs: &mut Vec<Seg>,
        ops: &mut Vec<u8>,
    ) -> Vec<u8> {
        let mut all = Vec::new();
        while let Some(t) = c.poll_transmit(mem) {
            let mut b = Vec::new();
            assert!(t.write_to(mem, &mut b));
            if let Transmit::Fpdu { header, .. } = &t {
                ops.push(header[3] & 0xf);
            }
            all.extend_from_slice(&b);
            segs.push(Seg {
                from_client,
                data: b,
            });
        }
        all
    }
    macro_rules! step {
        () => {{
            for _ in 0..10 {
                let x = drain(&mut p.a.conn, &p.a.mem, true, &mut segs, &mut opcodes);
                let y = drain(&mut p.b.conn, &p.b.mem, false, &mut segs, &mut opcodes);
                if x.is_empty() && y.is_empty() {
                    break;
                }
                p.b.conn.handle_input(0, &x, &mut p.b.mem);
                p.a.conn.handle_input(0, &y, &mut p.a.mem);
            }
        }};
    }
    p.b.mem
        .register(0x100, 0x10_0000, vec![0; 4096], true, false);
    p.b.mem.register(
        0x200,
        0x20_0000,
        (0..2500u32).map(|i| i as u8).collect(),
        false,
        true,
    );
    p.a.mem
        .register(0x300, 0x30_0000, vec![0; 2500], false, false);
    p.a.mem.sends.insert(1, b"hello, iWARP".to_vec());
    p.a.mem.sends.insert(2, vec![0xab; 3000]);
    p.a.mem.sends.insert(3, b"solicited".to_vec());
    p.b.mem.recvs.insert(11, vec![0; 64]);
    p.b.mem.recvs.insert(12, vec![0; 64]);

    p.a.conn.connect(0, b"rdapl").unwrap();
    step!();
    p.b.take_events();
    p.b.conn.accept(0, b"rdapl-ok", None, None).unwrap();
    p.b.conn.post_recv(11, 64).unwrap();
    p.b.conn.post_recv(12, 64).unwrap();
    step!();
    p.a.conn.post_send(1, 12).unwrap();
    step!();
    p.a.conn.post_write(2, 3000, 0x100, 0x10_0000).unwrap();
    step!();
    let rr = ReadRequest {
        sink_stag: 0x300,
        sink_to: 0x30_0000,
        size: 2500,
        src_stag: 0x200,
        src_to: 0x20_0000,
    };
    p.a.conn.post_read(4, rr).unwrap();
    step!();
    p.a.conn.post_send_se(3, 9).unwrap();
    step!();
    p.b.conn.abort();
    step!();
    let ea = p.a.take_events();
    assert!(
        ea.contains(&Event::ReadComplete {
            wr_id: 4,
            len: 2500
        }),
        "{ea:?}"
    );
    assert!(
        ea.iter().any(|e| matches!(e, Event::TerminateReceived(_))),
        "{ea:?}"
    );
    assert_eq!(&p.b.mem.recvs[&11][..12], b"hello, iWARP");
    (segs, opcodes.len(), opcodes)
}

#[test]
fn capture_decodes_in_tshark() {
    let (segs, nfpdu, opcodes) = conversation();
    // Opcodes on the wire: Send, 3×Write, Read Request, 2×Read Response, Send SE, Terminate.
    assert_eq!(opcodes, vec![3, 0, 0, 0, 1, 2, 2, 5, 7]);
    let mut w = PcapWriter::new();
    w.packet(true, 0x02, &[]); // SYN
    w.packet(false, 0x12, &[]); // SYN-ACK
    w.packet(true, 0x10, &[]); // ACK
    for s in &segs {
        w.packet(s.from_client, 0x18, &s.data);
        w.packet(!s.from_client, 0x10, &[]);
    }
    w.packet(false, 0x11, &[]); // FIN from the terminating side
    w.packet(true, 0x11, &[]);
    w.packet(false, 0x10, &[]);
    // Check our own capture once with our decoder: every FPDU decodes.
    let server_bytes: Vec<u8> = segs
        .iter()
        .filter(|s| !s.from_client)
        .flat_map(|s| s.data.clone())
        .collect();
    let rep_len = 20 + usize::from(u16::from_be_bytes([server_bytes[18], server_bytes[19]]));
    let (frames, err) = fpdu::decode_all(&server_bytes[rep_len..], true);
    assert_eq!(err, None);
    assert_eq!(frames.len(), 3);

    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("rdapl-iwarp-conversation.pcap");
    std::fs::write(&path, &w.out).unwrap();
    println!(
        "wrote {} ({} bytes, {} FPDUs)",
        path.display(),
        w.out.len(),
        nfpdu
    );

    let tshark = std::env::var("RDAPL_TSHARK").unwrap_or_else(|_| "tshark".into());
    let have_tshark = Command::new(&tshark)
        .arg("-v")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_tshark {
        if std::env::var("RDAPL_REQUIRE_EXTERNAL").as_deref() == Ok("1") {
            panic!("tshark not found and RDAPL_REQUIRE_EXTERNAL=1");
        }
        println!("SKIPPED tshark check: tshark is not installed (apt-get install tshark)");
        return;
    }
    let base = [
        "-r",
        path.to_str().unwrap(),
        "-o",
        "tcp.try_heuristic_first:TRUE",
        "--disable-heuristic",
        "rpcrdma_iwarp",
        "--disable-heuristic",
        "smb_direct_iwarp",
    ];
    let run = |extra: &[&str]| -> String {
        let o = Command::new("tshark")
            .args(base)
            .args(extra)
            .output()
            .expect("run tshark");
        assert!(
            o.status.success(),
            "tshark failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    };
    // One line per FPDU.
    let fields = run(&[
        "-Y",
        "iwarp_ddp_rdmap",
        "-T",
        "fields",
        "-E",
        "separator=;",
        "-e",
        "frame.number",
        "-e",
        "iwarp_rdma.opcode",
        "-e",
        "iwarp_ddp.last_flag",
        "-e",
        "iwarp_ddp.qn",
        "-e",
        "iwarp_ddp.msn",
        "-e",
        "iwarp_ddp.mo",
        "-e",
        "iwarp_ddp.stag",
        "-e",
        "iwarp_ddp.tagged_offset",
        "-e",
        "iwarp_mpa.ulpdulength",
        "-e",
        "iwarp_mpa.crc_check",
    ]);
    println!("tshark fields:\n{fields}");
    let lines: Vec<&str> = fields.lines().collect();
    assert_eq!(lines.len(), nfpdu, "one decoded FPDU per frame we sent");
    let got_ops: Vec<u8> = lines
        .iter()
        .map(|l| {
            let op = l.split(';').nth(1).unwrap();
            u8::from_str_radix(op.trim_start_matches("0x"), 16).unwrap()
        })
        .collect();
    assert_eq!(got_ops, opcodes);
    for l in &lines {
        let crc = l.split(';').nth(9).unwrap();
        assert!(!crc.is_empty(), "CRC checked on every FPDU: {l}");
    }
    // The MPA Request and Reply are recognised.
    let mpa = run(&[
        "-Y",
        "iwarp_mpa.req || iwarp_mpa.rep",
        "-T",
        "fields",
        "-e",
        "frame.number",
        "-e",
        "iwarp_mpa.crc_flag",
        "-e",
        "iwarp_mpa.rev",
    ]);
    println!("tshark MPA frames:\n{mpa}");
    assert_eq!(mpa.lines().count(), 2, "{mpa}");
    // No bad CRC, nothing malformed; every CRC good.
    let verbose = run(&["-V"]);
    assert!(!verbose.contains("Bad CRC32"), "tshark found a bad CRC");
    assert!(
        !verbose.contains("Malformed"),
        "tshark found a malformed frame"
    );
    let good = verbose.matches("Good CRC32").count();
    assert_eq!(good, nfpdu, "every FPDU has a good CRC");
    let malformed = run(&["-Y", "_ws.malformed || _ws.expert.severity == error"]);
    assert!(
        malformed.trim().is_empty(),
        "malformed or error frames:\n{malformed}"
    );
    println!("tshark: {nfpdu} FPDUs decoded, {good} good CRCs, 0 bad, 0 malformed");
}
