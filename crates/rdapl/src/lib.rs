//! # rdapl: the DAT 2.0 Direct Access Transport in Rust
//!
//! The crate applications use. It re-exports the core, [`rdapl_core`],
//! whole and at the same paths (events, errors, the EVD engine, the object
//! model, the provider interface: see its docs), and adds the providers it
//! was built with:
//!
//! * [`provider::loopback`] (the crate `rdapl-loopback`): the in-process
//!   loopback provider, the default;
//! * [`builtin()`]: the registry of those providers, from which
//!   [`Ia::open`](IaOpen::open) and [`Ia::open_with`](IaOpen::open_with)
//!   open an IA by name ([`IaOpen`], in scope with `use rdapl::*`).
//!
//! Other providers are values an application opens with
//! [`Ia::open_provider`], or registers in a [`Registry`] of its own (the
//! `rdapl` command adds the TCP provider, crate `rdapl-tcp`, that way).
//!
//! ```
//! use rdapl::*;
//! let ia = Ia::open("loopback").unwrap();
//! assert_eq!(ia.query().unwrap().1.name, "loopback");
//! assert_eq!(builtin().names(), ["loopback"]);
//! // A fabric of its own, as a value.
//! let own = Ia::open_provider(Loopback::new(), IaOptions::default()).unwrap();
//! assert_ne!(own.handle(), ia.handle());
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub use rdapl_core::*;
pub use rdapl_loopback::Loopback;

pub mod provider {
    //! Providers: the core's provider interface ([`rdapl_core::provider`],
    //! re-exported whole) and the providers this crate was built with.

    pub use rdapl_core::provider::*;
    /// The in-process loopback provider (the crate `rdapl-loopback`).
    pub use rdapl_loopback as loopback;
}

use std::sync::OnceLock;

/// A registry of the providers this crate was built with: a new loopback
/// instance (its own fabric), the default (the name `""` or `"loopback"`).
pub fn with_builtin() -> Registry {
    let r = Registry::new();
    r.register(Loopback::new())
        .expect("an empty registry takes a named provider");
    r
}

/// The registry [`Ia::open`](IaOpen::open) uses: the built-in providers
/// ([`with_builtin`]), made on first use. Its loopback instance is the
/// process's default in-process fabric.
pub fn builtin() -> &'static Registry {
    static BUILTIN: OnceLock<Registry> = OnceLock::new();
    BUILTIN.get_or_init(with_builtin)
}

/// Opening an IA by provider name, from [`builtin()`]: `Ia::open("loopback")`.
/// In scope with `use rdapl::*`, else `use rdapl::IaOpen`.
pub trait IaOpen: Sized {
    /// Opens an IA of the named provider with default options
    /// (`dat_ia_open`). `""` or `"loopback"` is the loopback provider;
    /// `ProviderNotFound` if there is none of that name.
    fn open(name: &str) -> Result<Self>;

    /// Opens an IA of the named provider with `opts`.
    fn open_with(name: &str, opts: IaOptions) -> Result<Self>;
}

impl IaOpen for Ia {
    fn open(name: &str) -> Result<Ia> {
        builtin().open(name, IaOptions::default())
    }

    fn open_with(name: &str, opts: IaOptions) -> Result<Ia> {
        builtin().open(name, opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_by_name_with_loopback_the_default() {
        let r = with_builtin();
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
        assert!(matches!(
            Ia::open("tcp"),
            Err(Error::ProviderNotFound(n)) if n == "tcp"
        ));
        assert_eq!(Ia::open("").unwrap().query().unwrap().1.name, "loopback");
    }
}
