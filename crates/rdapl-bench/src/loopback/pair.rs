//! A connected endpoint pair on the loopback provider, at two addresses
//! of its own, torn down when dropped.

use super::*;

/// One side: an IA, its protection zone, one DTO/connection EVD and one
/// endpoint using it for every stream.
pub(super) struct Side {
    pub(super) ia: Ia,
    pub(super) pz: Pz,
    pub(super) evd: Evd,
    pub(super) ep: Ep,
}

fn open_side(addr: &str, qlen: usize) -> rdapl::Result<Side> {
    let ia = Ia::open_with(
        "loopback",
        IaOptions {
            params: format!("addr={addr}"),
            ..Default::default()
        },
    )?;
    let rest = (|| {
        let pz = ia.pz_create()?;
        let evd = ia.evd_create(qlen, EvdFlags::DTO | EvdFlags::CONNECTION | EvdFlags::CR)?;
        let ep = ia.ep_create(&pz, Some(&evd), Some(&evd), Some(&evd), None)?;
        Ok((pz, evd, ep))
    })();
    match rest {
        Ok((pz, evd, ep)) => Ok(Side { ia, pz, evd, ep }),
        Err(e) => {
            let _ = ia.close(CloseFlags::Abrupt);
            Err(e)
        }
    }
}

/// A connected pair; dropping it disconnects and closes both IAs.
pub(super) struct Pair {
    pub(super) server: Side,
    pub(super) client: Side,
    pub(super) psp: Psp,
}

impl Pair {
    /// Opens both sides and connects them (server: accepts on a fresh
    /// connection qualifier).
    pub(super) fn connect(qlen: usize) -> Result<Pair, String> {
        static NEXT_QUAL: AtomicU64 = AtomicU64::new(0);
        let server = open_side(SERVER_ADDR, qlen).map_err(|e| format!("server IA: {e}"))?;
        let client = match open_side(CLIENT_ADDR, qlen) {
            Ok(c) => c,
            Err(e) => {
                let _ = server.ia.close(CloseFlags::Abrupt);
                return Err(format!("client IA: {e}"));
            }
        };
        let qual = 47_000 + NEXT_QUAL.fetch_add(1, Ordering::Relaxed);
        let psp = match server.ia.psp_create(qual, &server.evd) {
            Ok(p) => p,
            Err(e) => {
                for s in [&server, &client] {
                    let _ = s.ia.close(CloseFlags::Abrupt);
                }
                return Err(format!("psp_create: {e}"));
            }
        };
        // From here on, dropping `pair` tears everything down.
        let pair = Pair {
            server,
            client,
            psp,
        };
        let (s, c) = (&pair.server, &pair.client);
        c.ep.connect(s.ia.address(), qual, Some(SETUP_TIMEOUT), b"rdapl-bench")
            .map_err(|e| format!("connect: {e}"))?;
        let cr = match s.evd.wait(Some(SETUP_TIMEOUT), 1) {
            Ok((Event::ConnectionRequest(a), _)) => {
                s.ia.cr(a.cr).map_err(|e| format!("cr: {e}"))?
            }
            other => return Err(format!("expected a connection request, got {other:?}")),
        };
        cr.accept(&s.ep, b"").map_err(|e| format!("accept: {e}"))?;
        for (who, evd) in [("server", &s.evd), ("client", &c.evd)] {
            match evd.wait(Some(SETUP_TIMEOUT), 1) {
                Ok((Event::Connection(e), _)) if e.kind == ConnectionEventKind::Established => {}
                other => return Err(format!("{who}: expected Established, got {other:?}")),
            }
        }
        Ok(pair)
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = self.client.ep.disconnect(false);
        let _ = self.psp.free();
        for s in [&self.client, &self.server] {
            let _ = s.ep.free();
            let _ = s.ia.close(CloseFlags::Abrupt);
        }
    }
}
