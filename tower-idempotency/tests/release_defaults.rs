//! By default only the request-validation statuses (400, 415, 422) free a
//! key; every other status is stored and replayed, 409 and 5xx included: a
//! handler's own 409 may follow an effect.
mod support;
use support::{app, req, send, Harness};

both_stores!(only_validation_statuses_free_the_key);

async fn only_validation_statuses_free_the_key(h: Harness) {
    let (router, state) = app(h.layer());
    let with_status =
        |key: &str, status: &str| req("POST", "/payments", Some(key), "a", &[("x-status", status)]);
    for (i, status) in ["409", "500", "503", "429", "404"].into_iter().enumerate() {
        let key = format!("stored-{i}");
        let first = send(&router, with_status(&key, status)).await;
        assert_eq!(first.status.as_str(), status);
        let retry = send(&router, with_status(&key, status)).await;
        assert!(retry.replayed(), "{}: {status} was not stored", h.name);
        assert_eq!(retry.body, first.body);
    }
    for (i, status) in ["400", "415", "422"].into_iter().enumerate() {
        let key = format!("freed-{i}");
        send(&router, with_status(&key, status)).await;
        let retry = send(&router, with_status(&key, status)).await;
        assert!(!retry.replayed(), "{}: {status} was stored", h.name);
    }
    assert_eq!(state.runs(), 5 + 2 * 3);
}
