//! rdapl's DAT names and values against the real DAT 2.0 headers.
//!
//! Parses `dat_error.h` and `dat.h` (default `/usr/include/dat2`, or the
//! directory in `RDAPL_DAT_INCLUDE`) and checks, by name, that every value of
//! `Subtype`, `DatType`, `EventNumber`, `DtoStatus`, `DtoOp`, `EvdFlags` (and a
//! few neighbours) equals the header's. Without the headers the tests print
//! why and pass, unless `RDAPL_REQUIRE_EXTERNAL=1`, in which case they fail.

use rdapl::error::{DatType, Subtype};
use rdapl::event::{AsyncErrorKind, ConnectionEventKind, DAT_EVD_OVERFLOW_ERROR};
use rdapl::{DatReturn, DtoOp, DtoStatus, EvdFlags, EventNumber, EventStream, UpcallPolicy};
use std::collections::HashMap;
use std::path::PathBuf;

// ----- a small C enum/#define reader ---------------------------------------------

/// One `enum { ... }` of a header: its typedef name (or tag) and its entries
/// in order, with values where they could be evaluated.
#[derive(Debug)]
struct CEnum {
    name: String,
    entries: Vec<(String, Option<i64>)>,
}

#[derive(Debug, Default)]
struct Header {
    enums: Vec<CEnum>,
    /// Every enumerator and numeric `#define`, by name.
    values: HashMap<String, i64>,
}

impl Header {
    fn enum_named(&self, name: &str) -> &CEnum {
        self.enums
            .iter()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("enum {name} not found in the headers"))
    }

    fn value(&self, name: &str) -> i64 {
        *self
            .values
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not defined by the DAT headers"))
    }
}

fn strip_comments(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let b = src.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'*' {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
            out.push(' ');
        } else if b[i] == b'/' && i + 1 < b.len() && b[i + 1] == b'/' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// Drops preprocessor lines and the lines of inactive conditional blocks.
/// Nothing is defined on the command line, so `DAT_EXTENSIONS` (and every
/// other `#ifdef NAME`) is off; `#ifndef` guards are on. Numeric `#define`s
/// of active blocks are returned separately.
fn preprocess(src: &str) -> (String, Vec<(String, String)>) {
    let mut active: Vec<bool> = Vec::new();
    let mut out = String::new();
    let mut defines = Vec::new();
    let mut lines = src.lines();
    while let Some(line) = lines.next() {
        let mut line = line.to_string();
        while line.ends_with('\\') {
            line.pop();
            line.push_str(lines.next().unwrap_or(""));
        }
        let t = line.trim_start();
        let on = active.iter().all(|&a| a);
        if let Some(rest) = t.strip_prefix('#') {
            let rest = rest.trim_start();
            let word = rest.split_whitespace().next().unwrap_or("");
            let arg = rest[word.len()..].trim();
            match word {
                "ifdef" => active.push(false),
                "ifndef" => active.push(true),
                "if" => active.push(!arg.contains("DAT_EXTENSIONS") && arg != "0"),
                "elif" | "else" => {
                    if let Some(top) = active.last_mut() {
                        *top = !*top;
                    }
                }
                "endif" => {
                    active.pop();
                }
                "define" if on => {
                    let mut it = arg.splitn(2, char::is_whitespace);
                    let name = it.next().unwrap_or("").to_string();
                    let val = it.next().unwrap_or("").trim().to_string();
                    if !name.contains('(') && !val.is_empty() {
                        defines.push((name, val));
                    }
                }
                _ => {}
            }
            out.push('\n');
        } else if on {
            out.push_str(&line);
            out.push('\n');
        } else {
            out.push('\n');
        }
    }
    (out, defines)
}

fn tokenize(src: &str) -> Vec<String> {
    let mut toks = Vec::new();
    let cs: Vec<char> = src.chars().collect();
    let mut i = 0;
    while i < cs.len() {
        let c = cs[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphanumeric() || c == '_' {
            let s = i;
            while i < cs.len() && (cs[i].is_ascii_alphanumeric() || cs[i] == '_') {
                i += 1;
            }
            toks.push(cs[s..i].iter().collect());
        } else if c == '<' && i + 1 < cs.len() && cs[i + 1] == '<' {
            toks.push("<<".into());
            i += 2;
        } else {
            toks.push(c.to_string());
            i += 1;
        }
    }
    toks
}

fn parse_int(t: &str) -> Option<i64> {
    let t = t.trim_end_matches(['u', 'U', 'l', 'L']);
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        i64::from_str_radix(h, 16).ok()
    } else if t.len() > 1 && t.starts_with('0') {
        i64::from_str_radix(&t[1..], 8).ok()
    } else {
        t.parse().ok()
    }
}

/// Evaluates a constant expression of literals, known names, parentheses,
/// unary minus, `|`, `+`, `-` and `<<`. `None` if anything else appears.
fn eval(toks: &[String], known: &HashMap<String, i64>) -> Option<i64> {
    fn primary(t: &[String], i: &mut usize, k: &HashMap<String, i64>) -> Option<i64> {
        let tok = t.get(*i)?;
        *i += 1;
        match tok.as_str() {
            "(" => {
                let v = expr(t, i, k)?;
                (t.get(*i)? == ")").then_some(())?;
                *i += 1;
                Some(v)
            }
            "-" => primary(t, i, k).map(|v| -v),
            "UINT64_C" | "UINT32_C" => primary(t, i, k),
            s if s.starts_with(|c: char| c.is_ascii_digit()) => parse_int(s),
            s => k.get(s).copied(),
        }
    }
    fn expr(t: &[String], i: &mut usize, k: &HashMap<String, i64>) -> Option<i64> {
        let mut v = primary(t, i, k)?;
        while let Some(op) = t.get(*i) {
            match op.as_str() {
                "|" | "+" | "-" | "<<" => {
                    *i += 1;
                    let r = primary(t, i, k)?;
                    v = match op.as_str() {
                        "|" => v | r,
                        "+" => v + r,
                        "-" => v - r,
                        _ => v << r,
                    };
                }
                _ => break,
            }
        }
        Some(v)
    }
    let mut i = 0;
    let v = expr(toks, &mut i, known)?;
    (i == toks.len()).then_some(v)
}

fn parse_header_text(src: &str, h: &mut Header) {
    let (code, defines) = preprocess(&strip_comments(src));
    let toks = tokenize(&code);
    let mut i = 0;
    while i < toks.len() {
        if toks[i] != "enum" {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        let tag = if toks.get(j).is_some_and(|t| t != "{") {
            j += 1;
            Some(toks[j - 1].clone())
        } else {
            None
        };
        if toks.get(j).map(String::as_str) != Some("{") {
            i = j;
            continue;
        }
        let close = j + toks[j..]
            .iter()
            .position(|t| t == "}")
            .expect("unclosed enum");
        let body = &toks[j + 1..close];
        let mut entries = Vec::new();
        let mut next: Option<i64> = Some(0);
        for item in body.split(|t| t == ",") {
            if item.is_empty() {
                continue;
            }
            let name = item[0].clone();
            let val = if item.len() > 2 && item[1] == "=" {
                eval(&item[2..], &h.values)
            } else {
                next
            };
            if let Some(v) = val {
                h.values.insert(name.clone(), v);
            }
            entries.push((name, val));
            next = val.map(|v| v + 1);
        }
        let typedef = toks
            .get(close + 1)
            .filter(|t| t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
            .cloned();
        let name = typedef.or(tag).unwrap_or_default();
        h.enums.push(CEnum { name, entries });
        i = close + 1;
    }
    for (name, val) in defines {
        if let Some(v) = eval(&tokenize(&val), &h.values) {
            h.values.entry(name).or_insert(v);
        }
    }
}

/// The parsed headers, or `None` (with the reason printed) when they are
/// absent and not required.
fn headers() -> Option<Header> {
    let dir = PathBuf::from(
        std::env::var("RDAPL_DAT_INCLUDE").unwrap_or_else(|_| "/usr/include/dat2".into()),
    );
    let required = std::env::var("RDAPL_REQUIRE_EXTERNAL").is_ok_and(|v| v == "1");
    let mut h = Header::default();
    // dat_error.h first: dat.h includes it and may refer to its names.
    for f in ["dat_error.h", "dat.h"] {
        let p = dir.join(f);
        match std::fs::read_to_string(&p) {
            Ok(src) => parse_header_text(&src, &mut h),
            Err(e) => {
                let msg = format!("DAT header {} not available ({e})", p.display());
                if required {
                    panic!("{msg}, and RDAPL_REQUIRE_EXTERNAL=1");
                }
                eprintln!("skipping: {msg}; set RDAPL_REQUIRE_EXTERNAL=1 to make this a failure");
                return None;
            }
        }
    }
    Some(h)
}

/// `InvalidStateEvdWaiter` -> `INVALID_STATE_EVD_WAITER`.
fn screaming(camel: &str) -> String {
    let mut s = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            s.push('_');
        }
        s.push(c.to_ascii_uppercase());
    }
    s
}

fn all_subtypes() -> Vec<Subtype> {
    (0..=u16::MAX).filter_map(Subtype::from_u16).collect()
}

fn all_types() -> Vec<DatType> {
    (0..=0x3FFFu32)
        .filter_map(|t| DatType::from_u32(t << 16))
        .collect()
}

// ----- the reader itself ----------------------------------------------------------

#[test]
fn reader_handles_implicit_values_expressions_and_extensions() {
    let src = r#"
        #define BASE 0x10 /* c */
        #define SHIFTED (BASE << 2)
        typedef enum e_tag
        {
            A,            /* 0 */
            B = 5,        // explicit
            C,            /* 6, implicit */
            D = (B | 0x100),
        #ifdef DAT_EXTENSIONS
            ,X = 99
        #endif
            E = -1
        } E_T;
        enum loose { P = 3, Q };
    "#;
    let mut h = Header::default();
    parse_header_text(src, &mut h);
    let e = h.enum_named("E_T");
    let names: Vec<&str> = e.entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["A", "B", "C", "D", "E"]);
    assert_eq!(h.value("A"), 0);
    assert_eq!(h.value("C"), 6);
    assert_eq!(h.value("D"), 0x105);
    assert_eq!(h.value("E"), -1);
    assert_eq!(h.value("Q"), 4);
    assert_eq!(h.enum_named("loose").entries.len(), 2);
    assert_eq!(h.value("SHIFTED"), 0x40);
    assert!(!h.values.contains_key("X"));
    assert_eq!(screaming("InvalidHandle10"), "INVALID_HANDLE10");
    assert_eq!(screaming("NoSubtype"), "NO_SUBTYPE");
}

// ----- rdapl against the headers -------------------------------------------------

#[test]
fn return_codes_layout_matches_dat_error_h() {
    let Some(h) = headers() else { return };
    assert_eq!(h.value("DAT_CLASS_ERROR") as u32, DatReturn::CLASS_ERROR);
    assert_eq!(
        h.value("DAT_CLASS_WARNING") as u32,
        DatReturn::CLASS_WARNING
    );
    assert_eq!(h.value("DAT_TYPE_MASK") as u32, DatReturn::TYPE_MASK);
    assert_eq!(h.value("DAT_SUBTYPE_MASK") as u32, DatReturn::SUBTYPE_MASK);
    assert_eq!(h.value("DAT_SUCCESS") as u32, DatReturn::SUCCESS.0);
}

#[test]
fn every_dat_type_matches_dat_error_h() {
    let Some(h) = headers() else { return };
    let types = all_types();
    assert!(!types.is_empty());
    for t in &types {
        let name = format!("DAT_{}", screaming(&format!("{t:?}")));
        assert_eq!(h.value(&name), *t as u32 as i64, "DatType::{t:?} vs {name}");
        assert_eq!(DatType::from_u32(*t as u32), Some(*t));
    }
    // And every return type of the header has a DatType.
    let header = h.enum_named("DAT_RETURN_TYPE");
    let known: Vec<i64> = types.iter().map(|t| *t as u32 as i64).collect();
    for (name, v) in &header.entries {
        let v = v.unwrap_or_else(|| panic!("{name} has no value"));
        assert!(known.contains(&v), "{name} = {v:#x} has no rdapl DatType");
    }
    assert_eq!(types.len(), header.entries.len());
}

#[test]
fn every_subtype_matches_dat_error_h() {
    let Some(h) = headers() else { return };
    let subs = all_subtypes();
    for s in &subs {
        let name = format!("DAT_{}", screaming(&format!("{s:?}")));
        assert_eq!(h.value(&name), *s as u16 as i64, "Subtype::{s:?} vs {name}");
    }
    let header = h.enum_named("DAT_RETURN_SUBTYPE");
    assert_eq!(
        subs.len(),
        header.entries.len(),
        "rdapl and dat_error.h list a different number of subtypes"
    );
    for (i, (name, v)) in header.entries.iter().enumerate() {
        assert_eq!(*v, Some(i as i64), "{name}");
        let s = Subtype::from_u16(i as u16).unwrap_or_else(|| panic!("{name} has no Subtype"));
        assert_eq!(format!("DAT_{}", screaming(&format!("{s:?}"))), *name);
    }
    // DAT_INVALID_ARGn helper.
    for n in 1..=10u8 {
        let s = Subtype::invalid_arg(n);
        assert_eq!(h.value(&format!("DAT_INVALID_ARG{n}")), s as u16 as i64);
    }
}

fn event_number_name(n: EventNumber) -> String {
    let dbg = format!("{n:?}");
    match dbg.as_str() {
        "DtoCompletion" => "DAT_DTO_COMPLETION_EVENT".into(),
        "RmrBindCompletion" => "DAT_RMR_BIND_COMPLETION_EVENT".into(),
        "ConnectionRequest" => "DAT_CONNECTION_REQUEST_EVENT".into(),
        "Software" => "DAT_SOFTWARE_EVENT".into(),
        s => {
            if let Some(rest) = s.strip_prefix("Connection") {
                format!("DAT_CONNECTION_EVENT_{}", screaming(rest))
            } else if let Some(rest) = s.strip_prefix("Async") {
                format!("DAT_ASYNC_ERROR_{}", screaming(rest))
            } else {
                panic!("no DAT name rule for EventNumber::{s}")
            }
        }
    }
}

#[test]
fn every_event_number_matches_dat_h() {
    let Some(h) = headers() else { return };
    let header = h.enum_named("DAT_EVENT_NUMBER");
    assert!(!header.entries.is_empty());
    for n in EventNumber::ALL {
        let name = event_number_name(*n);
        assert_eq!(
            h.value(&name),
            n.to_dat() as i64,
            "EventNumber::{n:?} vs {name}"
        );
        assert!(
            header.entries.iter().any(|(e, _)| *e == name),
            "{name} not in DAT_EVENT_NUMBER"
        );
    }
    for k in ConnectionEventKind::ALL {
        let name = format!("DAT_CONNECTION_EVENT_{}", screaming(&format!("{k:?}")));
        assert_eq!(
            h.value(&name),
            k.to_dat() as i64,
            "ConnectionEventKind::{k:?}"
        );
    }
    for k in AsyncErrorKind::ALL {
        let name = format!("DAT_ASYNC_ERROR_{}", screaming(&format!("{k:?}")));
        assert_eq!(h.value(&name), k.to_dat() as i64, "AsyncErrorKind::{k:?}");
    }
    assert_eq!(
        h.value("DAT_EVD_OVERFLOW_ERROR"),
        DAT_EVD_OVERFLOW_ERROR as i64
    );
}

#[test]
fn every_dto_status_matches_dat_h() {
    let Some(h) = headers() else { return };
    for s in DtoStatus::ALL {
        let name = match s {
            DtoStatus::Success => "DAT_DTO_SUCCESS".to_string(),
            DtoStatus::RmrOperationFailed => "DAT_RMR_OPERATION_FAILED".to_string(),
            other => format!("DAT_DTO_ERR_{}", screaming(&format!("{other:?}"))),
        };
        assert_eq!(
            h.value(&name),
            s.to_dat() as i64,
            "DtoStatus::{s:?} vs {name}"
        );
    }
    let header = h.enum_named("DAT_DTO_COMPLETION_STATUS");
    assert_eq!(DtoStatus::ALL.len(), header.entries.len());
    for (name, v) in &header.entries {
        let v = v.unwrap_or_else(|| panic!("{name} has no value"));
        assert!(
            DtoStatus::from_dat(v as u32).is_some(),
            "{name} = {v} has no DtoStatus"
        );
    }
}

#[test]
fn every_dto_op_matches_dat_h() {
    let Some(h) = headers() else { return };
    for o in DtoOp::ALL {
        let name = format!("DAT_DTO_{}", screaming(&format!("{o:?}")));
        assert_eq!(h.value(&name), o.to_dat() as i64, "DtoOp::{o:?} vs {name}");
    }
    let header = h.enum_named("DAT_DTOS");
    assert_eq!(DtoOp::ALL.len(), header.entries.len(), "{header:?}");
}

#[test]
fn every_evd_flag_matches_dat_h() {
    let Some(h) = headers() else { return };
    let table = [
        ("DAT_EVD_SOFTWARE_FLAG", EvdFlags::SOFTWARE),
        ("DAT_EVD_CR_FLAG", EvdFlags::CR),
        ("DAT_EVD_DTO_FLAG", EvdFlags::DTO),
        ("DAT_EVD_CONNECTION_FLAG", EvdFlags::CONNECTION),
        ("DAT_EVD_RMR_BIND_FLAG", EvdFlags::RMR_BIND),
        ("DAT_EVD_ASYNC_FLAG", EvdFlags::ASYNC),
        ("DAT_EVD_DEFAULT_FLAG", EvdFlags::DEFAULT),
    ];
    for (name, f) in table {
        assert_eq!(h.value(name), f.bits() as i64, "{name}");
    }
    let header = h.enum_named("DAT_EVD_FLAGS");
    assert_eq!(header.entries.len(), table.len(), "{header:?}");
    // Each stream's flag, and ALL = every stream.
    let mut all = 0;
    for s in EventStream::ALL {
        all |= s.flag().bits();
        assert!(table.iter().any(|(_, f)| *f == s.flag()), "{s:?}");
    }
    assert_eq!(EvdFlags::ALL.bits(), all);
    assert_eq!(
        EvdFlags::ALL.bits() as i64,
        h.value("DAT_EVD_DEFAULT_FLAG") | h.value("DAT_EVD_SOFTWARE_FLAG")
    );
}

/// `kdat.h` is not installed with the uDAPL headers; these are its values
/// as quoted in the reference notes (dat-semantics.md, section 2.4).
#[test]
fn upcall_policy_values_match_kdat_h() {
    let table = [
        (UpcallPolicy::Disable, 0),
        (UpcallPolicy::SingleInstance, 1),
        (UpcallPolicy::Many, 100),
        (UpcallPolicy::Teardown, -1),
        (UpcallPolicy::NotifyOnly, 2),
    ];
    for (p, v) in table {
        assert_eq!(p.to_dat(), v, "{p:?}");
        assert_eq!(UpcallPolicy::from_dat(v), Some(p));
    }
    assert_eq!(UpcallPolicy::from_dat(3), None);
}
