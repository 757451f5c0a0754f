//! One measurement of part 5: a program's server and client run once,
//! their output parsed (rdapl's and fi_pingpong's tables, qperf's
//! figures) into one value with its iterations and CPU share.

use super::*;

/// The binaries.
pub(super) struct Tools {
    pub(super) rdapl: PathBuf,
    pub(super) fi_pingpong: Option<PathBuf>,
    pub(super) qperf: Option<PathBuf>,
}

/// A run's result: the value and the iterations it covered.
pub(super) struct Measured {
    pub(super) value: f64,
    pub(super) iters: u64,
    /// Seconds per iteration (a round trip, or a message of `bw`), for
    /// calibration.
    pub(super) per_iter_s: f64,
    pub(super) wall_s: f64,
    pub(super) client_cpu_share: Option<f64>,
}

/// fi_pingpong's `cnt_str`: `999`, `2k`, `1m` (truncating).
pub(super) fn fi_count(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{}b", n / 1_000_000_000)
    } else if n >= 1_000_000 {
        format!("{}m", n / 1_000_000)
    } else if n >= 1000 {
        format!("{}k", n / 1000)
    } else {
        n.to_string()
    }
}

/// fi_pingpong's `size_str` of a size: `64`, `4k`, `1m`.
pub(super) fn fi_size(n: usize) -> String {
    let (base, mag) = if n >= 1 << 30 {
        (1usize << 30, "g")
    } else if n >= 1 << 20 {
        (1 << 20, "m")
    } else if n >= 1 << 10 {
        (1 << 10, "k")
    } else {
        (1, "")
    };
    let frac = if n / base < 10 {
        (n % base) * 10 / base
    } else {
        0
    };
    if frac > 0 {
        format!("{}.{frac}{mag}", n / base)
    } else {
        format!("{}{mag}", n / base)
    }
}

/// The result row (the line after the `bytes ...` header) of a
/// fi_pingpong-style table.
pub(super) fn table_row(out: &str) -> Option<Vec<&str>> {
    let mut lines = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("bytes"));
    lines.next()?;
    lines
        .find(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
}

pub(super) fn num(s: &str) -> Option<f64> {
    s.trim_end_matches('s').replace(',', "").parse().ok()
}

/// Runs `program` at `test`/`size` for `iters` iterations once.
pub(super) fn measure_once(
    tools: &Tools,
    p: &Params,
    cpus: Option<(usize, usize)>,
    test: Test,
    size: usize,
    program: Program,
    iters: u64,
) -> Result<Measured, String> {
    let port = free_port()?;
    let s = |v: &dyn ToString| v.to_string();
    match program {
        Program::FiPingpong => {
            let bin = tools.fi_pingpong.as_deref().ok_or("fi_pingpong missing")?;
            let common = |port_flag: &str| -> Vec<String> {
                vec![
                    s(&"-p"),
                    s(&"tcp"),
                    s(&"-e"),
                    s(&"msg"),
                    s(&port_flag),
                    s(&port),
                    s(&"-I"),
                    s(&iters),
                    s(&"-S"),
                    s(&size),
                ]
            };
            let mut client = common("-P");
            client.push("127.0.0.1".into());
            let out = run_pair(
                (bin, common("-B")),
                (bin, client),
                port,
                false,
                cpus,
                p.timeout,
            )?;
            for (side, text) in [("client", &out.client), ("server", &out.server)] {
                let f = table_row(text)
                    .ok_or_else(|| format!("fi_pingpong {side}: no result row: {}", tail(text)))?;
                let want = [
                    fi_size(size),
                    fi_count(iters),
                    format!("={}", fi_count(iters)),
                ];
                if f.len() < 8 || f[0] != want[0] || f[1] != want[1] || f[2] != want[2] {
                    return Err(format!(
                        "fi_pingpong {side}: expected {} of {} sent and acknowledged, got `{}`",
                        want[1],
                        want[0],
                        f.join(" ")
                    ));
                }
            }
            let f = table_row(&out.client).unwrap_or_default();
            let usec = f
                .get(6)
                .and_then(|v| num(v))
                .filter(|v| *v > 0.0)
                .ok_or("fi_pingpong: no usec/xfer")?;
            Ok(Measured {
                value: if test == Test::Latency {
                    usec
                } else {
                    size as f64 / usec
                },
                iters,
                per_iter_s: 2.0 * usec * 1e-6,
                wall_s: out.wall_s,
                client_cpu_share: out.client_cpu_share,
            })
        }
        Program::Qperf => {
            let bin = tools.qperf.as_deref().ok_or("qperf missing")?;
            let name = if test == Test::StreamBw {
                "tcp_bw"
            } else {
                "tcp_lat"
            };
            let client: Vec<String> = vec![
                s(&"127.0.0.1"),
                s(&"-lp"),
                s(&port),
                s(&"-t"),
                s(&p.qperf_secs.max(1)),
                s(&"-m"),
                s(&size),
                s(&"-uu"),
                s(&"-e"),
                s(&"5"),
                s(&"-vvs"),
                s(&name),
            ];
            let out = run_pair(
                (bin, vec![s(&"-lp"), s(&port)]),
                (bin, client),
                port,
                true,
                cpus,
                p.timeout,
            )?;
            parse_qperf(&out.client, test).map(|(value, msgs)| Measured {
                value,
                iters: msgs,
                per_iter_s: f64::NAN,
                wall_s: out.wall_s,
                client_cpu_share: out.client_cpu_share,
            })
        }
        _ => {
            let sub = if test == Test::StreamBw {
                "bw"
            } else {
                "pingpong"
            };
            let mut common: Vec<String> = vec![
                s(&"-p"),
                s(&"tcp"),
                s(&"-a"),
                s(&"127.0.0.1"),
                s(&"-q"),
                s(&port),
                s(&"-S"),
                s(&size),
                s(&"-I"),
                s(&iters),
                s(&"--window"),
                s(&p.window),
                // One message buffer a side, reused, as fi_pingpong's,
                // qperf's and perftest's are: the same working set as the
                // peers (one buffer per message in flight put 33 MiB
                // through the caches at 1 MiB).
                s(&"--buffers"),
                s(&1),
                s(&"--timeout"),
                s(&p.timeout.as_secs_f64()),
            ];
            if program.waits() {
                common.push("-w".into());
            }
            if !program.crc() {
                common.extend([s(&"--params"), s(&"crc=0")]);
            }
            if program.sent() {
                common.extend([s(&"--params"), s(&"complete=sent")]);
            }
            let mut server = vec![s(&sub), s(&"-s"), s(&"--once")];
            server.extend(common.iter().cloned());
            let mut client = vec![s(&sub)];
            client.extend(common);
            client.push("127.0.0.1".into());
            let out = run_pair(
                (&tools.rdapl, server),
                (&tools.rdapl, client),
                port,
                false,
                cpus,
                p.timeout,
            )?;
            let f = table_row(&out.client)
                .ok_or_else(|| format!("rdapl {sub}: no result row: {}", tail(&out.client)))?;
            let acked = if test == Test::StreamBw { 1 } else { iters };
            if f.len() < 8 || f[1].parse::<u64>() != Ok(iters) || f[2].parse::<u64>() != Ok(acked) {
                return Err(format!(
                    "rdapl {sub}: expected {iters} sent and {acked} acknowledged, got `{}`",
                    f.join(" ")
                ));
            }
            let (mb, usec) = (num(f[5]), num(f[6]));
            let (Some(mb), Some(usec)) = (mb, usec) else {
                return Err(format!("rdapl {sub}: unreadable row `{}`", f.join(" ")));
            };
            let (value, per_iter_s) = match test {
                Test::Latency => (usec, 2.0 * usec * 1e-6),
                Test::PingpongBw => (size as f64 / usec, 2.0 * usec * 1e-6),
                Test::StreamBw => (mb, usec * 1e-6),
            };
            if !(value > 0.0 && value.is_finite()) {
                return Err(format!("rdapl {sub}: no figure in `{}`", f.join(" ")));
            }
            Ok(Measured {
                value,
                iters,
                per_iter_s,
                wall_s: out.wall_s,
                client_cpu_share: out.client_cpu_share,
            })
        }
    }
}

/// qperf's figure (`latency` in µs, `bw` in MB/s) and the messages
/// received, checking that messages went both ways (latency) or arrived
/// (bandwidth) and that no errors are reported.
pub fn parse_qperf(out: &str, test: Test) -> Result<(f64, u64), String> {
    let field = |key: &str| -> Option<f64> {
        out.lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == key)
                .then(|| v.split_whitespace().next().and_then(num))
                .flatten()
        })
    };
    if let Some(l) = out.lines().find(|l| {
        l.contains("errors")
            && l.split_once('=').is_some_and(|(_, v)| {
                num(v.split_whitespace().next().unwrap_or("0")).unwrap_or(1.0) != 0.0
            })
    }) {
        return Err(format!("qperf reports errors: {}", l.trim()));
    }
    let (value, msgs) = match test {
        Test::Latency => {
            let ns = field("latency").ok_or_else(|| format!("qperf: no latency: {}", tail(out)))?;
            let loc = field("loc_recv_msgs").unwrap_or(0.0);
            let rem = field("rem_recv_msgs").unwrap_or(0.0);
            if loc < 1.0 || rem < 1.0 {
                return Err(format!(
                    "qperf tcp_lat: no messages both ways: {}",
                    tail(out)
                ));
            }
            (ns / 1000.0, loc)
        }
        _ => {
            let bw = field("bw").ok_or_else(|| format!("qperf: no bw: {}", tail(out)))?;
            let msgs = field("recv_msgs").unwrap_or(0.0);
            if msgs < 1.0 {
                return Err(format!("qperf tcp_bw: nothing received: {}", tail(out)));
            }
            (bw / 1e6, msgs)
        }
    };
    if !(value > 0.0 && value.is_finite()) {
        return Err(format!("qperf: no figure: {}", tail(out)));
    }
    Ok((value, msgs as u64))
}

/// The 1-minute load average (NaN if unknown).
pub(super) fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}
