//! # rdapl: the DAT 2.0 Direct Access Transport in Rust
//!
//! The crate applications use: everything of the core ([`rdapl_core`],
//! re-exported here whole, at the same paths) and the providers this crate
//! was built with.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub use rdapl_core::*;
