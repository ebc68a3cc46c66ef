//! Reading a whole body into one [`Bytes`] within a limit: the request's
//! (to fingerprint it and hand it to the handler) and the response's (to
//! store it for replay).
//!
//! http-body-util's `Limited` and `collect()` do the same, but keep the
//! frames in a `VecDeque` and make room for trailers: an allocation per body
//! even when it is one frame, which nearly every request and response this
//! layer sees is. Here one data frame is returned as it came (no allocation,
//! no copy); only a body of several frames is copied into one buffer.
//! Trailers are read and dropped: the layer neither fingerprints nor
//! stores them, as before.

use std::fmt;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};

use bytes::{Bytes, BytesMut};
use http_body::Body;

use crate::request::context::BoxError;
use crate::request::inline::{drop_catching, poll_slot, Panicked};

/// Why a body could not be read whole.
#[derive(Debug)]
pub(crate) enum CollectError {
    /// Its data exceeds the limit (nothing past the limit was read).
    TooLarge,
    /// The body itself failed (a client that went away mid-body, a
    /// response stream that errored).
    Failed(BoxError),
}

impl fmt::Display for CollectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooLarge => f.write_str("length limit exceeded"),
            Self::Failed(err) => fmt::Display::fmt(err, f),
        }
    }
}

/// Reads `body` to its end; refuses it as soon as its data passes `limit`
/// bytes.
///
/// Borrowed, not taken: the caller drops the body. A response body is the
/// handler's code, read with its panics caught; had this future owned it, a
/// body whose destructor panics too would be dropped while a panic of its
/// `poll_frame` unwinds, and two panics at once abort the process.
pub(crate) async fn collect<B>(mut body: Pin<&mut B>, limit: usize) -> Result<Bytes, CollectError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut len = 0usize;
    while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|err| CollectError::Failed(err.into()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if data.is_empty() {
            continue;
        }
        len = len.saturating_add(data.len());
        if len > limit {
            return Err(CollectError::TooLarge);
        }
        match (&mut first, &mut joined) {
            (None, _) => first = Some(data),
            (Some(head), None) => {
                let mut buf = BytesMut::with_capacity(head.len() + data.len());
                buf.extend_from_slice(head);
                buf.extend_from_slice(&data);
                joined = Some(buf);
            }
            (Some(_), Some(buf)) => buf.extend_from_slice(&data),
        }
    }
    Ok(match (joined, first) {
        (Some(buf), _) => buf.freeze(),
        (None, Some(data)) => data,
        (None, None) => Bytes::new(),
    })
}

/// Reads a response body, the handler's code, catching its panics: a
/// stream that panics is `Err(Panicked)`. The body is held here and dropped
/// after the reading's future, with its destructor's panic caught as well
/// (logged): dropped while a panic of its stream unwinds, a destructor that
/// panics too would abort the process; after a read in full, its data is
/// the answer whatever the destructor does. A function returning an `async
/// move` block, not an `async fn`: the block uses the body in place
/// instead of holding a second copy (see `run::process`).
// The layout is the point, not an oversight.
#[allow(clippy::manual_async_fn)]
pub(crate) fn collect_catching<B>(
    body: B,
    limit: usize,
) -> impl Future<Output = Result<Result<Bytes, CollectError>, Panicked>> + Send
where
    B: Body<Data = Bytes> + Send,
    B::Error: Into<BoxError>,
{
    async move {
        let mut body = pin!(Some(body));
        let collected = {
            let mut reading = pin!(body.as_mut().as_pin_mut().map(|b| collect(b, limit)));
            poll_fn(|cx| poll_slot(reading.as_mut(), cx)).await
        };
        if drop_catching(body).is_err() {
            tracing::warn!("a response body panicked when it was dropped");
        }
        collected
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::pin::pin;
    use std::task::{Context, Poll};

    use http_body::Frame;
    use http_body_util::Full;

    use super::*;

    /// A body yielding the given frames (or errors), one per poll.
    struct Frames(VecDeque<Result<Frame<Bytes>, BoxError>>);

    fn frames(parts: &[&'static str], trailers: bool) -> Frames {
        let mut list: VecDeque<_> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        if trailers {
            list.push_back(Ok(Frame::trailers(http::HeaderMap::new())));
        }
        Frames(list)
    }

    impl Body for Frames {
        type Data = Bytes;
        type Error = BoxError;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
            Poll::Ready(self.0.pop_front())
        }
    }

    #[tokio::test]
    async fn one_frame_comes_back_as_it_was() {
        let data = Bytes::from_static(b"{\"amount\":10}");
        let got = collect(pin!(Full::new(data.clone())), 100).await.unwrap();
        assert_eq!(got, data);
        // The same buffer, not a copy.
        assert_eq!(got.as_ptr(), data.as_ptr());
    }

    #[tokio::test]
    async fn frames_are_joined_and_trailers_dropped() {
        let got = collect(pin!(frames(&["ab", "", "cd", "e"], true)), 5).await;
        assert_eq!(got.unwrap(), "abcde");
        let empty = collect(pin!(frames(&[], true)), 0).await;
        assert_eq!(empty.unwrap(), "");
    }

    #[tokio::test]
    async fn the_limit_is_inclusive_and_checked_across_frames() {
        assert!(collect(pin!(frames(&["abc", "de"], false)), 5)
            .await
            .is_ok());
        let over = collect(pin!(frames(&["abc", "def"], false)), 5).await;
        assert!(matches!(over, Err(CollectError::TooLarge)), "{over:?}");
        let one_big = collect(pin!(Full::new(Bytes::from_static(b"123456"))), 5).await;
        assert!(matches!(one_big, Err(CollectError::TooLarge)));
    }

    #[tokio::test]
    async fn a_failing_body_is_reported() {
        let mut failing = frames(&["x"], false);
        failing.0.push_back(Err("connection reset".into()));
        let err = collect(pin!(failing), 10).await.unwrap_err();
        assert!(matches!(err, CollectError::Failed(_)));
        assert_eq!(err.to_string(), "connection reset");
    }
}
