//! The provider registry: providers found by name, as `rdapl info` and
//! (later) `dat.conf` name them.
//!
//! A [`Registry`] is a plain value: an application may build its own,
//! register the providers it wants and open IAs from it. [`Registry::builtin`]
//! is the one [`crate::Ia::open`] uses, with the providers this crate was
//! built with; the loopback provider is its embedded default (the name `""`
//! or `"loopback"`). Provider settings live in provider instances, never
//! in the registry.

use crate::error::{Error, Result};
use crate::ia::{Ia, IaOptions};
use crate::provider::Provider;
use crate::provider::loopback::Loopback;
use parking_lot::RwLock;
use std::fmt;
use std::sync::{Arc, OnceLock};

/// Named providers, the first one registered being the default.
pub struct Registry {
    providers: RwLock<Vec<Arc<dyn Provider>>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.names()).finish()
    }
}

impl Default for Registry {
    /// The same as [`Registry::new`]: no provider.
    fn default() -> Self {
        Registry::new()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry {
            providers: RwLock::new(Vec::new()),
        }
    }

    /// A registry with the providers built into this crate: a new loopback
    /// instance (its own fabric), the default.
    pub fn with_builtin() -> Registry {
        let r = Registry::new();
        r.providers.write().push(Loopback::new());
        r
    }

    /// The registry [`crate::Ia::open`] uses: the built-in providers, made
    /// on first use. Its loopback instance is the process's default
    /// in-process fabric.
    pub fn builtin() -> &'static Registry {
        static BUILTIN: OnceLock<Registry> = OnceLock::new();
        BUILTIN.get_or_init(Registry::with_builtin)
    }

    /// Adds a provider under its own name ([`crate::ProviderAttr::name`]).
    /// Refused with `InvalidParameter` if the name is empty or taken.
    pub fn register(&self, provider: Arc<dyn Provider>) -> Result<()> {
        let name = provider.attr().name;
        if name.is_empty() {
            return Err(Error::param(1, "a provider needs a name"));
        }
        let mut ps = self.providers.write();
        if ps.iter().any(|p| p.attr().name == name) {
            return Err(Error::param(1, "a provider of that name is registered"));
        }
        ps.push(provider);
        Ok(())
    }

    /// The provider called `name`; `""` is the default (the first one).
    pub fn get(&self, name: &str) -> Option<Arc<dyn Provider>> {
        let ps = self.providers.read();
        if name.is_empty() {
            return ps.first().cloned();
        }
        ps.iter().find(|p| p.attr().name == name).cloned()
    }

    /// Every provider, the default first.
    pub fn providers(&self) -> Vec<Arc<dyn Provider>> {
        self.providers.read().clone()
    }

    /// The names of the providers, the default first.
    pub fn names(&self) -> Vec<String> {
        self.providers
            .read()
            .iter()
            .map(|p| p.attr().name)
            .collect()
    }

    /// Opens an IA of the provider called `name` (`dat_ia_open`).
    /// `ProviderNotFound` if there is none.
    pub fn open(&self, name: &str, opts: IaOptions) -> Result<Ia> {
        let provider = self
            .get(name)
            .ok_or_else(|| Error::ProviderNotFound(name.to_string()))?;
        Ia::open_provider(provider, opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_by_name_with_loopback_the_default() {
        let r = Registry::with_builtin();
        assert_eq!(r.names(), vec!["loopback".to_string()]);
        assert_eq!(r.get("").unwrap().attr().name, "loopback");
        assert!(r.get("tcp").is_none());
        assert!(matches!(
            r.open("tcp", IaOptions::default()),
            Err(Error::ProviderNotFound(n)) if n == "tcp"
        ));
        assert!(matches!(
            r.register(Loopback::new()),
            Err(Error::InvalidParameter { arg: 1, .. })
        ));
        let empty = Registry::new();
        assert!(empty.get("").is_none());
        empty.register(Loopback::new()).unwrap();
        assert_eq!(empty.names(), vec!["loopback".to_string()]);
    }
}
