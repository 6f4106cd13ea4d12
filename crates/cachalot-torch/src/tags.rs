//! Tags on recorded events. While history is recorded, the C++ allocator
//! tags each call it makes into the library with an id under which it keeps
//! what PyTorch records with an event (the Python stack, the compile context,
//! the user's metadata); every event the call causes carries the id into the
//! snapshot's trace rows, where the C++ side puts them back.

use std::cell::Cell;
use std::sync::Arc;

use cachalot::event::{Observer, TraceEvent};
use cachalot::history::History;

thread_local! {
    /// The tag of the call this thread is making (0: none).
    static TAG: Cell<u64> = const { Cell::new(0) };
}

/// A device's recorder, recording each event with the tag of the call that
/// caused it (the allocator calls its observer on the calling thread).
#[derive(Debug)]
pub(crate) struct Tagged(pub(crate) Arc<History>);

impl Observer for Tagged {
    fn on_event(&self, event: &TraceEvent) {
        self.0.record(event, TAG.try_with(Cell::get).unwrap_or(0));
    }
}

/// Tags this thread's calls with `tag` until the next call of this function
/// (0: untagged).
#[no_mangle]
pub extern "C" fn cachalot_set_event_tag(tag: u64) {
    // A thread being torn down has no tag to set.
    let _ = TAG.try_with(|t| t.set(tag));
}

#[cfg(test)]
mod tests {
    use cachalot::event::Action;
    use cachalot::history::HistoryConfig;
    use cachalot::StreamId;

    use super::*;

    #[test]
    fn events_carry_the_tag_of_their_thread() {
        let history = Arc::new(History::new(HistoryConfig::default()));
        let tagged = Tagged(history.clone());
        let event = TraceEvent {
            time_us: 0,
            action: Action::Alloc,
            addr: 1,
            size: 1,
            stream: StreamId::DEFAULT,
        };
        cachalot_set_event_tag(5);
        tagged.on_event(&event);
        std::thread::scope(|s| {
            s.spawn(|| tagged.on_event(&event));
        });
        cachalot_set_event_tag(0);
        tagged.on_event(&event);
        let tags: Vec<u64> = history.events().iter().map(|r| r.tag).collect();
        assert_eq!(tags, [5, 0, 0]);
    }
}
