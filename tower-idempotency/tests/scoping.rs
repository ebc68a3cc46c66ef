//! Keys are scoped by caller identity: one tenant never replays another's.
mod support;
use support::{app, req, send, Harness};

both_stores!(tenants_do_not_share_keys);

async fn tenants_do_not_share_keys(h: Harness) {
    let (router, state) = app(h.layer());
    let as_tenant = |t: &'static str, body: &'static str| {
        req(
            "POST",
            "/payments",
            Some("same-key"),
            body,
            &[("x-tenant", t)],
        )
    };
    let a = send(&router, as_tenant("A", "from A")).await;
    assert_eq!(a.status, 201);
    // Tenant B uses the same key (even with a different body): its own run,
    // never A's response and never a 422.
    let b = send(&router, as_tenant("B", "from B")).await;
    assert_eq!(b.status, 201);
    assert!(!b.replayed());
    assert_eq!(b.json()["body"], "from B");
    assert_eq!(state.runs(), 2);
    // Each replays only its own response.
    let a2 = send(&router, as_tenant("A", "from A")).await;
    assert!(a2.replayed());
    assert_eq!(a2.body, a.body);
    let b2 = send(&router, as_tenant("B", "from B")).await;
    assert!(b2.replayed());
    assert_eq!(b2.body, b.body);
    assert_eq!(state.runs(), 2);
}
