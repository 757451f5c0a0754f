//! Publishing: pushing an event and waking whoever listens (a waiter,
//! an upcall run, a stream, a CNO).
//!
//! * While nobody listens a publish reads the state word and nothing
//!   else; the slow path runs only when a listener is armed.

use super::*;

/// Pushes one event (its slot is reserved) and tells whoever listens.
#[inline]
pub(super) fn publish(inner: &Arc<EvdInner>, ev: Event) {
    // The producer half of the Dekker pattern (`state.rs`): the state word
    // is read after the push's position is claimed and before the event is
    // written (`Storage::push_then`). While nobody listens, this read is the
    // whole publish; otherwise the slow path runs once the event is written.
    let attention = inner.storage.push_then(ev, || {
        state::needs_attention(State(inner.state.load(Ordering::SeqCst)))
    });
    if attention {
        publish_slow(inner);
    }
}

#[cold]
pub(super) fn publish_slow(inner: &Arc<EvdInner>) {
    let max_runs = inner.max_runs;
    let wake = match inner.update::<_, ()>(|s| Ok(state::publish(s, inner.storage.len(), max_runs)))
    {
        Ok(w) => w,
        Err(()) => return,
    };
    if wake.any() {
        act(inner, wake);
    }
}

pub(super) fn act(inner: &Arc<EvdInner>, wake: state::Wake) {
    for _ in 0..wake.runs {
        inner.dispatch.schedule(DispatchRun(inner.clone()));
    }
    if wake.waiter {
        inner.waiter.raise();
    }
    #[cfg(feature = "stream")]
    if wake.stream {
        {
            // Taken under the lock, woken after it (a waker may poll the
            // stream inline).
            let wakers = inner.stream_wakers.lock().take();
            crate::stream::wake_all(wakers);
        }
    }
    if wake.cno {
        let cno = inner.cno.lock().as_ref().map(|l| l.cno().clone());
        if let Some(cno) = cno {
            cno.trigger(inner.id);
        }
    }
}
