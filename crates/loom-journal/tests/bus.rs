//! The memory bus through the `EventBus` port: the shared bus conformance suite, every
//! instance a clone of one bus (within one process).

use std::sync::Arc;

use loom_core::{BoxFuture, bus::EventBus};
use loom_journal::MemoryBus;

loom_testkit::bus_conformance!(memory, {
    let bus = MemoryBus::new();
    ((), move || {
        let bus: Arc<dyn EventBus> = Arc::new(bus.clone());
        Box::pin(async move { bus }) as BoxFuture<'static, Arc<dyn EventBus>>
    })
});
