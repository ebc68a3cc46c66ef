//! Keys are scoped by caller: by default a digest of `Authorization`, or a
//! scope function. One caller never sees another's keys, responses or 422s.
mod support;
use axum::body::Body;
use axum::http::Request;
use support::{app, req, send, Harness};
use tower_idempotency::IdempotencyLayer;

both_stores!(
    tenants_do_not_share_keys,
    default_scope_is_the_credential,
    long_scopes_are_stored,
    scope_by_principal_survives_a_token_refresh
);

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

fn with_auth(auth: Option<&str>, body: &str) -> Request<Body> {
    let mut headers = vec![];
    if let Some(auth) = auth {
        headers.push(("authorization", auth));
    }
    req("POST", "/payments", Some("same-key"), body, &headers)
}

async fn default_scope_is_the_credential(h: Harness) {
    // The layer's defaults: no scope function.
    let (router, state) = app(IdempotencyLayer::from_arc(h.store.clone()));
    // Unique credentials per run, since the default scope has no test prefix.
    let alice = format!("Bearer alice-{}", h.scope);
    let bob = format!("Bearer bob-{}", h.scope);
    let a = send(&router, with_auth(Some(&alice), "pay 10")).await;
    assert_eq!(a.status, 201);
    // Same key, same body, other credentials: B's own run, not A's receipt.
    let b_same = send(&router, with_auth(Some(&bob), "pay 10")).await;
    assert_eq!(b_same.status, 201, "{}", h.name);
    assert!(!b_same.replayed(), "{}: B got A's stored response", h.name);
    assert_eq!(state.runs(), 2);
    // Other credentials, same key, other body: no 422 for B.
    let carol = format!("Bearer carol-{}", h.scope);
    let c_other = send(&router, with_auth(Some(&carol), "pay 99")).await;
    assert_eq!(c_other.status, 201);
    assert_eq!(state.runs(), 3);
    // Each credential replays its own response and is refused another body.
    let a2 = send(&router, with_auth(Some(&alice), "pay 10")).await;
    assert!(a2.replayed());
    assert_eq!(a2.body, a.body);
    send(&router, with_auth(Some(&alice), "pay 99"))
        .await
        .assert_problem(422);
    assert_eq!(state.runs(), 3);
    // The scope the handler sees is a digest, not the secret.
    let parts = with_auth(Some(&alice), "").into_parts().0;
    let scope = IdempotencyLayer::from_arc(h.store.clone()).stored_scope(&parts);
    assert_eq!(scope.len(), 64);
    assert!(!scope.contains("alice"));
}

async fn long_scopes_are_stored(h: Harness) {
    // A scope function returning 4 000 characters: PostgreSQL refused such a
    // row (btree limit) and the layer answered 503 + Retry-After.
    let long = format!("{}{}", h.scope, "x".repeat(4000));
    let layer = IdempotencyLayer::builder_from_arc(h.store.clone())
        .scope_with(move |_| long.clone())
        .build()
        .unwrap();
    let (router, state) = app(layer);
    let make = || req("POST", "/payments", Some("k"), "a", &[]);
    assert_eq!(send(&router, make()).await.status, 201, "{}", h.name);
    assert!(send(&router, make()).await.replayed());
    assert_eq!(state.runs(), 1);
}

/// The principal an authentication layer found, as it puts it in the
/// request's extensions.
#[derive(Clone)]
struct Principal(String);

/// Scoped by the authenticated principal (the documented way, not the
/// token): a client whose OAuth token is refreshed between two attempts
/// gets the replay, not a second run; another principal's same key is its
/// own.
async fn scope_by_principal_survives_a_token_refresh(h: Harness) {
    let prefix = h.scope.clone();
    let layer = IdempotencyLayer::builder_from_arc(h.store.clone())
        .scope_with(move |parts| {
            let principal = parts.extensions.get::<Principal>().map(|p| p.0.as_str());
            format!("{prefix}/{}", principal.unwrap_or(""))
        })
        .build()
        .unwrap();
    let (router, state) = app(layer);
    // The "authentication layer": token -> principal.
    let router = router.layer(tower::util::MapRequestLayer::new(
        |mut request: Request<Body>| {
            let token = request.headers()["authorization"].to_str().unwrap();
            let principal = token.split('-').next().unwrap().to_owned();
            request.extensions_mut().insert(Principal(principal));
            request
        },
    ));
    let first = send(&router, with_auth(Some("Bearer alice-token1"), "pay")).await;
    assert_eq!(first.status, 201);
    let refreshed = send(&router, with_auth(Some("Bearer alice-token2"), "pay")).await;
    assert!(
        refreshed.replayed(),
        "{}: a refreshed token ran it again",
        h.name
    );
    assert_eq!(refreshed.body, first.body);
    let bob = send(&router, with_auth(Some("Bearer bob-token1"), "pay")).await;
    assert!(!bob.replayed());
    assert_eq!(state.runs(), 2);
}
