//! Several tenants through one client, named limits beside an unlimited
//! route, hedging on: generated scripts judged by the narrow rule.
//!
//! A limit belongs to whoever met it (DESIGN, "Rate-limited hosts"): the
//! caller's credential and the policy name the server gives. So here a
//! call of ours may be later than reqwest-retry's only where the server
//! told *that caller, on that route*, to wait: a 429 (or a 503 with
//! Retry-After) or a spent quota answered to the same tenant on the same
//! route, or on another route of the same named policy when the script's
//! limit is one policy shared by the routes (an account's quota). Nothing
//! another tenant was told, nothing another route's policy said, and
//! nothing said on the unlimited route excuses a call.
//!
//! The host: `/search` (GET) and `/export` (PUT) behind a fixed-window
//! limiter per tenant and policy, each tenant with its own quota and
//! window or none; the policies are named `"search"` and `"export"`
//! (`RateLimit`, draft 12, with `RateLimit-Policy`), or one `"account"`
//! policy shared by both routes, which may instead speak the unnamed
//! `X-RateLimit-Remaining` / `X-RateLimit-Reset`. Beside them `/orders`
//! (GET) has no limit: it succeeds, or fails transiently in ways both
//! clients retry (500, 502, 503 without a hint, 504). Every answer takes
//! a scripted latency, so the hedging client has slow answers to hedge.
//! Each call carries `Authorization: Bearer tenant-x`. Unnamed limits on
//! two separate routes are not generated: two of one caller's routes
//! throttled together, none succeeding, are paced as one limit by design
//! (an account's quota that names no policy).
//!
//! Three clients per script, each against its own fresh host on the same
//! paused clock: reqwest-retry 0.9, ours with the default policy, and ours
//! hedging every idempotent method (`HedgeConfig` with
//! `idempotent_methods`, warmed after 20 answers instead of 100 so that a
//! 300-call script is hedged for most of its length). Each of ours is
//! judged call by call against reqwest-retry's: where theirs succeeds ours
//! succeeds, and ours waits at most theirs + 100 ms + what reqwest-retry's
//! own backoff could have drawn (when ours retried) + the Retry-After and
//! resets the call was itself answered + its pacing wait when its caller
//! was told on its route to wait. And a call whose caller was never told
//! so on its route is never held for a rate (`rate_limit_wait` zero).
//!
//! `cargo test` runs seeds 1 to 5, 300 calls each;
//! `NEVER_WORSE_TENANT_SEEDS=100 cargo test -p reqwest-safe-retry-checks
//! --test never_worse generated_tenant -- --nocapture` runs seeds 1 to 100.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::Extensions;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use reqwest::{Method, Request, Response};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware, Middleware, Next};
use reqwest_safe_retry::hedging::HedgeConfig;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy, RetryReportExt, StopReason};
use tokio::time::Instant;

use super::{
    render, theirs_policy, waited, Call, Excuse, Reply, Seen, Value, Verdict, ATTEMPTS,
    MAX_RETRY_AFTER, SLACK, THEIR_MIN,
};

const TENANTS: [&str; 3] = ["tenant-a", "tenant-b", "tenant-c"];

/// The routes: two limited, one not.
const ROUTES: [(&str, Method); 3] = [
    ("/search", Method::GET),
    ("/export", Method::PUT),
    ("/orders", Method::GET),
];
const UNLIMITED: usize = 2;

/// How a limiter speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fields {
    /// `RateLimit: "<name>";r=<left>;t=<reset>` and `RateLimit-Policy:
    /// "<name>";q=<quota>;w=<window>`.
    Named,
    /// `X-RateLimit-Remaining` and `X-RateLimit-Reset` (seconds): no
    /// name, so only for a policy shared by the routes.
    Unnamed,
}

/// One tenant's limit under one policy: `quota` requests per fixed window
/// of `window` seconds from the host's start; the request after them gets
/// `status` with the fields saying the quota is spent until the window
/// ends (and `Retry-After` too when `retry_after`). Every answer carries
/// the fields, the last allowed one `r=0`.
#[derive(Clone, Copy, Debug)]
struct Limit {
    quota: u32,
    window: u64,
    status: u16,
    retry_after: bool,
    fields: Fields,
}

/// One script.
#[derive(Clone, Debug)]
struct TenantScript {
    tenants: usize,
    /// One policy, `"account"`, for both limited routes; else `"search"`
    /// and `"export"`, each its own.
    shared: bool,
    /// Per policy (one when shared, two else), per tenant: its limit, or
    /// none.
    limits: Vec<Vec<Option<Limit>>>,
    /// `/orders`' answers, in turn, cycling.
    orders: Vec<u16>,
    /// Every answer's latency, in the host's order, cycling.
    latency: Vec<Duration>,
    /// Every `n`th answer of the host takes this long instead: the tail
    /// a hedge is for.
    slow: (usize, Duration),
    /// Per call: its tenant and route.
    calls: Vec<(usize, usize)>,
    interval: Duration,
}

impl TenantScript {
    /// The policy a limited route is under (its index in `limits`).
    fn policy(&self, route: usize) -> usize {
        if self.shared {
            0
        } else {
            route
        }
    }

    fn policy_name(&self, route: usize) -> &'static str {
        match (self.shared, route) {
            (true, _) => "account",
            (false, 0) => "search",
            _ => "export",
        }
    }

    /// Whether an answer on `said` speaks for a call on `route`: the same
    /// route, or one of the same named policy shared by both.
    fn same_limit(&self, said: usize, route: usize) -> bool {
        said == route || (self.shared && said != UNLIMITED && route != UNLIMITED)
    }

    fn route_of(path: &str) -> usize {
        ROUTES
            .iter()
            .position(|(p, _)| *p == path)
            .expect("a route")
    }
}

/// Per (policy, tenant): the window counted, and the requests in it.
type Windows = HashMap<(usize, usize), (u64, u32)>;

/// The host: it answers each request from the script on the paused
/// clock and logs what it gave, as [`super::Host`] does.
#[derive(Clone)]
struct TenantHost {
    script: Arc<TenantScript>,
    seen: Arc<Mutex<Vec<Seen>>>,
    windows: Arc<Mutex<Windows>>,
    born: Instant,
    wall: SystemTime,
}

impl TenantHost {
    fn new(script: &TenantScript) -> Self {
        TenantHost {
            script: Arc::new(script.clone()),
            seen: Arc::default(),
            windows: Arc::default(),
            born: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn answer(&self, call: usize, path: &str) -> (Reply, SystemTime) {
        let at = self.born.elapsed();
        let s = &self.script;
        let (tenant, _) = s.calls[call];
        let route = TenantScript::route_of(path);
        let mut seen = self.seen.lock().unwrap();
        let nth = seen.len();
        let mut reply = if route == UNLIMITED {
            let nth_here = seen.iter().filter(|r| r.path == path).count();
            Reply::status(s.orders[nth_here % s.orders.len()])
        } else {
            let policy = s.policy(route);
            match s.limits[policy][tenant] {
                None => Reply::ok(),
                Some(limit) => {
                    let window = limit.window * 1000;
                    let ms = u64::try_from(at.as_millis()).unwrap();
                    let mut windows = self.windows.lock().unwrap();
                    let count = windows.entry((policy, tenant)).or_insert((0, 0));
                    if count.0 != ms / window {
                        *count = (ms / window, 0);
                    }
                    count.1 += 1;
                    let reset = (window - ms % window).div_ceil(1000);
                    let left = limit.quota.saturating_sub(count.1);
                    let over = count.1 > limit.quota;
                    let name = s.policy_name(route);
                    let mut r = Reply::status(if over { limit.status } else { 200 });
                    r = match limit.fields {
                        Fields::Named => r
                            .with(
                                "ratelimit",
                                Value::Text(format!("\"{name}\";r={left};t={reset}")),
                            )
                            .with(
                                "ratelimit-policy",
                                Value::Text(format!(
                                    "\"{name}\";q={};w={}",
                                    limit.quota, limit.window
                                )),
                            ),
                        Fields::Unnamed => r
                            .with("x-ratelimit-remaining", Value::Text(left.to_string()))
                            .with("x-ratelimit-reset", Value::Text(reset.to_string())),
                    };
                    if over && limit.retry_after {
                        r = r.retry_after(reset);
                    }
                    r
                }
            }
        };
        reply.delay = if (nth + 1) % s.slow.0 == 0 {
            s.slow.1
        } else {
            s.latency[nth % s.latency.len()]
        };
        seen.push(Seen {
            call,
            path: ROUTES[route].0,
            at,
            reply: reply.clone(),
        });
        (reply, self.wall + at)
    }
}

#[async_trait::async_trait]
impl Middleware for TenantHost {
    async fn handle(
        &self,
        req: Request,
        _extensions: &mut Extensions,
        _next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let call: usize = req.headers()["x-call"].to_str().unwrap().parse().unwrap();
        let tenant = self.script.calls[call].0;
        assert_eq!(
            req.headers()["authorization"],
            format!("Bearer {}", TENANTS[tenant]).as_str()
        );
        let (reply, now) = self.answer(call, req.url().path());
        tokio::time::sleep(reply.delay).await;
        let mut answer = http::Response::builder()
            .status(reply.status)
            .header("date", httpdate::fmt_http_date(now));
        for (name, value) in &reply.headers {
            answer = answer.header(*name, render(value, now));
        }
        Ok(Response::from(answer.body(Vec::new()).unwrap()))
    }
}

/// Runs the script's calls through `client`, one every `interval`, each
/// with its tenant's credential.
async fn traffic(script: &TenantScript, client: ClientWithMiddleware) -> Vec<Call> {
    let start = Instant::now();
    let mut calls = Vec::new();
    for (i, &(tenant, route)) in script.calls.iter().enumerate() {
        tokio::time::sleep_until(start + script.interval * u32::try_from(i).unwrap()).await;
        let (path, method) = &ROUTES[route];
        let request = client
            .request(method.clone(), format!("http://api.example{path}"))
            .bearer_auth(TENANTS[tenant])
            .header("x-call", i.to_string());
        calls.push(tokio::spawn(async move {
            let begun = Instant::now();
            let began = begun - start;
            let result = request.send().await;
            let took = begun.elapsed();
            let (ok, status, report) = match result {
                Ok(r) => (
                    r.status().is_success(),
                    Some(r.status().as_u16()),
                    r.retry_report().cloned(),
                ),
                Err(_) => (false, None, None),
            };
            Call {
                path,
                began,
                ok,
                status,
                took,
                report,
            }
        }));
    }
    let mut done = Vec::new();
    for c in calls {
        done.push(c.await.unwrap());
    }
    done
}

/// Ours, with the default policy, hedging every idempotent method or not.
fn ours(host: &TenantHost, seed: u64, hedge: bool) -> ClientWithMiddleware {
    let mut policy = RetryPolicy::builder().seed(seed);
    if hedge {
        policy = policy.hedge(HedgeConfig {
            idempotent_methods: true,
            min_samples: 20,
            ..HedgeConfig::default()
        });
    }
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new(policy.build().unwrap()))
        .with(host.clone())
        .build()
}

fn theirs(host: &TenantHost) -> ClientWithMiddleware {
    ClientBuilder::new(reqwest::Client::new())
        .with(reqwest_retry::RetryTransientMiddleware::new_with_policy(
            theirs_policy(),
        ))
        .with(host.clone())
        .build()
}

/// When the client heard an answer, from the host's start.
fn heard(s: &Seen) -> Duration {
    s.at + s.reply.delay
}

/// Whether the answer told its caller to wait: a throttling answer, or a
/// quota reported spent with a reset our policy honours.
fn says_wait(s: &Seen) -> bool {
    s.reply.throttles() || s.reply.spent_for().is_some_and(|r| r <= MAX_RETRY_AFTER)
}

/// How long the call spent waiting: its time less the time some copy of
/// it was being answered (hedged copies overlap: the union of their
/// answering times, within the call).
fn waited_hedged(call: &Call, own: &[&Seen]) -> Duration {
    let end = call.began + call.took;
    let mut spans: Vec<(Duration, Duration)> = own
        .iter()
        .map(|s| (s.at.max(call.began), heard(s).min(end)))
        .filter(|(a, b)| a < b)
        .collect();
    spans.sort();
    let (mut served, mut reach) = (Duration::ZERO, call.began);
    for (a, b) in spans {
        let a = a.max(reach);
        if b > a {
            served += b - a;
            reach = b;
        }
    }
    call.took.saturating_sub(served)
}

/// Whether the host, or the call's route, failed (not throttled) at
/// least a tenth of at least five first attempts from 10 s before `from`
/// to `to`: the retry budget's own line (its tokens pay for retries near
/// a tenth of first attempts; more failures than that drain it). The
/// budget is the host's, its healthy routes' retries included (a
/// deliberate difference, docs/migrating.md); a route that keeps failing
/// while the host's other routes are healthy drains it too. A throttling
/// answer, which the budget does not pay for, is traffic but no failure
/// here, so no tenant's spent quota is an outage for anyone.
fn failing(seen: &[Seen], path: &str, from: Duration, to: Duration) -> bool {
    let ratio = |on_path: bool| {
        let mut firsts = std::collections::BTreeSet::new();
        let (mut n, mut failed) = (0, 0);
        for s in seen.iter().filter(|s| !on_path || s.path == path) {
            if s.at + Duration::from_secs(10) >= from && s.at <= to && firsts.insert(s.call) {
                n += 1;
                failed += usize::from(!(200..300).contains(&s.reply.status) && !says_wait(s));
            }
        }
        n >= 5 && failed * 10 >= n
    };
    ratio(false) || ratio(true)
}

/// The narrow rule, call by call: ours against theirs.
fn judge(
    script: &TenantScript,
    (ours, seen): (&[Call], &[Seen]),
    (theirs, their_seen): (&[Call], &[Seen]),
) -> Verdict {
    let mut v = Verdict {
        calls: ours.len(),
        ..Verdict::default()
    };
    for (i, (o, t)) in ours.iter().zip(theirs).enumerate() {
        let (tenant, route) = script.calls[i];
        let own: Vec<&Seen> = seen.iter().filter(|s| s.call == i).collect();
        let their_own: Vec<&Seen> = their_seen.iter().filter(|s| s.call == i).collect();
        let ended = o.began + o.took;
        // What the server told this caller, on this route (or its
        // shared policy), before the call ended.
        let told = seen.iter().any(|s| {
            script.calls[s.call].0 == tenant
                && script.same_limit(TenantScript::route_of(s.path), route)
                && heard(s) <= ended
                && says_wait(s)
        });
        let report = o.report.as_ref();
        let stop = report.map(|r| r.stop_reason());
        let paced = report.map_or(Duration::ZERO, |r| r.rate_limit_wait());
        let admission = report.map_or(Duration::ZERO, |r| r.admission_wait());
        let in_outage = (stop == Some(StopReason::BudgetExhausted) || !admission.is_zero())
            && failing(seen, o.path, o.began, ended);
        let excess = o.took.saturating_sub(t.took);
        v.worst = v.worst.max(excess);
        v.slower += usize::from(excess > Duration::from_millis(250));
        let mut wrong = String::new();
        if t.ok && !o.ok {
            let excuse = if stop == Some(StopReason::RetryAfterTooLong) {
                Some(Excuse::RetryAfterTooLong)
            } else if told && !paced.is_zero() {
                Some(Excuse::ToldThatCallerOnThatRoute)
            } else if stop == Some(StopReason::AttemptsExhausted)
                && report.is_some_and(|r| r.attempts() == ATTEMPTS)
            {
                Some(Excuse::SameAttemptsOtherAnswers)
            } else if in_outage {
                Some(Excuse::RetryBudgetInAnOutage)
            } else {
                None
            };
            match excuse {
                Some(e) => *v.excused.entry(e).or_default() += 1,
                None => {
                    let _ = write!(
                        wrong,
                        "failed ({:?}, {stop:?}) where reqwest-retry succeeded; ",
                        o.status
                    );
                }
            }
        }
        if !told && !paced.is_zero() {
            let _ = write!(
                wrong,
                "held {paced:?} for a rate its caller was never told of on its route; "
            );
        }
        // A first attempt is held only while a quota its caller was told
        // is spent on its route (or its shared policy) has not reset: the
        // call began inside such a told wait (its jitter included).
        let first_held = own
            .first()
            .map_or(Duration::ZERO, |s| s.at.saturating_sub(o.began));
        let spent_when_begun = seen.iter().any(|s| {
            script.calls[s.call].0 == tenant
                && script.same_limit(TenantScript::route_of(s.path), route)
                && heard(s) <= o.began
                && s.reply.spent_for().is_some_and(|r| {
                    r <= MAX_RETRY_AFTER
                        && o.began < heard(s) + r + (r / 5).min(Duration::from_secs(2))
                })
        });
        if first_held > SLACK && !spent_when_begun {
            let _ = write!(
                wrong,
                "first attempt held {first_held:?} though no quota its caller was told is spent \
                 on its route was running when it began; "
            );
        }
        // What reqwest-retry's backoff could have drawn, when ours slept.
        let sleeps = report.map_or(own.len().saturating_sub(1), |r| r.delays().len());
        let mut limit = waited(t, &their_own) + SLACK;
        if sleeps > 0 {
            limit += (0..ATTEMPTS - 1).map(|n| THEIR_MIN * (1 << n)).sum();
        }
        // The Retry-After and resets this call was answered before a sleep.
        for s in own.iter().take(sleeps) {
            let hint = s.reply.hint().into_iter().chain(s.reply.spent_for());
            if let Some(h) = hint.filter(|h| *h <= MAX_RETRY_AFTER).max() {
                limit += h + (h / 5).min(Duration::from_secs(2));
            }
        }
        if told {
            limit += paced;
            if excess > Duration::from_millis(250) {
                *v.excused
                    .entry(Excuse::ToldThatCallerOnThatRoute)
                    .or_default() += 1;
            }
        }
        // The retry budget of a host that keeps failing (not throttling).
        let waited_ours = waited_hedged(o, &own);
        if waited_ours > limit && waited_ours <= limit + admission {
            if in_outage {
                *v.excused.entry(Excuse::RetryBudgetInAnOutage).or_default() += 1;
                limit += admission;
            } else if !t.ok && !o.ok {
                *v.excused
                    .entry(Excuse::AdmissionWaitedForAFailingHost)
                    .or_default() += 1;
                limit += admission;
            }
        }
        let better = o.ok && !t.ok;
        if !better && waited_ours > limit {
            let _ = write!(
                wrong,
                "waited {waited_ours:?} against reqwest-retry's call of {:?} (limit {limit:?})",
                t.took
            );
        }
        if !wrong.is_empty() {
            let answers: Vec<(u16, Duration)> =
                own.iter().map(|s| (s.reply.status, s.at)).collect();
            v.violations.push(format!(
                "call {i} ({}, {} {}) began {:?}: {wrong}; our answers {answers:?}, report {:?}",
                TENANTS[tenant], ROUTES[route].1, ROUTES[route].0, o.began, o.report
            ));
        }
    }
    v
}

// --- the generator ---

fn limit(named_only: bool) -> impl Strategy<Value = Option<Limit>> {
    let fields = if named_only {
        Just(Fields::Named).boxed()
    } else {
        prop_oneof![Just(Fields::Named), Just(Fields::Unnamed)].boxed()
    };
    let some = (
        1u32..=10,
        prop::sample::select(vec![1u64, 2, 5, 10]),
        prop::sample::select(vec![429u16, 429, 429, 503]),
        any::<bool>(),
        fields,
    )
        .prop_map(|(quota, window, status, retry_after, fields)| {
            Some(Limit {
                quota,
                window,
                status,
                // A 503 throttles only with its Retry-After.
                retry_after: retry_after || status == 503,
                fields,
            })
        });
    prop_oneof![1 => Just(None), 3 => some]
}

fn tenant_script() -> impl Strategy<Value = (TenantScript, Vec<(usize, usize, usize)>)> {
    let latency = prop::collection::vec(
        prop_oneof![
            1 => Just(Duration::ZERO),
            3 => (1u64..=20).prop_map(Duration::from_millis),
        ],
        1..=10,
    );
    let slow = (20usize..=60, (100u64..=900).prop_map(Duration::from_millis));
    let orders = prop::collection::vec(
        prop::sample::select(vec![200u16, 200, 200, 200, 200, 200, 500, 502, 503, 504]),
        1..=8,
    );
    (2usize..=3, any::<bool>())
        .prop_flat_map(move |(tenants, shared)| {
            let policies = if shared { 1 } else { 2 };
            (
                Just(tenants),
                Just(shared),
                prop::collection::vec(prop::collection::vec(limit(!shared), tenants), policies),
                orders.clone(),
                latency.clone(),
                slow.clone(),
                prop::collection::vec((0..tenants, 0..ROUTES.len()), 300),
                10u64..=100,
                // Drawn last: a script's other draws do not depend on them.
                prop::collection::vec((0usize..290, 0..tenants, 6usize..=20), 0..=3),
            )
        })
        .prop_map(
            |(tenants, shared, limits, orders, latency, slow, calls, interval, bursts)| {
                let script = TenantScript {
                    tenants,
                    shared,
                    limits,
                    orders,
                    latency,
                    slow,
                    calls,
                    interval: Duration::from_millis(interval),
                };
                (script, bursts)
            },
        )
}

/// The script of one seed, with its bursts (a tenant's calls on both
/// limited routes, nothing else meanwhile: what shows a limit wider than
/// a route) or without.
fn generated(seed: u64, with_bursts: bool) -> TenantScript {
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    let (mut script, bursts) = tenant_script().new_tree(&mut runner).unwrap().current();
    if with_bursts {
        for (start, tenant, len) in bursts {
            for (k, call) in script.calls.iter_mut().skip(start).take(len).enumerate() {
                *call = (tenant, k % 2);
            }
        }
    }
    script
}

/// What one script measured, for ours plain and ours hedging; and the
/// hedges the hedging client sent.
struct Compared {
    plain: Verdict,
    hedged: Verdict,
    hedges: u32,
}

/// Runs one script through reqwest-retry and both of ours, each against
/// its own fresh host, on a fresh paused runtime.
fn compare(script: &TenantScript, seed: u64) -> Compared {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let hosts = [
            TenantHost::new(script),
            TenantHost::new(script),
            TenantHost::new(script),
        ];
        let (t, o, h) = tokio::join!(
            traffic(script, theirs(&hosts[0])),
            traffic(script, ours(&hosts[1], seed, false)),
            traffic(script, ours(&hosts[2], seed, true)),
        );
        let their_seen = hosts[0].seen();
        let hedges = h
            .iter()
            .filter_map(|c| c.report.as_ref())
            .map(|r| r.hedges())
            .sum();
        Compared {
            plain: judge(script, (&o, &hosts[1].seen()), (&t, &their_seen)),
            hedged: judge(script, (&h, &hosts[2].seen()), (&t, &their_seen)),
            hedges,
        }
    })
}

fn seeds() -> u64 {
    std::env::var("NEVER_WORSE_TENANT_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5)
}

/// Seeds 1 to `NEVER_WORSE_TENANT_SEEDS` (5 by default), 300 calls each,
/// through ours plain and ours hedging: no call worse than reqwest-retry's
/// beyond what its caller was told on its route; the totals are printed
/// (`-- --nocapture`).
#[test]
fn generated_tenant_scripts_are_never_worse() {
    let (mut plain, mut hedged, mut hedges) = (Verdict::default(), Verdict::default(), 0);
    let mut worse = Vec::new();
    for seed in 1..=seeds() {
        let script = generated(seed, true);
        let c = compare(&script, seed);
        println!(
            "seed {seed} ({} tenants, {} policy, every {:?}): plain {}; hedging ({} hedges) {}",
            script.tenants,
            if script.shared {
                "one shared"
            } else {
                "two named"
            },
            script.interval,
            c.plain,
            c.hedges,
            c.hedged
        );
        for (which, v) in [("plain", &c.plain), ("hedging", &c.hedged)] {
            if let Some(w) = v.worse() {
                worse.push(format!("seed {seed}, ours {which}: {w}"));
            }
        }
        hedges += c.hedges;
        plain.merge(c.plain);
        hedged.merge(c.hedged);
    }
    println!("plain: {plain}\nhedging ({hedges} hedges): {hedged}");
    assert!(hedges > 0, "the hedging client never hedged");
    assert!(worse.is_empty(), "{}", worse.join("\n"));
}

/// Two separately named policies met together in one tenant's burst are
/// two limits: `/search` (one call a 2 s window) goes on at its own reset
/// while `/export` (one a 10 s window) stays spent, and another tenant's
/// calls to the unlimited `/orders` meanwhile are never held. (Before the
/// limit's scope had the policy's name, the burst's two 429s, one on each
/// route, within a second and none succeeding, made one limit of them,
/// and `/search` waited for `/export`'s reset.)
#[test]
fn a_burst_on_two_named_policies_holds_each_route_to_its_own_reset() {
    let limit = |window| {
        Some(Limit {
            quota: 1,
            window,
            status: 429,
            retry_after: false,
            fields: Fields::Named,
        })
    };
    // Tenant A: 6 calls alternating /search and /export in 60 ms, all
    // sent before the first answer (100 ms), then /search at 3 s and
    // 3.5 s; tenant B calls /orders between, every 10 ms.
    let calls = (0..400)
        .map(|i| match i {
            0..6 => (0, i % 2),
            300 | 350 => (0, 0),
            _ => (1, UNLIMITED),
        })
        .collect();
    let script = TenantScript {
        tenants: 2,
        shared: false,
        limits: vec![vec![limit(2), None], vec![limit(10), None]],
        orders: vec![200],
        latency: vec![Duration::from_millis(100)],
        slow: (usize::MAX, Duration::ZERO),
        calls,
        interval: Duration::from_millis(10),
    };
    let c = compare(&script, 51);
    println!("plain {}\nhedging {}", c.plain, c.hedged);
    for v in [c.plain, c.hedged] {
        assert!(v.worse().is_none(), "{}", v.worse().unwrap());
    }
}

/// Finding for the lead (seed 66 without its bursts; `--ignored` runs
/// it): two tenants, `/search` unlimited for both, `/export` named
/// `"export"`, tenant A 8 a 2 s window (over it 503 + Retry-After),
/// tenant B 6 a 1 s window (429, no Retry-After); `/orders` answers 500,
/// 503, 200, 500 in turn; a call every 11 ms. Tenant B's `PUT /export`
/// call 223 (began 2.45 s) is held 4 s for its own spent quota, told 429
/// at 6.46 s, and its retry goes out at 14.17 s: `admission_wait` 7.64 s
/// of which only about 1.9 s is pacing (`rate_limit_wait` 5.93 s less the
/// first attempt's 4 s), the rest the host's retry budget, drained by
/// `/orders` (3 of 4 failing) while the host's failures, throttling
/// aside, stay under a quarter of its first attempts (no outage by the
/// named cases' measure). It ends 11.71 s after it began, 0.75 s past
/// reqwest-retry's 0.66 s + that caller's pacing + its backoff + 100 ms.
/// Hedging: calls 188, 194, 213, the same way. With bursts, seed 46
/// (hedging) shows it too. That wait is the deliberate host budget (its
/// healthy routes' retries included, docs/migrating.md): the host's
/// failures were over a tenth of its first attempts, the budget's own
/// line, which is the outage measure the rule now uses (a quarter was
/// the named cases' coarser one).
#[test]
fn a_paced_retry_may_wait_for_a_failing_hosts_budget() {
    let script = generated(66, false);
    println!(
        "{} tenants, shared {}, limits {:?}, /orders {:?}, every {:?}",
        script.tenants, script.shared, script.limits, script.orders, script.interval
    );
    let c = compare(&script, 66);
    println!("plain {}\nhedging {}", c.plain, c.hedged);
    for v in [c.plain, c.hedged] {
        assert!(v.worse().is_none(), "{}", v.worse().unwrap());
    }
}
