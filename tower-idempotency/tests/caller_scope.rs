//! The layer tells the layers around it which caller it scoped a request
//! to: the [`CallerScope`] request extension holds the stored scope (never
//! the credential), set in the one an outer layer put in the request, or
//! put there for the layers and the handler inside. So the keys a handler
//! derives for its own calls follow the server's notion of the caller.
mod support;

use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::Request;
use axum::routing::post;
use axum::{Extension, Router};
use idempotency_key::CallerScope;
use support::{send, unique, Harness};
use tower_idempotency::IdempotencyLayer;

both_stores!(the_stored_scope_reaches_the_layers_around);

/// An app whose handler notes the scope it finds, behind `layer`; with
/// `outer`, a layer outside puts that (unset) scope in each request first.
fn app(
    layer: IdempotencyLayer,
    outer: Option<CallerScope>,
) -> (Router, Arc<Mutex<Vec<Option<String>>>>) {
    let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
    let noted = seen.clone();
    let handler = move |scope: Option<Extension<CallerScope>>| {
        let noted = noted.clone();
        async move {
            let scope = scope.and_then(|Extension(s)| s.get().map(str::to_owned));
            noted.lock().unwrap().push(scope);
            "paid"
        }
    };
    let mut router = Router::new().route("/payments", post(handler)).layer(layer);
    if let Some(outer) = outer {
        router = router.layer(tower::util::MapRequestLayer::new(
            move |mut request: Request<Body>| {
                request.extensions_mut().insert(outer.clone());
                request
            },
        ));
    }
    (router, seen)
}

fn payment(key: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut request = Request::post("/payments").header("idempotency-key", key);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.body(Body::from("{}")).unwrap()
}

async fn the_stored_scope_reaches_the_layers_around(h: Harness) {
    // Scoped by a function: the stored scope of its value.
    let outer = CallerScope::new();
    let (router, seen) = app(h.layer(), Some(outer.clone()));
    send(&router, payment("k", &[("x-tenant", "t1")])).await;
    let scope = h.stored_scope("t1");
    assert_eq!(outer.get(), Some(scope.as_str()), "{}", h.name);
    assert_eq!(seen.lock().unwrap().clone(), [Some(scope.clone())]);
    // No layer outside: the handler (and the layers inside) find it set.
    let (router, seen) = app(h.layer(), None);
    send(&router, payment("k2", &[("x-tenant", "t1")])).await;
    assert_eq!(seen.lock().unwrap().clone(), [Some(scope)]);

    // The default scope: two spellings of one credential are one caller,
    // and the credential itself never shows.
    let by_credential = IdempotencyLayer::builder_from_arc(h.store.clone())
        .build()
        .unwrap();
    let (router, seen) = app(by_credential, None);
    let token = unique("secret-");
    for (key, auth) in [
        ("a", format!("Bearer {token}")),
        ("b", format!("bearer  {token}")),
    ] {
        send(
            &router,
            payment(&format!("{}{key}", h.scope), &[("authorization", &auth)]),
        )
        .await;
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen[0].is_some() && seen[0] == seen[1], "{seen:?}");
    assert!(!seen[0].as_deref().unwrap_or("").contains(&token));
}

/// PostgreSQL's transactional mode says the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transactional_mode_tells_the_scope_too() {
    let table = unique("tower_idem_t_");
    let store = support::pg_store(&table).await;
    let layer = IdempotencyLayer::transactional(store.clone())
        .scope_with(|_| "alice".to_owned())
        .build()
        .unwrap();
    let expected = layer.stored_scope(&Request::post("/").body(()).unwrap().into_parts().0);
    let outer = CallerScope::new();
    let (router, seen) = app(layer, Some(outer.clone()));
    assert_eq!(send(&router, payment("k", &[])).await.status, 200);
    assert_eq!(outer.get(), Some(expected.as_str()));
    assert_eq!(seen.lock().unwrap().clone(), [Some(expected)]);
    sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
        .execute(store.pool())
        .await
        .unwrap();
}
