//! The conformance suite of rdapl providers.
//!
//! One suite checks what every provider must do under the DAT object
//! model: connection management and the endpoint state machine, every
//! DTO and its completion flags, flushes, memory registration and remote
//! access, SRQs, event streams and the teardown of every object. A case
//! never assumes a request completes inside the poster's call: it awaits
//! completions, so it runs unchanged on a provider with threads of its own
//! or a network between the ends.
//!
//! # Running it on a provider
//!
//! A provider crate adds `rdapl-conformance` as a dev-dependency and one
//! test target without the standard harness:
//!
//! ```toml
//! [[test]]
//! name = "conformance"
//! harness = false
//! ```
//!
//! ```no_run
//! // tests/conformance.rs
//! fn main() {
//!     # let my_provider = rdapl::builtin().get("loopback").unwrap();
//!     rdapl_conformance::Suite::new(my_provider)
//!         // Both ends of a connection in one process? (See below.)
//!         .in_process(false)
//!         .run()
//! }
//! ```
//!
//! A provider whose IAs need settings for the cases passes them with
//! [`Suite::ia_params`] (the tcp provider maps the cases' qualifiers, some
//! below 1024, to ports anyone may bind with `port_base=`), and the
//! parameters that make a Send without a receive fail quickly with
//! [`Suite::quick_rnr`], under which the random operation sequences of
//! `model_proptest` run on it.
//!
//! `cargo test` then runs every case, named `module::case`, with libtest's
//! options: a filter, `--exact`, `--skip`, `--list`, `--test-threads`,
//! `--nocapture`. All cases share one instance of the provider, so IAs of
//! the process reach each other; each case uses IA addresses of its own
//! (127.0/16 and 127.1/16), so cases run in parallel.
//!
//! Every IA opened by a case goes through a
//! [`FaultInjector`](rdapl::provider::FaultInjector) around the provider.
//! Cases of what only the loopback provider does (its fault injection
//! timing, its RNR time, requests executed inside the poster's call) print
//! `skipped on NAME: why` and pass elsewhere. One assertion depends on
//! [`Suite::in_process`]: when both ends are in one process, a disconnect
//! racing with sends must leave the two sides' successes equal; across a
//! network the sender's successes are at most the receiver's (iWARP has no
//! acknowledgement of a placed message).
//!
//! A provider whose Sends and RDMA Writes complete before the peer placed
//! them ([`ProviderAttr::completes_when_placed`](rdapl::ProviderAttr)
//! false: the TCP provider with `complete=sent`) runs the suite too: the
//! cases that read a target right after a Write completed wait for the
//! bytes there, and those that expect a remote error on the request that
//! caused it (a forged key, no receive, a full queue of sends the peer
//! holds back) print `skipped on NAME: assumes a completed Send or Write
//! was placed at the peer`.
//!
//! The cases are `#[case]` functions of this crate's `cases` modules; the
//! helpers they share are public in [`support`].
//!
//! One check needs a process of its own and runs outside the suite:
//! [`churn`], objects and connections made and ended hundreds of times,
//! after which the process must hold no more heap, descriptors or threads
//! than before. A provider crate runs it from a test target of its own.

#![forbid(unsafe_code)]
// The example's `fn main` is the point: it is the whole test target.
#![allow(clippy::needless_doctest_main)]

mod cases;
pub mod churn;
pub mod hosts;
pub mod pipe;
pub mod support;

use rdapl::provider::Provider;
use std::sync::Arc;

/// Marks a function of this crate as a case of the suite.
pub(crate) use rdapl_conformance_macros::case;

/// A registered case: its module path, name and body.
pub(crate) struct Case {
    module: &'static str,
    name: &'static str,
    run: fn(),
}

impl Case {
    pub(crate) const fn new(module: &'static str, name: &'static str, run: fn()) -> Case {
        Case { module, name, run }
    }

    /// `module::name`, the module relative to `cases`.
    fn full_name(&self) -> String {
        let m = self.module.rsplit("::").next().unwrap_or(self.module);
        format!("{m}::{}", self.name)
    }
}

inventory::collect!(Case);

/// Every registered case, by name (`module::case`), sorted.
fn sorted_cases() -> Vec<(String, fn())> {
    let mut v: Vec<(String, fn())> = inventory::iter::<Case>()
        .map(|c| (c.full_name(), c.run))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The suite, on one provider.
pub struct Suite {
    provider: Arc<dyn Provider>,
    in_process: bool,
    ia_params: String,
    quick_rnr: Option<String>,
}

impl Suite {
    /// The suite on `provider` (across a network unless
    /// [`in_process`](Suite::in_process) says otherwise).
    pub fn new(provider: Arc<dyn Provider>) -> Suite {
        Suite {
            provider,
            in_process: false,
            ia_params: String::new(),
            quick_rnr: None,
        }
    }

    /// Whether both ends of a connection live in this process, so what one
    /// side did the other knows at once (the loopback, pipe).
    pub fn in_process(mut self, yes: bool) -> Suite {
        self.in_process = yes;
        self
    }

    /// Parameters added to those of every IA the cases open on this
    /// provider (after its `addr=`): settings the cases' fixed qualifiers
    /// need, such as the tcp provider's `port_base` (qualifiers below 1024
    /// would be ports only root may bind).
    pub fn ia_params(mut self, params: &str) -> Suite {
        self.ia_params = params.to_string();
        self
    }

    /// IA parameters of this provider under which a Send that finds no
    /// posted receive fails within tens of milliseconds (`ReceiverNotReady`,
    /// the connection broken), as the loopback's RNR time does. The random
    /// operation sequences of `model_proptest` open their IAs with them;
    /// without, they run on the loopback only.
    pub fn quick_rnr(mut self, params: &str) -> Suite {
        self.quick_rnr = Some(params.to_string());
        self
    }

    /// The names of every case, sorted (`module::case`).
    pub fn case_names() -> Vec<String> {
        sorted_cases().into_iter().map(|(n, _)| n).collect()
    }

    /// Runs the cases the command line selects (libtest's arguments) and
    /// exits the process: 0 if every case passed, 101 otherwise.
    pub fn run(self) -> ! {
        let args = libtest_mimic::Arguments::from_args();
        let installed = support::UNDER_TEST
            .set(support::UnderTest {
                provider: self.provider,
                in_process: self.in_process,
                ia_params: self.ia_params,
                quick_rnr: self.quick_rnr,
            })
            .is_ok();
        assert!(installed, "one suite per process");
        let trials = sorted_cases()
            .into_iter()
            .map(|(name, run)| {
                libtest_mimic::Trial::test(name, move || {
                    run();
                    Ok(())
                })
            })
            .collect();
        libtest_mimic::run(&args, trials).exit()
    }
}

#[cfg(test)]
mod tests {
    use super::Suite;

    /// Every case registers itself once, under a unique name.
    #[test]
    fn cases_register_once_each() {
        let names = Suite::case_names();
        assert!(names.len() >= 100, "only {} cases", names.len());
        let mut d = names.clone();
        d.dedup();
        assert_eq!(d.len(), names.len(), "a name registered twice");
        assert!(
            names
                .iter()
                .any(|n| n == "model_dto::completions_and_data_in_post_order")
        );
    }
}
