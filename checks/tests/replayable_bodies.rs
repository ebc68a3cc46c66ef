//! Replayable bodies (issue 46), over real sockets: a streamed body is kept
//! as it is sent, up to the per-call limit and within the client-wide cap,
//! and a retry sends the same bytes with the same key; a body that outgrows
//! the limit is sent once and the call is committed; a [`BodySource`]
//! makes the body afresh for each attempt, at any size. A hedge whose
//! body can no longer follow the first copy's costs only the hedge.

mod support;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Extensions;
use http_body_util::BodyExt;
use reqwest::Method;
use reqwest_middleware::{ClientBuilder, Middleware, Next};
use reqwest_safe_retry::hedging::HedgeConfig;
use reqwest_safe_retry::replay::BodySource;
use reqwest_safe_retry::time::{BoxFuture, ManualClock, Sleeper};
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReport, RetryReportExt, StopReason};
use support::uploads::{upload_server, Plan, Upload};
use support::{client, policy};
use tokio::sync::watch;

const MIB: usize = 1 << 20;
const CHUNK: usize = 64 * 1024;

/// `len` bytes no two runs of which repeat at a chunk's period.
fn payload(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 11)) as u8)
        .collect()
}

/// `bytes` as a stream of 64 KiB chunks, with no length given.
fn stream_of(bytes: &[u8]) -> reqwest::Body {
    let chunks: Vec<Result<Bytes, std::io::Error>> = bytes
        .chunks(CHUNK)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

/// FNV-1a: a checksum that sees every byte and its place.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

async fn send(
    policy: RetryPolicy,
    method: Method,
    url: String,
    body: Option<reqwest::Body>,
    source: Option<BodySource>,
) -> (Option<u16>, RetryReport) {
    let (c, _) = client(policy);
    let slot = reqwest_safe_retry::ReportSlot::new();
    let mut request = c.request(method, url).with_extension(slot.clone());
    if let Some(body) = body {
        request = request.body(body);
    }
    if let Some(source) = source {
        request = request.with_extension(source);
    }
    let status = request.send().await.ok().map(|r| r.status().as_u16());
    (status, slot.take().expect("the middleware fills the slot"))
}

fn complete(uploads: &[Upload]) -> Vec<&Upload> {
    uploads.iter().filter(|u| u.complete).collect()
}

#[tokio::test]
async fn a_keyed_10_mib_upload_reset_halfway_is_sent_again_byte_for_byte() {
    let data = payload(10 * MIB);
    let (addr, uploads) = upload_server(vec![Plan::ResetAfter(5 * MIB), Plan::Answer(200)]).await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .body_replay_limit(11 * MIB)
        .body_replay_cap(11 * MIB)
        .build()
        .unwrap();
    let (status, report) = send(
        p.clone(),
        Method::POST,
        format!("http://{addr}/upload"),
        Some(stream_of(&data)),
        None,
    )
    .await;
    assert_eq!(status, Some(200));
    assert_eq!(report.stop_reason(), StopReason::Success);
    assert_eq!(report.attempts(), 2);
    let uploads = uploads.all();
    assert_eq!(uploads.len(), 2);
    assert!(!uploads[0].complete, "the first was reset");
    assert!(uploads[0].body.len() >= 5 * MIB);
    assert_eq!(uploads[1].body.len(), data.len());
    assert_eq!(checksum(&uploads[1].body), checksum(&data));
    let key = report.idempotency_key().expect("a POST is keyed");
    assert!(uploads.iter().all(|u| u.key.as_deref() == Some(key)));
    assert_eq!(p.replay_bytes_kept(), 0, "the buffer is given back");
    assert!(p.replay_bytes_peak() <= 10 * MIB + CHUNK);
}

#[tokio::test]
async fn a_stream_over_the_limit_is_sent_once_and_commits_the_call() {
    let data = payload(3 * MIB);
    let (addr, uploads) = upload_server(vec![Plan::Answer(503)]).await;
    let clock = ManualClock::new();
    let p = policy(&clock).body_replay_limit(MIB).build().unwrap();
    let (status, report) = send(
        p.clone(),
        Method::PUT,
        format!("http://{addr}/export"),
        Some(stream_of(&data)),
        None,
    )
    .await;
    assert_eq!(status, Some(503));
    assert_eq!(report.stop_reason(), StopReason::BodyTooLargeToReplay);
    assert_eq!(report.attempts(), 1);
    assert!(clock.sleeps().is_empty(), "no backoff for a committed call");
    let uploads = uploads.all();
    assert_eq!(uploads.len(), 1, "sent once");
    assert_eq!(checksum(&uploads[0].body), checksum(&data), "sent whole");
    // Memory: never more than the limit, and all of it given back.
    let peak = p.replay_bytes_peak();
    eprintln!("kept at most {peak} bytes of {}", data.len());
    assert!(peak > 0 && peak <= MIB, "peak {peak}");
    assert_eq!(p.replay_bytes_kept(), 0);
}

#[tokio::test]
async fn a_file_given_as_a_source_is_sent_again_after_a_reset_at_90_percent() {
    let data = payload(4 * MIB);
    let path = std::env::temp_dir().join(format!("i46-source-{}.bin", std::process::id()));
    std::fs::write(&path, &data).unwrap();
    let (addr, uploads) = upload_server(vec![
        Plan::ResetAfter(data.len() * 9 / 10),
        Plan::Answer(200),
    ])
    .await;
    let clock = ManualClock::new();
    // A limit far below the file: a source needs no buffer.
    let p = policy(&clock).body_replay_limit(CHUNK).build().unwrap();
    let file = path.clone();
    let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = opened.clone();
    let source = BodySource::new(move || {
        count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let file = tokio::fs::File::from_std(std::fs::File::open(&file).unwrap());
        let chunks = futures_util::stream::unfold(file, |mut file| async move {
            use tokio::io::AsyncReadExt;
            let mut buf = vec![0u8; CHUNK];
            match file.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok::<_, std::io::Error>(Bytes::from(buf)), file))
                }
                Err(e) => Some((Err(e), file)),
            }
        });
        reqwest::Body::wrap_stream(chunks)
    });
    let (status, report) = send(
        p.clone(),
        Method::PUT,
        format!("http://{addr}/file"),
        None,
        Some(source),
    )
    .await;
    std::fs::remove_file(&path).unwrap();
    assert_eq!(status, Some(200));
    assert_eq!(report.attempts(), 2);
    assert_eq!(opened.load(std::sync::atomic::Ordering::SeqCst), 2);
    let uploads = uploads.all();
    assert_eq!(uploads.len(), 2);
    assert!(uploads[0].body.len() >= data.len() * 9 / 10 && !uploads[0].complete);
    assert_eq!(complete(&uploads).len(), 1);
    assert_eq!(checksum(&uploads[1].body), checksum(&data));
    assert_eq!(p.replay_bytes_peak(), 0, "nothing was buffered");
}

#[tokio::test]
async fn the_client_wide_cap_refuses_to_buffer_not_to_send() {
    let data = payload(MIB / 2);
    let (addr, uploads) = upload_server(vec![Plan::Answer(503)]).await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .body_replay_limit(MIB)
        .body_replay_cap(4 * CHUNK)
        .build()
        .unwrap();
    let (status, report) = send(
        p.clone(),
        Method::PUT,
        format!("http://{addr}/capped"),
        Some(stream_of(&data)),
        None,
    )
    .await;
    assert_eq!(status, Some(503));
    // Sent as if there were no buffer: whole, once.
    assert_eq!(report.stop_reason(), StopReason::BodyNotCloneable);
    let uploads = uploads.all();
    assert_eq!(uploads.len(), 1);
    assert_eq!(checksum(&uploads[0].body), checksum(&data));
    // Kept up to the cap, then refused to keep more.
    let peak = p.replay_bytes_peak();
    assert!(peak > 0 && peak <= 4 * CHUNK, "peak {peak}");
    assert_eq!(p.replay_bytes_kept(), 0);
}

#[tokio::test]
async fn a_small_streamed_body_is_replayed_on_every_attempt_within_the_limit() {
    let data = payload(200 * 1024);
    let (addr, uploads) = upload_server(vec![Plan::Answer(503)]).await;
    let clock = ManualClock::new();
    let p = policy(&clock).max_attempts(3).build().unwrap();
    let (status, report) = send(
        p.clone(),
        Method::PUT,
        format!("http://{addr}/small"),
        Some(stream_of(&data)),
        None,
    )
    .await;
    assert_eq!(status, Some(503));
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    let uploads = uploads.all();
    assert_eq!(uploads.len(), 3);
    assert!(uploads.iter().all(|u| u.complete && u.body == data));
    assert_eq!(clock.sleeps().len(), 2);
}

/// A request's path and body, as [`Reader`] read them.
type Received = (String, Vec<u8>);

/// Below the middleware, on tokio's paused clock: reads each request's
/// whole body, then answers after the next scripted latency (2 ms once the
/// script is spent).
#[derive(Clone, Default)]
struct Reader {
    script: Arc<Mutex<VecDeque<Duration>>>,
    bodies: Arc<Mutex<Vec<Received>>>,
}

#[async_trait::async_trait]
impl Middleware for Reader {
    async fn handle(
        &self,
        mut req: reqwest::Request,
        _: &mut Extensions,
        _: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let latency = self.script.lock().unwrap().pop_front();
        let body = match req.body_mut().take() {
            Some(body) => body.collect().await.unwrap().to_bytes().to_vec(),
            None => Vec::new(),
        };
        self.bodies
            .lock()
            .unwrap()
            .push((req.url().path().to_owned(), body));
        tokio::time::sleep(latency.unwrap_or(Duration::from_millis(2))).await;
        let response = http::Response::builder().status(200).body("").unwrap();
        Ok(reqwest::Response::from(response))
    }
}

#[tokio::test(start_paused = true)]
async fn a_hedged_streamed_put_replays_the_buffer() {
    let server = Reader::default();
    let hedging = HedgeConfig {
        idempotent_methods: true,
        ..HedgeConfig::default()
    };
    let policy = RetryPolicy::builder()
        .seed(3)
        .hedge(hedging)
        .build()
        .unwrap();
    let client = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy.clone()))
        .with(server.clone())
        .build();
    // The host's latencies, for its hedge delay.
    for _ in 0..100 {
        client.get("http://svc.test/warm").send().await.unwrap();
    }
    server
        .script
        .lock()
        .unwrap()
        .push_back(Duration::from_millis(300));
    let data = payload(300 * 1024);
    let r = client
        .put("http://svc.test/doc")
        .body(stream_of(&data))
        .send()
        .await
        .unwrap();
    let report = r.retry_report().unwrap();
    assert_eq!((report.hedges(), report.hedge_wins()), (1, 1));
    let bodies = server.bodies.lock().unwrap().clone();
    let puts: Vec<_> = bodies.iter().filter(|(path, _)| path == "/doc").collect();
    assert_eq!(puts.len(), 2, "the first copy and its hedge");
    assert!(puts
        .iter()
        .all(|(_, body)| checksum(body) == checksum(&data)));
    assert_eq!(policy.replay_bytes_kept(), 0);
}

#[tokio::test]
async fn an_unkeyed_post_stream_is_resent_only_when_it_never_arrived_and_is_not_kept() {
    let data = payload(200 * 1024);
    // Refused: the body never left, so the stream is sent again.
    let clock = ManualClock::new();
    let p = policy(&clock).build().unwrap();
    let refused = support::refused_addr().await;
    let (c, _) = client(p.clone());
    let (_, report) = support::send_failing(
        c.post(format!("http://{refused}/"))
            .with_extension(reqwest_safe_retry::RequestOptions::new().no_idempotency_key())
            .body(stream_of(&data)),
    )
    .await;
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(report.attempts(), 3);
    // Answered: it may have been processed; not resent, and nothing was
    // kept for a retry that cannot come.
    let (addr, uploads) = upload_server(vec![Plan::Answer(503)]).await;
    let (c, _) = client(p.clone());
    let response = c
        .post(format!("http://{addr}/"))
        .with_extension(reqwest_safe_retry::RequestOptions::new().no_idempotency_key())
        .body(stream_of(&data))
        .send()
        .await
        .unwrap();
    let report = response.retry_report().unwrap();
    assert_eq!(report.stop_reason(), StopReason::NotIdempotent);
    assert_eq!(uploads.all().len(), 1);
    assert_eq!(checksum(&uploads.all()[0].body), checksum(&data));
    assert_eq!(p.replay_bytes_peak(), 0, "an unkeyed POST keeps nothing");
}

/// `bytes` as a caller's producer streams them: 64 KiB every 5 ms, with no
/// length given; `given` counts the chunks handed out. With `hold`, the
/// stream waits after chunk `hold.0` until `hold.1` has seen two PUTs (the
/// hedge has gone out), so the hedge is sent before the chunks that
/// follow, however slow the machine is.
fn paced(
    bytes: &[u8],
    given: watch::Sender<usize>,
    hold: Option<(usize, watch::Receiver<usize>)>,
) -> reqwest::Body {
    let chunks: Vec<Bytes> = bytes.chunks(CHUNK).map(Bytes::copy_from_slice).collect();
    let stream = futures_util::stream::unfold(
        (chunks.into_iter(), given, hold, 0usize),
        |(mut chunks, given, mut hold, n)| async move {
            let chunk = chunks.next()?;
            if n > 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            if let Some((_, puts)) = hold.as_mut().filter(|(at, _)| *at == n) {
                // A bound, not a timing: the test fails (no hedge) rather
                // than hangs if the hedge never goes out.
                let out = puts.wait_for(|sent| *sent >= 2);
                let _ = tokio::time::timeout(Duration::from_secs(30), out).await;
            }
            given.send_replace(n + 1);
            Some((Ok::<_, std::io::Error>(chunk), (chunks, given, hold, n + 1)))
        },
    );
    reqwest::Body::wrap_stream(stream)
}

/// Below the retry middleware: counts the PUTs sent (a hedge included).
#[derive(Clone)]
struct CountPuts(Arc<watch::Sender<usize>>);

#[async_trait::async_trait]
impl Middleware for CountPuts {
    async fn handle(
        &self,
        req: reqwest::Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        if req.method() == Method::PUT {
            self.0.send_modify(|n| *n += 1);
        }
        next.run(req, extensions).await
    }
}

/// A sleeper whose every sleep ends once the paced stream has handed out
/// `at` chunks: the hedge goes out at a chosen point of the upload, however
/// fast the machine is (the hedge delay is the only sleep of these calls).
struct AtChunk {
    given: watch::Receiver<usize>,
    at: usize,
}

impl Sleeper for AtChunk {
    fn sleep(&self, _: Duration) -> BoxFuture<()> {
        let (mut given, at) = (self.given.clone(), self.at);
        Box::pin(async move {
            let _ = given.wait_for(|n| *n >= at).await;
        })
    }
}

/// A streamed PUT of `len` bytes, paced, on a policy that hedges
/// idempotent methods, to a host warmed so that a hedge goes out once the
/// stream has handed out `hedge_at` chunks (and, when `wait`, the stream
/// gives no more until the hedge is out); `limits` are the replay limit
/// and cap. The answer's status, the report, the PUTs the server read,
/// and the policy.
async fn hedged_upload(
    len: usize,
    limits: (usize, usize),
    hedge_at: usize,
    wait: bool,
) -> (Option<u16>, RetryReport, Vec<Upload>, RetryPolicy) {
    let data = payload(len);
    let (addr, uploads) = upload_server(vec![Plan::Answer(200)]).await;
    let (given, seen) = watch::channel(0);
    let (puts, sent) = watch::channel(0);
    let hedging = HedgeConfig {
        min_samples: 5,
        max_extra_load: 1.0,
        idempotent_methods: true,
        ..HedgeConfig::default()
    };
    let p = RetryPolicy::builder()
        .seed(7)
        .hedge(hedging)
        .body_replay_limit(limits.0)
        .body_replay_cap(limits.1)
        .sleeper(AtChunk {
            given: seen,
            at: hedge_at,
        })
        .build()
        .unwrap();
    let c = ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(p.clone()))
        .with(CountPuts(Arc::new(puts)))
        .build();
    for _ in 0..5 {
        let r = c.get(format!("http://{addr}/warm")).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    let slot = reqwest_safe_retry::ReportSlot::new();
    let status = c
        .put(format!("http://{addr}/upload"))
        .with_extension(slot.clone())
        .body(paced(&data, given, wait.then_some((hedge_at, sent))))
        .send()
        .await
        .ok()
        .map(|r| r.status().as_u16());
    let report = slot.take().expect("the middleware fills the slot");
    let puts: Vec<Upload> = uploads
        .all()
        .into_iter()
        .filter(|u| u.method == "PUT")
        .collect();
    let whole = complete(&puts);
    assert_eq!(whole.len(), 1, "one complete body: {:?}", sizes(&puts));
    assert_eq!(whole[0].body.len(), len);
    assert_eq!(checksum(&whole[0].body), checksum(&data));
    (status, report, puts, p)
}

/// Each upload's size and whether it was read whole.
fn sizes(uploads: &[Upload]) -> Vec<(usize, bool)> {
    uploads.iter().map(|u| (u.body.len(), u.complete)).collect()
}

/// Sent before the body outgrew the buffer, the hedge follows the first
/// copy until the buffer lets go of the body's start; then it drops out,
/// and the first copy, which reads the caller's stream, goes on.
#[tokio::test]
async fn a_hedge_that_can_no_longer_follow_a_3_mib_upload_costs_only_the_hedge() {
    let (status, report, puts, p) = hedged_upload(3 * MIB, (MIB, 16 * MIB), 4, true).await;
    assert_eq!(status, Some(200), "the first copy's answer");
    assert_eq!(report.stop_reason(), StopReason::Success);
    assert_eq!((report.attempts(), report.hedges()), (1, 1));
    assert_eq!(report.hedge_wins(), 0, "a hedge that dropped out never won");
    assert!(puts.len() <= 2, "{:?}", sizes(&puts));
    assert_eq!(p.metrics().snapshot().hedge_wins, 0);
    assert_eq!(p.replay_bytes_kept(), 0);
}

/// Once the body has outgrown the buffer, no hedge is sent: it could not
/// send the body's start.
#[tokio::test]
async fn no_hedge_is_sent_for_an_upload_already_past_its_replay_limit() {
    let (status, report, puts, p) = hedged_upload(3 * MIB, (MIB, 16 * MIB), 24, false).await;
    assert_eq!(status, Some(200));
    assert_eq!(report.stop_reason(), StopReason::Success);
    assert_eq!(
        (report.attempts(), report.hedges(), report.hedge_wins()),
        (1, 0, 0)
    );
    assert_eq!(puts.len(), 1, "sent once");
    assert_eq!(p.replay_bytes_kept(), 0);
}

/// The client-wide cap, as the limit: a hedge sent while 512 KiB are
/// still within a 256 KiB cap drops out when the cap refuses to keep more.
#[tokio::test]
async fn a_hedge_that_the_cap_stops_following_costs_only_the_hedge() {
    let (status, report, puts, p) = hedged_upload(MIB / 2, (MIB, 4 * CHUNK), 2, true).await;
    assert_eq!(status, Some(200));
    assert_eq!(report.stop_reason(), StopReason::Success);
    assert_eq!(
        (report.attempts(), report.hedges(), report.hedge_wins()),
        (1, 1, 0)
    );
    assert!(puts.len() <= 2, "{:?}", sizes(&puts));
    assert_eq!(p.replay_bytes_kept(), 0);
}

/// And past the cap, no hedge is sent.
#[tokio::test]
async fn no_hedge_is_sent_for_an_upload_the_cap_no_longer_keeps() {
    let (status, report, puts, p) = hedged_upload(MIB / 2, (MIB, 4 * CHUNK), 6, false).await;
    assert_eq!(status, Some(200));
    assert_eq!(report.stop_reason(), StopReason::Success);
    assert_eq!(
        (report.attempts(), report.hedges(), report.hedge_wins()),
        (1, 0, 0)
    );
    assert_eq!(puts.len(), 1, "sent once");
    assert_eq!(p.replay_bytes_kept(), 0);
}
