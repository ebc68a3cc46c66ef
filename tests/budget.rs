//! The client-wide retry budget.

mod support;

use reqwest_safe_retry::{ManualClock, RetryPolicy, RetryReport, StopReason};
use support::{client, policy};

async fn outage(policy: RetryPolicy, operations: usize) -> (usize, Vec<StopReason>) {
    let server = support::answering(503).await;
    let (c, _) = client(policy);
    let calls = (0..operations).map(|_| {
        let c = c.clone();
        let url = server.uri();
        tokio::spawn(async move {
            let response = c.get(url).send().await.unwrap();
            response
                .extensions()
                .get::<RetryReport>()
                .unwrap()
                .stop_reason()
        })
    });
    let mut reasons = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        reasons.push(call.await.unwrap());
    }
    (server.received_requests().await.unwrap().len(), reasons)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_outage_spends_no_more_than_the_budget_allows() {
    let clock = ManualClock::new();
    // 10 tokens to start, 0.1 per first attempt, 1 per retry: 200 operations
    // may retry at most 10 + 200 × 0.1 = 30 times.
    // Concurrent sleeps all move the one manual clock: no deadline here.
    let p = policy(&clock)
        .max_attempts(5)
        .budget(10.0, 0.1, 1.0)
        .no_deadline()
        .build()
        .unwrap();
    let metrics_of = p.clone();
    let (received, reasons) = outage(p, 200).await;
    assert!(received <= 200 + 30, "{received} attempts");
    assert!(
        received >= 200 + 10,
        "the initial tokens were spent: {received}"
    );
    let exhausted = reasons
        .iter()
        .filter(|r| **r == StopReason::BudgetExhausted)
        .count();
    assert!(exhausted >= 170, "{exhausted} operations failed fast");
    let m = metrics_of.metrics().snapshot();
    assert_eq!(m.calls, 200);
    assert_eq!(m.retries as usize, received - 200);
    assert_eq!(m.budget_rejections as usize, exhausted);

    // Without a budget every operation makes all its attempts.
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(5)
        .no_budget()
        .no_deadline()
        .build()
        .unwrap();
    let (received, _) = outage(p, 200).await;
    assert_eq!(received, 1000);
}

#[tokio::test]
async fn successes_refill_the_budget() {
    let failing = support::answering(503).await;
    let healthy = support::answering(200).await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(3)
        .budget(1.0, 0.5, 1.0)
        .build()
        .unwrap();
    let budget_of = p.clone();
    let (c, _) = client(p);
    let reason = |r: &reqwest::Response| r.extensions().get::<RetryReport>().unwrap().clone();

    // One retry drains the bucket; the next operation fails fast.
    let r = reason(&c.get(failing.uri()).send().await.unwrap());
    assert_eq!(
        (r.attempts(), r.stop_reason()),
        (2, StopReason::BudgetExhausted)
    );
    let r = reason(&c.get(failing.uri()).send().await.unwrap());
    assert_eq!(
        (r.attempts(), r.stop_reason()),
        (1, StopReason::BudgetExhausted)
    );
    assert_eq!(budget_of.budget().unwrap().balance(), 0.5);

    // A successful call deposits; the next failing operation can retry again.
    c.get(healthy.uri()).send().await.unwrap();
    assert_eq!(budget_of.budget().unwrap().balance(), 1.0);
    let r = reason(&c.get(failing.uri()).send().await.unwrap());
    assert_eq!(r.attempts(), 2);
}

#[tokio::test]
async fn clones_of_the_client_share_one_budget() {
    let failing = support::answering(503).await;
    let clock = ManualClock::new();
    let p = policy(&clock)
        .max_attempts(2)
        .budget(1.0, 0.0, 1.0)
        .build()
        .unwrap();
    let (a, _) = client(p.clone());
    let b = a.clone();
    let (other_client_same_policy, _) = client(p);
    let first = a.get(failing.uri()).send().await.unwrap();
    assert_eq!(
        first.extensions().get::<RetryReport>().unwrap().attempts(),
        2
    );
    for c in [&b, &other_client_same_policy] {
        let r = c.get(failing.uri()).send().await.unwrap();
        let report = r.extensions().get::<RetryReport>().unwrap();
        assert_eq!(report.stop_reason(), StopReason::BudgetExhausted);
    }
}

#[tokio::test]
async fn the_budget_is_on_by_default() {
    let policy = RetryPolicy::default();
    let budget = policy.budget().expect("on by default");
    assert_eq!(budget.capacity(), 10.0);
    // Full at start: ten retries, then none.
    assert_eq!((0..20).filter(|_| budget.try_withdraw_retry()).count(), 10);
    // 10 % per first attempt, 1 per retry: nine deposits are not a retry,
    // ten are.
    for _ in 0..9 {
        budget.deposit();
    }
    assert!(!budget.try_withdraw_retry());
    budget.deposit();
    assert!(budget.try_withdraw_retry());
    assert!(!budget.try_withdraw_retry());
}
