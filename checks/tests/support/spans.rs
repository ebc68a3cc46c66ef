//! A tracing layer that records what it sees, for tests of the spans and
//! events the crate emits.

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// Fields as (name, value) pairs.
pub type Fields = Vec<(String, String)>;

/// What the subscriber saw: events, and each span's name with its fields as
/// they were at the end.
#[derive(Clone, Default)]
pub struct Seen {
    /// Each event's fields.
    pub events: Arc<Mutex<Vec<Fields>>>,
    /// Each span's id, name and fields.
    pub spans: Arc<Mutex<Vec<(u64, String, Fields)>>>,
}

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push((field.name().to_owned(), format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push((field.name().to_owned(), value.to_owned()));
    }
}

impl<S: tracing::Subscriber> Layer<S> for Seen {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut Collect(&mut fields));
        self.events.lock().unwrap().push(fields);
    }
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Collect(&mut fields));
        let name = attrs.metadata().name().to_owned();
        self.spans
            .lock()
            .unwrap()
            .push((id.into_u64(), name, fields));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut spans = self.spans.lock().unwrap();
        if let Some((_, _, fields)) = spans.iter_mut().find(|(i, _, _)| *i == id.into_u64()) {
            values.record(&mut Collect(fields));
        }
    }
}

/// The last value of field `name` in `fields`.
pub fn field(fields: &Fields, name: &str) -> String {
    fields
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no field {name} in {fields:?}"))
}
