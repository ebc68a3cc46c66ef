//! One Idempotency-Key per logical operation, reused on every attempt.

mod support;

use std::collections::HashSet;

use reqwest_safe_retry::keys::{KeyFormat, KeyGenerator};
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{IdempotencyKey, RequestOptions, RetryError, RetryReport};
use support::{client, policy};
use wiremock::MockServer;

async fn keys_received(server: &MockServer) -> Vec<Option<String>> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| {
            r.headers
                .get("idempotency-key")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect()
}

#[tokio::test]
async fn every_attempt_carries_the_same_key_and_the_report_names_it() {
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).max_attempts(4).build().unwrap());
    let response = c.post(server.uri()).body("{}").send().await.unwrap();
    let keys = keys_received(&server).await;
    assert_eq!(keys.len(), 4);
    let first = keys[0].clone().expect("POST gets a key");
    assert!(keys.iter().all(|k| k.as_deref() == Some(first.as_str())));
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.idempotency_key(), Some(first.as_str()));
    assert_eq!(uuid::Uuid::parse_str(&first).unwrap().get_version_num(), 4);
}

#[tokio::test]
async fn distinct_logical_operations_get_distinct_keys() {
    let server = support::answering(201).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    for _ in 0..20 {
        c.post(server.uri()).body("{}").send().await.unwrap();
        c.patch(server.uri()).body("{}").send().await.unwrap();
    }
    let keys: HashSet<_> = keys_received(&server)
        .await
        .into_iter()
        .map(|k| k.expect("POST and PATCH get keys"))
        .collect();
    assert_eq!(keys.len(), 40);
}

#[tokio::test]
async fn no_key_on_idempotent_methods_by_default() {
    let server = support::answering(200).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    c.get(server.uri()).send().await.unwrap();
    c.put(server.uri()).body("x").send().await.unwrap();
    c.delete(server.uri()).send().await.unwrap();
    let response = c.head(server.uri()).send().await.unwrap();
    assert_eq!(keys_received(&server).await, vec![None; 4]);
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.idempotency_key(), None);
}

#[tokio::test]
async fn the_method_set_and_header_name_are_configurable() {
    let server = support::answering(200).await;
    let clock = ManualClock::new();
    let (c, _) = client(
        policy(&clock)
            .idempotency_methods([http::Method::PUT])
            .idempotency_header("X-Request-Key")
            .build()
            .unwrap(),
    );
    c.put(server.uri()).body("x").send().await.unwrap();
    c.post(server.uri()).body("x").send().await.unwrap();
    let requests = server.received_requests().await.unwrap();
    assert!(requests[0].headers.contains_key("x-request-key"));
    assert!(!requests[1].headers.contains_key("x-request-key"));
    assert!(!requests[0].headers.contains_key("idempotency-key"));
}

#[tokio::test]
async fn a_key_the_caller_set_is_kept() {
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    let response = c
        .post(server.uri())
        .header("Idempotency-Key", "order-42")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        keys_received(&server).await,
        vec![Some("order-42".to_owned()); 3]
    );
    let report = response.extensions().get::<RetryReport>().unwrap();
    assert_eq!(report.idempotency_key(), Some("order-42"));
}

#[tokio::test]
async fn a_key_passed_through_extensions_is_used_on_every_attempt() {
    let server = support::answering(503).await;
    let clock = ManualClock::new();
    let (c, _) = client(policy(&clock).build().unwrap());
    c.post(server.uri())
        .with_extension(
            RequestOptions::new().idempotency_key(IdempotencyKey::new("order-7-charge").unwrap()),
        )
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        keys_received(&server).await,
        vec![Some("order-7-charge".to_owned()); 3]
    );
}

#[tokio::test]
async fn an_invalid_key_is_refused_before_anything_is_sent() {
    let server = support::answering(200).await;
    let clock = ManualClock::new();
    let (c, recorder) = client(policy(&clock).build().unwrap());
    for bad in ["k".repeat(256), "two words".to_owned(), String::new()] {
        let err = c
            .post(server.uri())
            .header("Idempotency-Key", bad.as_str())
            .body("{}")
            .send()
            .await
            .unwrap_err();
        let e = RetryError::from_middleware(&err).unwrap();
        assert_eq!(e.report().attempts(), 0);
        assert!(
            err.to_string().contains("request failed after 0 attempts"),
            "{err}"
        );
        let source = std::error::Error::source(e).unwrap().to_string();
        assert!(source.contains("invalid idempotency key"), "{source}");
    }
    assert!(recorder.sent().is_empty());
    assert!(server.received_requests().await.unwrap().is_empty());
}

/// Two key lines, valid or not, are refused as one bad key is: a server
/// reads one of them (which one is its own choice) or, as the server half
/// does, refuses both, and the report could name only one.
#[tokio::test]
async fn a_key_header_given_twice_is_refused_before_anything_is_sent() {
    let server = support::answering(200).await;
    let clock = ManualClock::new();
    let (c, recorder) = client(policy(&clock).build().unwrap());
    for second in ["key-b".to_owned(), "k".repeat(256), "key-a".to_owned()] {
        let err = c
            .post(server.uri())
            .header("Idempotency-Key", "key-a")
            .header("Idempotency-Key", second.as_str())
            .body("{}")
            .send()
            .await
            .unwrap_err();
        let e = RetryError::from_middleware(&err).unwrap();
        assert_eq!(e.report().attempts(), 0);
        let source = std::error::Error::source(e).unwrap().to_string();
        assert!(source.contains("must appear only once"), "{source}");
    }
    assert!(recorder.sent().is_empty());
    assert!(server.received_requests().await.unwrap().is_empty());
}

#[tokio::test]
async fn opting_out_attaches_no_key_and_v7_keys_are_time_ordered() {
    let server = support::answering(200).await;
    let clock = ManualClock::new();
    let (c, _) = client(
        policy(&clock)
            .key_generator(KeyGenerator::UuidV7)
            .key_format(KeyFormat::StructuredField)
            .build()
            .unwrap(),
    );
    c.post(server.uri())
        .with_extension(RequestOptions::new().no_idempotency_key())
        .send()
        .await
        .unwrap();
    c.post(server.uri()).send().await.unwrap();
    c.post(server.uri()).send().await.unwrap();
    let keys = keys_received(&server).await;
    assert_eq!(keys[0], None);
    let (a, b) = (keys[1].clone().unwrap(), keys[2].clone().unwrap());
    assert!(
        a.starts_with('"') && a.ends_with('"'),
        "structured-field form: {a}"
    );
    let a = uuid::Uuid::parse_str(a.trim_matches('"')).unwrap();
    let b = uuid::Uuid::parse_str(b.trim_matches('"')).unwrap();
    assert_eq!(a.get_version_num(), 7);
    assert!(a < b);
}
