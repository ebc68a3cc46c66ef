//! The boxed future of an async trait method written out by hand (what
//! `#[async_trait]` writes), for the futures that are passed around.

use std::future::Future;
use std::pin::Pin;

/// A boxed, sendable future borrowing for `'a`.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
