//! The public types are what a library's users need: Send, Sync, Debug,
//! object-safe extension points.

use reqwest_safe_retry::*;

fn send_sync<T: Send + Sync + 'static>() {}
fn debug<T: std::fmt::Debug>() {}

#[test]
fn public_types_are_send_sync_and_debug() {
    send_sync::<RetryMiddleware>();
    send_sync::<RetryPolicy>();
    send_sync::<RetryReport>();
    send_sync::<RetryError>();
    send_sync::<ConfigError>();
    send_sync::<KeyError>();
    send_sync::<TokenBucket>();
    send_sync::<AdaptiveAdmission>();
    send_sync::<NoAdmission>();
    send_sync::<ReportSlot>();
    send_sync::<RequestOptions>();
    send_sync::<ManualClock>();
    send_sync::<Partition>();
    send_sync::<CircuitBreakerConfig>();
    debug::<RetryMiddleware>();
    debug::<RetryPolicyBuilder>();
    debug::<RequestOptions>();
    debug::<MetricsSnapshot>();
    debug::<Backoff>();
    debug::<AdaptiveConfig>();
    debug::<TokenBucketConfig>();
    debug::<RetryRequest>();
    debug::<Admission>();
    debug::<ReportSlot>();
    debug::<RetryPolicy>();
    debug::<Partition>();
    debug::<CircuitBreakerConfig>();
}

#[test]
fn extension_points_are_object_safe() {
    let _: Option<Box<dyn Classifier>> = None;
    let _: Option<Box<dyn Sleeper>> = None;
    let _: Option<Box<dyn Clock>> = None;
    let _: Option<Box<dyn RetryAdmission>> = None;
}

#[test]
fn errors_are_std_errors_with_lowercase_messages() {
    fn std_error<E: std::error::Error + Send + Sync + 'static>() {}
    std_error::<RetryError>();
    std_error::<ConfigError>();
    std_error::<KeyError>();
    let e = IdempotencyKey::new("").unwrap_err().to_string();
    assert_eq!(e, "invalid idempotency key: the key is empty");
}

#[test]
fn stop_reasons_have_the_snake_case_names_of_the_contract() {
    let names = [
        (StopReason::Success, "success"),
        (StopReason::Permanent, "permanent"),
        (StopReason::AttemptsExhausted, "attempts_exhausted"),
        (StopReason::Deadline, "deadline"),
        (StopReason::BudgetExhausted, "budget_exhausted"),
        (StopReason::RetryAfterTooLong, "retry_after_too_long"),
        (StopReason::NotIdempotent, "not_idempotent"),
        (StopReason::BodyNotCloneable, "body_not_cloneable"),
        (StopReason::BodyTooLargeToReplay, "body_too_large_to_replay"),
        (StopReason::ServerSaidNo, "server_said_no"),
        (StopReason::CircuitOpen, "circuit_open"),
    ];
    for (reason, name) in names {
        assert_eq!(reason.as_str(), name);
        assert_eq!(
            serde_json::to_string(&reason).unwrap(),
            format!("\"{name}\"")
        );
    }
}

#[test]
fn deadline_propagation_types_are_send_sync_and_debug() {
    type Handler = tower::util::BoxCloneSyncService<
        http::Request<String>,
        http::Response<String>,
        std::convert::Infallible,
    >;
    send_sync::<InheritedDeadline>();
    send_sync::<InheritDeadlineLayer>();
    send_sync::<InheritDeadline<Handler>>();
    send_sync::<GiveUp>();
    debug::<InheritedDeadline>();
    debug::<InheritDeadlineLayer>();
    debug::<InheritDeadline<Handler>>();
    debug::<GiveUp>();
    // The response future is Send when the inner one is: axum needs it.
    fn send<T: Send>() {}
    send::<InheritDeadlineFuture<<Handler as tower::Service<http::Request<String>>>::Future, String>>(
    );
    debug::<InheritDeadlineFuture<std::future::Ready<()>, String>>();
}
