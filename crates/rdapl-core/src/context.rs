//! Consumer contexts (`DAT_CONTEXT`): one opaque 64-bit value per object
//! that the consumer sets and reads back (`dat_set_consumer_context`,
//! `dat_get_consumer_context`). rdapl never interprets it; the C ABI keeps
//! a pointer there.

use crate::sync::{AtomicU64, Ordering};

/// The context slot of one object (0 until set).
#[derive(Debug)]
pub(crate) struct ContextSlot(AtomicU64);

impl ContextSlot {
    pub(crate) fn new() -> ContextSlot {
        ContextSlot(AtomicU64::new(0))
    }

    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn set(&self, v: u64) {
        self.0.store(v, Ordering::Release);
    }
}

/// `consumer_context` / `set_consumer_context` for a public object type
/// whose slot is reached by `$slot` from `self`.
macro_rules! consumer_context {
    ($ty:ty, |$s:ident| $slot:expr) => {
        impl $ty {
            /// The consumer context (`dat_get_consumer_context`): 0 until
            /// set.
            pub fn consumer_context(&self) -> u64 {
                let $s = self;
                $slot.get()
            }

            /// Sets the consumer context (`dat_set_consumer_context`), an
            /// opaque value rdapl keeps for the consumer.
            pub fn set_consumer_context(&self, context: u64) {
                let $s = self;
                $slot.set(context)
            }
        }
    };
}
pub(crate) use consumer_context;
