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

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::{PKey, Private};
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
};
use openssl::x509::{X509NameBuilder, X509};
use reqwest_safe_retry::reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::{ManualClock, RetryMiddleware, RetryPolicy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A certificate authority and a server certificate for 127.0.0.1 it
/// signed, as PEM.
struct Certificates {
    #[cfg_attr(not(feature = "default-tls"), allow(dead_code))]
    ca: Vec<u8>,
    server: Vec<u8>,
    server_key: Vec<u8>,
}

fn key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

fn certificate(
    common_name: &str,
    key: &PKey<Private>,
    issuer: Option<(&X509, &PKey<Private>)>,
) -> X509 {
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", common_name).unwrap();
    let name = name.build();
    let mut serial = BigNum::new().unwrap();
    serial.rand(64, MsbOption::MAYBE_ZERO, false).unwrap();
    let mut cert = X509::builder().unwrap();
    cert.set_version(2).unwrap();
    cert.set_serial_number(&serial.to_asn1_integer().unwrap())
        .unwrap();
    cert.set_subject_name(&name).unwrap();
    cert.set_pubkey(key).unwrap();
    cert.set_not_before(&Asn1Time::days_from_now(0).unwrap())
        .unwrap();
    cert.set_not_after(&Asn1Time::days_from_now(2).unwrap())
        .unwrap();
    let (issuer_name, signing_key) = match issuer {
        Some((ca, ca_key)) => {
            cert.append_extension(BasicConstraints::new().build().unwrap())
                .unwrap();
            cert.append_extension(
                KeyUsage::new()
                    .digital_signature()
                    .key_encipherment()
                    .build()
                    .unwrap(),
            )
            .unwrap();
            cert.append_extension(ExtendedKeyUsage::new().server_auth().build().unwrap())
                .unwrap();
            let san = SubjectAlternativeName::new()
                .ip("127.0.0.1")
                .build(&cert.x509v3_context(Some(ca), None))
                .unwrap();
            cert.append_extension(san).unwrap();
            (ca.subject_name(), ca_key)
        }
        None => {
            cert.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
                .unwrap();
            cert.append_extension(
                KeyUsage::new()
                    .critical()
                    .key_cert_sign()
                    .crl_sign()
                    .build()
                    .unwrap(),
            )
            .unwrap();
            (name.as_ref(), key)
        }
    };
    cert.set_issuer_name(issuer_name).unwrap();
    cert.sign(signing_key, MessageDigest::sha256()).unwrap();
    cert.build()
}

fn certificates() -> Certificates {
    let ca_key = key();
    let ca = certificate("reqwest-safe-retry test CA", &ca_key, None);
    let server_key = key();
    let server = certificate("127.0.0.1", &server_key, Some((&ca, &ca_key)));
    Certificates {
        ca: ca.to_pem().unwrap(),
        server: server.to_pem().unwrap(),
        server_key: server_key.private_key_to_pem_pkcs8().unwrap(),
    }
}

/// A TLS server on 127.0.0.1 that answers its first `failures` requests
/// 503, then 200 `ok over tls`; it counts the requests it read.
async fn tls_server(certs: &Certificates, failures: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    let identity =
        tokio_native_tls::native_tls::Identity::from_pkcs8(&certs.server, &certs.server_key)
            .unwrap();
    let acceptor = tokio_native_tls::TlsAcceptor::from(
        tokio_native_tls::native_tls::TlsAcceptor::new(identity).unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let seen = requests.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let seen = seen.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer: &[u8] = if seen.fetch_add(1, Ordering::SeqCst) < failures {
                    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                } else {
                    b"HTTP/1.1 200 OK\r\ncontent-length: 11\r\nconnection: close\r\n\r\nok over tls"
                };
                let _ = tls.write_all(answer).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (addr, requests)
}

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
