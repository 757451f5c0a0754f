//! The provider registry: providers found by name, as `rdapl info` and
//! (later) `dat.conf` name them.
//!
//! A [`Registry`] is a plain value: an application may build its own,
//! register the providers it wants and open IAs from it. This crate knows
//! no provider by name: the `rdapl` crate, which applications use, holds
//! the registry of the providers it was built with (`rdapl::builtin()`,
//! the loopback provider its default, the name `""` or `"loopback"`), from
//! which its `Ia::open` opens. Provider settings live in provider
//! instances, never in the registry.

use crate::error::{Error, Result};
use crate::ia::{Ia, IaOptions};
use crate::provider::Provider;
use parking_lot::RwLock;
use std::fmt;
use std::sync::Arc;

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
    use crate::ia::{IaAttr, ProviderAttr};
    use crate::provider::Transport;
    use std::net::IpAddr;

    /// A provider that only has a name.
    struct Named(&'static str);

    impl Provider for Named {
        fn attr(&self) -> ProviderAttr {
            ProviderAttr {
                name: self.0.into(),
                ..ProviderAttr::default()
            }
        }
        fn ia_attr(&self, address: IpAddr) -> IaAttr {
            IaAttr {
                address,
                ..IaAttr::default()
            }
        }
        fn open(&self, _: Option<IpAddr>, _: &str) -> Result<Arc<dyn Transport>> {
            Err(Error::ModelNotSupported("a name only"))
        }
    }

    #[test]
    fn finds_by_name_with_the_first_the_default() {
        let r = Registry::new();
        assert!(r.get("").is_none());
        r.register(Arc::new(Named("first"))).unwrap();
        r.register(Arc::new(Named("second"))).unwrap();
        assert_eq!(r.names(), vec!["first".to_string(), "second".to_string()]);
        assert_eq!(r.get("").unwrap().attr().name, "first");
        assert_eq!(r.get("second").unwrap().attr().name, "second");
        assert!(r.get("tcp").is_none());
        assert!(matches!(
            r.open("tcp", IaOptions::default()),
            Err(Error::ProviderNotFound(n)) if n == "tcp"
        ));
        assert!(matches!(
            r.register(Arc::new(Named("first"))),
            Err(Error::InvalidParameter { arg: 1, .. })
        ));
        assert!(matches!(
            r.register(Arc::new(Named(""))),
            Err(Error::InvalidParameter { arg: 1, .. })
        ));
    }
}
