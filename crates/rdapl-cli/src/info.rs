//! `rdapl info`: every provider rdapl knows, with its provider and IA
//! attributes, in the spirit of `fi_info -v`.
//!
//! For each provider of [`rdapl::builtin()`], an IA is opened with
//! default options, queried (`dat_ia_query`) and closed gracefully; what the
//! IA reports is printed. A provider whose IA cannot be opened still gets its
//! provider attributes (from the provider itself) and the error.

use rdapl::{CloseFlags, CompletionFlags, EventStream, Ia, IaAttr, IaOptions, ProviderAttr};
use std::fmt::Write;

/// Builds the report of every provider.
pub fn run() -> String {
    crate::register_providers();
    let providers = rdapl::builtin().providers();
    let mut out = String::new();
    let _ = writeln!(out, "{} provider(s)", providers.len());
    for p in providers {
        let _ = writeln!(out, "---");
        match Ia::open_provider(p.clone(), IaOptions::default()) {
            Ok(ia) => {
                match ia.query() {
                    Ok((ia_attr, provider_attr)) => {
                        provider(&mut out, &provider_attr);
                        ia_attrs(&mut out, &ia_attr);
                    }
                    Err(e) => {
                        provider(&mut out, &p.attr());
                        let _ = writeln!(out, "    ia_attr: ia_query failed: {e}");
                    }
                }
                if let Err(e) = ia.close(CloseFlags::Graceful) {
                    let _ = writeln!(out, "    (closing the IA failed: {e})");
                }
            }
            Err(e) => {
                provider(&mut out, &p.attr());
                let _ = writeln!(out, "    ia_attr: could not open an IA: {e}");
            }
        }
    }
    out
}

fn field(out: &mut String, indent: usize, key: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{:indent$}{key}: {value}", "");
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// A byte count, with a binary-unit hint when it is a whole number of them.
fn bytes(n: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (u, name) in UNITS {
        if n >= u && n.is_multiple_of(u) {
            return format!("{n} ({} {name})", n / u);
        }
    }
    n.to_string()
}

fn completion_flags(bits: u32) -> String {
    let known = [
        (CompletionFlags::SUPPRESS, "SUPPRESS"),
        (CompletionFlags::SOLICITED_WAIT, "SOLICITED_WAIT"),
        (CompletionFlags::UNSIGNALLED, "UNSIGNALLED"),
        (CompletionFlags::BARRIER_FENCE, "BARRIER_FENCE"),
    ];
    let mut names: Vec<String> = known
        .iter()
        .filter(|(f, _)| bits & f.0 == f.0)
        .map(|(_, n)| (*n).to_string())
        .collect();
    let rest = known.iter().fold(bits, |b, (f, _)| b & !f.0);
    if rest != 0 {
        names.push(format!("{rest:#x}"));
    }
    if names.is_empty() {
        names.push("DEFAULT".into());
    }
    format!("{bits:#04x} [{}]", names.join(" | "))
}

fn stream_name(s: EventStream) -> &'static str {
    match s {
        EventStream::Software => "SOFTWARE",
        EventStream::ConnectionRequest => "CR",
        EventStream::Dto => "DTO",
        EventStream::Connection => "CONNECTION",
        EventStream::RmrBind => "RMR_BIND",
        EventStream::Async => "ASYNC",
    }
}

fn provider(out: &mut String, a: &ProviderAttr) {
    let _ = writeln!(out, "provider: {}", a.name);
    let _ = writeln!(out, "    provider_attr:");
    field(out, 8, "name", &a.name);
    field(out, 8, "description", &a.description);
    field(
        out,
        8,
        "version",
        format!("{}.{}", a.version.0, a.version.1),
    );
    field(
        out,
        8,
        "dapl_version",
        format!("{}.{}", a.dapl_version.0, a.dapl_version.1),
    );
    field(out, 8, "thread_safe", yes_no(a.thread_safe));
    let policies: Vec<String> = a
        .upcall_policies
        .iter()
        .map(|p| format!("{p:?} ({})", p.to_dat()))
        .collect();
    field(out, 8, "upcall_policies", policies.join(", "));
    field(
        out,
        8,
        "completion_flags",
        completion_flags(a.completion_flags),
    );
    field(out, 8, "fmr_supported", yes_no(a.fmr_supported));
    field(out, 8, "srq_supported", yes_no(a.srq_supported));
    field(
        out,
        8,
        "max_private_data_size",
        bytes(a.max_private_data_size as u64),
    );
    field(
        out,
        8,
        "send_completes",
        if a.completes_when_placed {
            "once placed at the peer"
        } else {
            "once handed to the transport"
        },
    );
    let _ = writeln!(out, "        evd_stream_merging_supported:");
    let width = EventStream::ALL
        .iter()
        .map(|s| stream_name(*s).len())
        .max()
        .unwrap_or(0);
    let mut header = format!("{:12}{:width$}", "", "");
    for s in EventStream::ALL {
        header.push_str(&format!(" {:>width$}", stream_name(s)));
    }
    let _ = writeln!(out, "{}", header.trim_end());
    for row in EventStream::ALL {
        let mut line = format!("{:12}{:<width$}", "", stream_name(row));
        for col in EventStream::ALL {
            let v = a.evd_stream_merging[row.index()][col.index()];
            line.push_str(&format!(" {:>width$}", yes_no(v)));
        }
        let _ = writeln!(out, "{line}");
    }
    if !a.provider_specific_attr.is_empty() {
        let _ = writeln!(out, "        provider_specific_attr:");
        for n in &a.provider_specific_attr {
            field(out, 12, &n.name, &n.value);
        }
    }
}

fn ia_attrs(out: &mut String, a: &IaAttr) {
    let _ = writeln!(out, "    ia_attr:");
    field(out, 8, "adapter_name", &a.adapter_name);
    field(out, 8, "vendor_name", &a.vendor_name);
    field(out, 8, "address", a.address);
    field(out, 8, "max_eps", a.max_eps);
    field(out, 8, "max_dto_per_ep", a.max_dto_per_ep);
    field(out, 8, "max_rdma_read_per_ep", a.max_rdma_read_per_ep);
    field(out, 8, "max_evds", a.max_evds);
    field(out, 8, "max_evd_qlen", a.max_evd_qlen);
    field(
        out,
        8,
        "max_iov_segments_per_dto",
        a.max_iov_segments_per_dto,
    );
    field(out, 8, "max_lmrs", a.max_lmrs);
    field(out, 8, "max_lmr_block_size", bytes(a.max_lmr_block_size));
    field(out, 8, "max_pzs", a.max_pzs);
    field(out, 8, "max_message_size", bytes(a.max_message_size));
    field(out, 8, "max_rdma_size", bytes(a.max_rdma_size));
    field(out, 8, "max_rmrs", a.max_rmrs);
    field(
        out,
        8,
        "max_private_data_size",
        bytes(a.max_private_data_size as u64),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(bytes(512), "512");
        assert_eq!(bytes(1 << 30), "1073741824 (1 GiB)");
        assert_eq!(bytes(3 << 20), "3145728 (3 MiB)");
        assert_eq!(
            completion_flags(0x0f),
            "0x0f [SUPPRESS | SOLICITED_WAIT | UNSIGNALLED | BARRIER_FENCE]"
        );
        assert_eq!(completion_flags(0), "0x00 [DEFAULT]");
        assert_eq!(completion_flags(0x31), "0x31 [SUPPRESS | 0x30]");
    }
}
