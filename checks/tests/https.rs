//! https through the re-exported reqwest: the crate's `default-tls` feature
//! (on by default) gives `reqwest_safe_retry::reqwest` the TLS a plain
//! `reqwest = "0.13"` has; without a TLS feature an https URL is refused
//! before anything is sent. Checked against a local TLS server whose
//! certificate is made at run time (OpenSSL on the server side, so the
//! client's TLS meets another implementation).
//!
//! `cargo test --test https` checks the first half,
//! `cargo test --no-default-features --test https` the second.
#![cfg(target_os = "linux")]

use std::sync::atomic::Ordering;
#[cfg(feature = "default-tls")]
use std::sync::{atomic::AtomicUsize, Arc};

#[cfg(feature = "default-tls")]
use openssl::pkey::{PKey, Private};
#[cfg(feature = "default-tls")]
use openssl::x509::X509;
use reqwest_safe_retry::reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::time::ManualClock;
use reqwest_safe_retry::{RetryMiddleware, RetryPolicy};
#[cfg(feature = "default-tls")]
use tokio::net::TcpListener;

#[path = "support/tls.rs"]
mod tls;

#[cfg(feature = "default-tls")]
use tls::{certificate, key, leaf_or_ca, tls_server_counting, Certificates, Leaf};
use tls::{certificates, tls_server};

fn client(inner: reqwest_safe_retry::reqwest::Client, clock: &ManualClock) -> ClientWithMiddleware {
    let policy = RetryPolicy::builder()
        .manual_clock(clock)
        .seed(7)
        .build()
        .unwrap();
    ClientBuilder::new(inner)
        .with(RetryMiddleware::new(policy))
        .build()
}

#[cfg(feature = "default-tls")]
#[tokio::test]
async fn https_works_through_the_re_exported_reqwest_and_is_retried() {
    use reqwest_safe_retry::reqwest::Certificate;
    use reqwest_safe_retry::{RetryReportExt, StopReason};

    let certs = certificates();
    let (addr, requests) = tls_server(&certs, 1).await;
    let inner = reqwest_safe_retry::reqwest::Client::builder()
        .tls_certs_only([Certificate::from_pem(&certs.ca).unwrap()])
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let response = client(inner, &clock)
        .get(format!("https://{addr}/orders/42"))
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 200);
    let report = response.retry_report().unwrap().clone();
    assert_eq!(report.attempts(), 2, "the 503 was retried over TLS");
    assert_eq!(report.stop_reason(), StopReason::Success);
    assert_eq!(clock.sleeps().len(), 1, "recorded, never slept");
    assert_eq!(response.text().await.unwrap(), "ok over tls");
    assert_eq!(requests.load(Ordering::SeqCst), 2);
}

#[cfg(feature = "default-tls")]
#[tokio::test]
async fn a_certificate_the_client_does_not_trust_fails_the_handshake() {
    // The client trusts another authority: the certificate is checked, the
    // handshake fails (reqwest calls it a connect error) and the server
    // never reads a request.
    let certs = certificates();
    let other = certificates();
    let (addr, requests) = tls_server(&certs, 0).await;
    let inner = reqwest_safe_retry::reqwest::Client::builder()
        .tls_certs_only([reqwest_safe_retry::reqwest::Certificate::from_pem(&other.ca).unwrap()])
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let err = client(inner, &clock)
        .get(format!("https://{addr}/"))
        .send()
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    assert_eq!(requests.load(Ordering::SeqCst), 0);
}

/// Calls a TLS server whose certificate is `server` (with its key) from a
/// client that trusts only the authority `trusted`: the error, the
/// report, and the connections the server accepted.
#[cfg(feature = "default-tls")]
async fn rejected(
    server: &X509,
    key: &PKey<Private>,
    trusted: &X509,
) -> (
    reqwest_middleware::Error,
    reqwest_safe_retry::RetryReport,
    usize,
) {
    let certs = Certificates {
        ca: trusted.to_pem().unwrap(),
        server: server.to_pem().unwrap(),
        server_key: key.private_key_to_pem_pkcs8().unwrap(),
    };
    let (addr, requests, connections) = tls_server_counting(&certs, 0).await;
    let inner = reqwest_safe_retry::reqwest::Client::builder()
        .tls_certs_only([reqwest_safe_retry::reqwest::Certificate::from_pem(&certs.ca).unwrap()])
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let slot = reqwest_safe_retry::ReportSlot::new();
    let err = client(inner, &clock)
        .get(format!("https://{addr}/"))
        .with_extension(slot.clone())
        .send()
        .await
        .unwrap_err();
    assert_eq!(requests.load(Ordering::SeqCst), 0);
    let report = slot.take().unwrap();
    (err, report, connections.load(Ordering::SeqCst))
}

/// A certificate the client rejects is permanent: no second handshake
/// will pass it, so there is one attempt, stopped as permanent (each was
/// tried three times, as a transient connect error). The caller's error
/// is still reqwest's connect error. Cases: an authority the client does
/// not trust, a self-signed CA certificate served as the server's (what
/// `openssl req -x509` makes: rustls's `CaUsedAsEndEntity`), a name that
/// is not the host's, an expired certificate; and a handshake the server
/// refuses.
#[cfg(feature = "default-tls")]
#[tokio::test]
async fn a_certificate_the_client_rejects_is_not_retried() {
    use reqwest_safe_retry::StopReason;

    let (ca_key, server_key) = (key(), key());
    let ca = certificate("reqwest-safe-retry test CA", &ca_key, None);
    let other_key = key();
    let other_ca = certificate("another CA", &other_key, None);
    let good = leaf_or_ca(
        "127.0.0.1",
        &server_key,
        Some((&ca, &ca_key)),
        Leaf::default(),
    );
    let like_openssl_req = Leaf {
        like_openssl_req: true,
        ..Leaf::default()
    };
    let self_signed = leaf_or_ca("127.0.0.1", &server_key, None, like_openssl_req);
    let wrong_name = Leaf {
        wrong_name: true,
        ..Leaf::default()
    };
    let expired = Leaf {
        expired: true,
        ..Leaf::default()
    };
    // And one the server's OpenSSL refuses to serve (a CA certificate
    // whose key may only sign certificates): rustls reads the server's
    // `handshake_failure` alert, which the same handshake meets again.
    let unusable = certificate("127.0.0.1", &server_key, None);
    let cases = [
        ("untrusted", good.clone(), other_ca.clone()),
        ("refused by the server", unusable.clone(), unusable),
        ("self-signed", self_signed.clone(), self_signed),
        (
            "wrong name",
            leaf_or_ca("example.com", &server_key, Some((&ca, &ca_key)), wrong_name),
            ca.clone(),
        ),
        (
            "expired",
            leaf_or_ca("127.0.0.1", &server_key, Some((&ca, &ca_key)), expired),
            ca.clone(),
        ),
    ];
    for (case, server, trusted) in cases {
        let (err, report, connections) = rejected(&server, &server_key, &trusted).await;
        assert!(err.is_connect(), "{case}: {err:?}");
        assert_eq!(report.attempts(), 1, "{case}: {err:?}");
        assert_eq!(report.stop_reason(), StopReason::Permanent, "{case}");
        assert_eq!(connections, 1, "{case}");
    }
    // The good certificate, for contrast, is accepted.
    let (addr, requests, _) = tls_server_counting(
        &Certificates {
            ca: ca.to_pem().unwrap(),
            server: good.to_pem().unwrap(),
            server_key: server_key.private_key_to_pem_pkcs8().unwrap(),
        },
        0,
    )
    .await;
    let inner = reqwest_safe_retry::reqwest::Client::builder()
        .tls_certs_only([
            reqwest_safe_retry::reqwest::Certificate::from_pem(&ca.to_pem().unwrap()).unwrap(),
        ])
        .build()
        .unwrap();
    let response = client(inner, &ManualClock::new())
        .get(format!("https://{addr}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(requests.load(Ordering::SeqCst), 1);
}

/// The deliberate difference from reqwest-retry (README, "What behaves
/// differently"): it retries a rejected certificate as any connect error,
/// three handshakes for a certificate that fails each one.
#[cfg(feature = "default-tls")]
#[tokio::test]
async fn reqwest_retry_tries_a_rejected_certificate_three_times() {
    use reqwest_retry::policies::ExponentialBackoff;
    use reqwest_retry::RetryTransientMiddleware;

    let key = key();
    let self_signed = leaf_or_ca(
        "127.0.0.1",
        &key,
        None,
        Leaf {
            like_openssl_req: true,
            ..Leaf::default()
        },
    );
    let certs = Certificates {
        ca: self_signed.to_pem().unwrap(),
        server: self_signed.to_pem().unwrap(),
        server_key: key.private_key_to_pem_pkcs8().unwrap(),
    };
    let (addr, _, connections) = tls_server_counting(&certs, 0).await;
    let inner = reqwest_safe_retry::reqwest::Client::builder()
        .tls_certs_only([reqwest_safe_retry::reqwest::Certificate::from_pem(&certs.ca).unwrap()])
        .build()
        .unwrap();
    // Two retries, no waiting: reqwest-retry sleeps for real.
    let policy = ExponentialBackoff::builder()
        .retry_bounds(std::time::Duration::ZERO, std::time::Duration::ZERO)
        .build_with_max_retries(2);
    let theirs = ClientBuilder::new(inner)
        .with(RetryTransientMiddleware::new_with_policy(policy))
        .build();
    let err = theirs
        .get(format!("https://{addr}/"))
        .send()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("after 2 retries"), "{err}");
    assert_eq!(connections.load(Ordering::SeqCst), 3);
    // Ours: one handshake (`a_certificate_the_client_rejects_is_not_retried`).
    let (_, report, connections) = rejected(&self_signed, &key, &self_signed).await;
    assert_eq!((report.attempts(), connections), (1, 1));
}

/// A handshake the server breaks off (it accepts, then hangs up) says
/// nothing of the certificate: transient, retried as before.
#[cfg(feature = "default-tls")]
#[tokio::test]
async fn a_handshake_cut_short_is_still_retried() {
    use reqwest_safe_retry::StopReason;

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let accepted = connections.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            drop(tcp);
        }
    });
    let certs = certificates();
    let inner = reqwest_safe_retry::reqwest::Client::builder()
        .tls_certs_only([reqwest_safe_retry::reqwest::Certificate::from_pem(&certs.ca).unwrap()])
        .build()
        .unwrap();
    let clock = ManualClock::new();
    let slot = reqwest_safe_retry::ReportSlot::new();
    let err = client(inner, &clock)
        .get(format!("https://{addr}/"))
        .with_extension(slot.clone())
        .send()
        .await
        .unwrap_err();
    let report = slot.take().unwrap();
    assert_eq!(report.attempts(), 3, "{err:?}");
    assert_eq!(report.stop_reason(), StopReason::AttemptsExhausted);
    assert_eq!(connections.load(Ordering::SeqCst), 3);
}

#[cfg(not(any(feature = "default-tls", feature = "native-tls")))]
#[tokio::test]
async fn without_a_tls_feature_https_is_refused_before_anything_is_sent() {
    // What a user sees with `default-features = false` and no TLS of
    // their own: the error the README's "Versions" note names. hyper's
    // connector refuses the scheme, so no connection is made and the server
    // reads nothing.
    let certs = certificates();
    let (addr, requests) = tls_server(&certs, 0).await;
    let clock = ManualClock::new();
    let err = client(reqwest_safe_retry::reqwest::Client::new(), &clock)
        .get(format!("https://{addr}/"))
        .send()
        .await
        .unwrap_err();
    assert!(
        format!("{err:?}").contains("invalid URL, scheme is not http"),
        "{err:?}"
    );
    assert_eq!(requests.load(Ordering::SeqCst), 0);
}
