//! The end of a middleware chain that answers `200 ok` without a socket, so
//! a chain ending here prices or checks its middlewares alone. Shared by the
//! tests and the benches (`benches/support` includes this file).

use http::Extensions;
use reqwest_middleware::{Middleware, Next};

/// A chain's end that answers `200 ok` without a socket.
pub struct Canned;

#[async_trait::async_trait]
impl Middleware for Canned {
    async fn handle(
        &self,
        _: reqwest::Request,
        _: &mut Extensions,
        _: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        Ok(reqwest::Response::from(http::Response::new("ok")))
    }
}
