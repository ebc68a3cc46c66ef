//! Replayable bodies: a streamed request body is kept as it is sent, up to
//! the policy's per-call limit and within its client-wide cap, so that a
//! retry or a hedge sends the same bytes again (gRPC's replay buffer). A
//! retry replays what was kept, then goes on reading the caller's stream
//! where the last attempt left it. A body that outgrows the limit is sent
//! on, once: the call is committed, and stops with
//! `StopReason::BodyTooLargeToReplay`. A call that finds no room under
//! the cap is sent as if there were no buffer (`body_not_cloneable`).
//!
//! A request the safety rule will not send again once it may have arrived
//! (an unkeyed POST) keeps nothing: its body is wrapped only so that, after
//! a failure that proves it never left (a connect error), the next attempt
//! can read the caller's stream from its start.
//!
//! A hedge sent while the first copy is still reading the caller's stream
//! replays what was kept and then follows it, chunk by chunk: only one
//! attempt at a time reads the stream (the others wait for its chunks), so
//! a hedge of a long upload goes no faster than its first copy's reads.
//! Once the buffer has let go of the body's start, only the copy reading
//! the stream can go on: the others fail with `not_kept`, and the hedge
//! race drops them (nor is a hedge sent then; `HedgeConfig` says what
//! hedging does to replay and the other features).
//!
//! A [`BodySource`] makes the body afresh for each attempt instead (a file
//! reopened), at any size and with no buffer.
//!
//! A body that is not a stream (bytes, JSON, a form) is copied as reqwest
//! copies it: nothing here is allocated for it.
//!
//! It sits on the lowest floor because it names nothing else of the crate:
//! the middleware's attempt and judge, and the policy (which holds the
//! client-wide [`ReplayMemory`]), all speak of it.

use std::error::Error;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use hyper::body::{Body as HttpBody, Frame, SizeHint};
use reqwest::{Body, Request};

/// Makes a request's body afresh for each attempt, so that a body of any
/// size can be retried (and hedged) with no replay buffer: a file reopened
/// at its start, a multipart form rebuilt. Pass it in the request's
/// extensions; the body it makes replaces the request's own on every
/// attempt, and it is called only for an attempt that is sent. With
/// reqwest's `stream` feature, `Body::wrap_stream` over a `tokio::fs::File`
/// opened in the closure streams a file of any size.
///
/// ```no_run
/// use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
/// use reqwest_safe_retry::replay::BodySource;
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
///     .with(RetryMiddleware::new(RetryPolicy::default()))
///     .build();
/// let source = BodySource::new(|| reqwest::Body::from(std::fs::read("export.csv").unwrap_or_default()));
/// client
///     .put("http://files.internal/export.csv")
///     .with_extension(source)
///     .send()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct BodySource(Arc<dyn Fn() -> Body + Send + Sync>);

impl BodySource {
    /// A source that calls `make` once per attempt.
    pub fn new(make: impl Fn() -> Body + Send + Sync + 'static) -> Self {
        BodySource(Arc::new(make))
    }

    fn body(&self) -> Body {
        (self.0)()
    }
}

impl fmt::Debug for BodySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BodySource")
    }
}

/// Locks a mutex, recovering the data if a panicking thread poisoned it:
/// the state guarded here stays consistent after every statement.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The bytes the replay buffers of one policy's calls hold together, and
/// the most they ever held.
#[derive(Debug, Default)]
pub(crate) struct ReplayMemory {
    used: AtomicUsize,
    peak: AtomicUsize,
}

impl ReplayMemory {
    /// Takes room for `n` more bytes, if the total stays within `cap`.
    pub(crate) fn reserve(&self, n: usize, cap: usize) -> bool {
        let taken = self
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|total| *total <= cap)
            });
        match taken {
            Ok(before) => {
                self.peak.fetch_max(before + n, Ordering::AcqRel);
                true
            }
            Err(_) => false,
        }
    }

    /// The bytes held now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// The most bytes ever held at once.
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::Acquire)
    }

    /// Gives back room for `n` bytes.
    pub(crate) fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// Why a kept body cannot be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    /// It outgrew the per-call limit.
    TooLarge,
    /// The client-wide cap had no room, or the stream failed or sent a
    /// frame that is not data: it is sent as if it had no buffer.
    NotKept,
}

/// The replay buffer of one call.
#[derive(Clone)]
pub(crate) struct Handle(Arc<Replay>);

impl Handle {
    /// Why the body cannot be sent again, if it cannot.
    pub(crate) fn lost(&self) -> Option<Lost> {
        lock(&self.0.state).lost
    }
}

/// How much a call may keep: the per-call limit, the client-wide cap, and
/// the memory the cap bounds.
pub(crate) struct Limits<'a> {
    pub(crate) limit: usize,
    /// The safety rule lets the request be sent again after it may have
    /// arrived (idempotent, or keyed). When it does not, nothing is kept:
    /// the body is still wrapped, so that one whose sending never began (a
    /// connect error) can be sent by the next attempt.
    pub(crate) repeatable: bool,
    pub(crate) cap: usize,
    pub(crate) memory: &'a Arc<ReplayMemory>,
}

struct Replay {
    state: Mutex<State>,
    limit: usize,
    cap: usize,
    memory: Arc<ReplayMemory>,
    /// The whole body's length, when the caller's stream knew it.
    length: Option<u64>,
}

struct State {
    kept: Vec<Bytes>,
    kept_len: usize,
    /// The rest of the caller's stream: `None` while an attempt reads it,
    /// or once it ended.
    source: Option<Body>,
    ended: bool,
    /// Set once the body cannot be sent again: outgrown, no room, or a
    /// frame that is not data.
    lost: Option<Lost>,
    /// Attempts (hedges) waiting for the attempt that reads the stream.
    waiting: Vec<Waker>,
}

impl State {
    fn lose(&mut self, reason: Lost, memory: &ReplayMemory) {
        self.lost = Some(reason);
        memory.release(self.kept_len);
        self.kept = Vec::new();
        self.kept_len = 0;
    }

    fn wake(&mut self) {
        for waker in self.waiting.drain(..) {
            waker.wake();
        }
    }
}

impl Drop for Replay {
    fn drop(&mut self) {
        let kept = lock(&self.state).kept_len;
        self.memory.release(kept);
    }
}

/// Makes `request` replayable before an attempt another may follow: a
/// streamed body seen for the first time is wrapped so that what is sent
/// is kept (in `replay`). A body reqwest can copy is left alone.
// Inline: a request without a body (a GET's) or with bytes pays one test.
#[inline]
pub(crate) fn prepare(limits: Limits<'_>, request: &mut Request, replay: &mut Option<Handle>) {
    let streamed = request.body().is_some_and(|b| b.as_bytes().is_none());
    if streamed && limits.limit != 0 && replay.is_none() {
        keep_stream(limits, request, replay);
    }
}

/// [`prepare`] for a streamed body not kept yet, with a limit.
fn keep_stream(limits: Limits<'_>, request: &mut Request, replay: &mut Option<Handle>) {
    let Some(body) = request.body_mut().take() else {
        return;
    };
    let length = body.size_hint().exact();
    let shared = Arc::new(Replay {
        state: Mutex::new(State {
            kept: Vec::new(),
            kept_len: 0,
            source: Some(body),
            ended: false,
            lost: None,
            waiting: Vec::new(),
        }),
        limit: if limits.repeatable { limits.limit } else { 0 },
        cap: limits.cap,
        memory: limits.memory.clone(),
        length,
    });
    *request.body_mut() = Some(ReplayBody::start(&shared));
    *replay = Some(Handle(shared));
}

/// Gives `request` a body made by `source`, if there is one.
pub(crate) fn fill(request: &mut Request, source: Option<&BodySource>) {
    if let Some(source) = source {
        *request.body_mut() = Some(source.body());
    }
}

/// A copy of `request` for another attempt: reqwest's copy, or one whose
/// body replays the kept bytes, or, when `source` makes the body, one with
/// none yet ([`fill`] makes it when it is sent: a file is not opened for
/// an attempt that never comes). `None` when the body can be sent only
/// once.
pub(crate) fn copy(
    request: &mut Request,
    source: Option<&BodySource>,
    replay: Option<&Handle>,
) -> Option<Request> {
    if let Some(copy) = request.try_clone() {
        return Some(copy);
    }
    let body = match (source, replay) {
        (Some(_), _) => None,
        (None, Some(Handle(replay))) => Some(ReplayBody::start(replay)),
        (None, None) => return None,
    };
    // reqwest copies a request without a body (its extensions too, which
    // only it can reach).
    let own = request.body_mut().take();
    let copy = request.try_clone();
    *request.body_mut() = own;
    copy.map(|mut copy| {
        *copy.body_mut() = body;
        copy
    })
}

/// The body one attempt sends: the kept chunks, then the caller's stream.
struct ReplayBody {
    replay: Arc<Replay>,
    /// The next kept chunk to send.
    next: usize,
    sent: u64,
    /// The caller's stream, while this attempt reads it.
    source: Option<Body>,
}

/// The error of an attempt that must send bytes no longer kept.
#[derive(Debug)]
struct NotKept;

impl fmt::Display for NotKept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the request body outgrew its replay buffer")
    }
}

impl Error for NotKept {}

/// Whether `error` is (or was caused by) a copy's body that could not
/// follow the kept bytes: the copy could not go on, and says nothing of
/// its host.
pub(crate) fn not_kept(error: &reqwest_middleware::Error) -> bool {
    let first: &(dyn Error + 'static) = match error {
        reqwest_middleware::Error::Reqwest(e) => e,
        reqwest_middleware::Error::Middleware(e) => e.as_ref(),
    };
    std::iter::successors(Some(first), |&e| e.source()).any(|e| e.is::<NotKept>())
}

type Polled = Poll<Option<Result<Frame<Bytes>, Box<dyn Error + Send + Sync>>>>;

impl ReplayBody {
    fn start(replay: &Arc<Replay>) -> Body {
        Body::wrap(ReplayBody {
            replay: replay.clone(),
            next: 0,
            sent: 0,
            source: None,
        })
    }

    /// Keeps `data`, read from the caller's stream, if there is room.
    fn keep(&mut self, data: &Bytes) {
        let replay = &*self.replay;
        let mut state = lock(&replay.state);
        if state.lost.is_none() {
            let n = data.len();
            if state.kept_len.saturating_add(n) > replay.limit {
                state.lose(Lost::TooLarge, &replay.memory);
            } else if !replay.memory.reserve(n, replay.cap) {
                state.lose(Lost::NotKept, &replay.memory);
            } else {
                state.kept.push(data.clone());
                state.kept_len += n;
            }
        }
        self.next = state.kept.len();
        state.wake();
    }

    fn read_source(&mut self, cx: &mut Context<'_>) -> Polled {
        let Some(source) = self.source.as_mut() else {
            return Poll::Ready(None);
        };
        let frame = match Pin::new(source).poll_frame(cx) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(frame) => frame,
        };
        match frame {
            None => {
                self.source = None;
                let mut state = lock(&self.replay.state);
                state.ended = true;
                state.wake();
                Poll::Ready(None)
            }
            Some(Err(e)) => {
                self.source = None;
                let mut state = lock(&self.replay.state);
                state.lose(Lost::NotKept, &self.replay.memory);
                state.wake();
                Poll::Ready(Some(Err(e.into())))
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    self.keep(&data);
                    self.sent += data.len() as u64;
                    Poll::Ready(Some(Ok(Frame::data(data))))
                }
                Err(frame) => {
                    let mut state = lock(&self.replay.state);
                    state.lose(Lost::NotKept, &self.replay.memory);
                    state.wake();
                    Poll::Ready(Some(Ok(frame)))
                }
            },
        }
    }
}

impl HttpBody for ReplayBody {
    type Data = Bytes;
    type Error = Box<dyn Error + Send + Sync>;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        if this.source.is_some() {
            return this.read_source(cx);
        }
        let mut state = lock(&this.replay.state);
        if let Some(chunk) = state.kept.get(this.next).cloned() {
            this.next += 1;
            this.sent += chunk.len() as u64;
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        if state.lost.is_some() {
            return Poll::Ready(Some(Err(Box::new(NotKept))));
        }
        if state.ended {
            return Poll::Ready(None);
        }
        match state.source.take() {
            Some(source) => {
                drop(state);
                this.source = Some(source);
                this.read_source(cx)
            }
            None => {
                // Another attempt reads the stream: wait for its next chunk.
                state.waiting.push(cx.waker().clone());
                Poll::Pending
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.replay.length {
            Some(length) => SizeHint::with_exact(length.saturating_sub(self.sent)),
            None => SizeHint::default(),
        }
    }
}

impl Drop for ReplayBody {
    fn drop(&mut self) {
        // Every chunk read was kept: the stream goes back where the next
        // attempt's replay ends.
        if let Some(source) = self.source.take() {
            let mut state = lock(&self.replay.state);
            if state.lost.is_none() {
                state.source = Some(source);
            }
            state.wake();
            drop(state);
        }
    }
}
