//! A local TLS server with certificates made at run time: OpenSSL makes
//! them and serves them, so the client's TLS (rustls) meets another
//! implementation, as it would in production. Shared by `tests/https.rs`
//! and `tests/call_cli.rs` (`#[path = "support/tls.rs"] mod tls;`).
#![allow(dead_code, unreachable_pub)]

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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A certificate authority and a server certificate for 127.0.0.1 it
/// signed, as PEM.
pub struct Certificates {
    pub ca: Vec<u8>,
    pub server: Vec<u8>,
    pub server_key: Vec<u8>,
}

pub fn key() -> PKey<Private> {
    let group = EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap();
    PKey::from_ec_key(EcKey::generate(&group).unwrap()).unwrap()
}

pub fn certificate(
    common_name: &str,
    key: &PKey<Private>,
    issuer: Option<(&X509, &PKey<Private>)>,
) -> X509 {
    leaf_or_ca(common_name, key, issuer, Leaf::default())
}

/// How a server certificate differs from a good one.
#[derive(Default, Clone, Copy)]
pub struct Leaf {
    /// Named for `example.com`, not for 127.0.0.1.
    pub wrong_name: bool,
    /// Its validity ended yesterday.
    pub expired: bool,
    /// Self-signed, as `openssl req -x509` makes one: a CA certificate
    /// (`CA:TRUE`) with no key usage.
    pub like_openssl_req: bool,
}

pub fn leaf_or_ca(
    common_name: &str,
    key: &PKey<Private>,
    issuer: Option<(&X509, &PKey<Private>)>,
    leaf: Leaf,
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
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let (from, to) = if leaf.expired {
        (now - 10 * 86_400, now - 86_400)
    } else {
        (now - 60, now + 2 * 86_400)
    };
    cert.set_not_before(&Asn1Time::from_unix(from).unwrap())
        .unwrap();
    cert.set_not_after(&Asn1Time::from_unix(to).unwrap())
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
            let mut san = SubjectAlternativeName::new();
            if leaf.wrong_name {
                san.dns("example.com");
            } else {
                san.ip("127.0.0.1");
            }
            let san = san.build(&cert.x509v3_context(Some(ca), None)).unwrap();
            cert.append_extension(san).unwrap();
            (ca.subject_name(), ca_key)
        }
        None => {
            cert.append_extension(BasicConstraints::new().critical().ca().build().unwrap())
                .unwrap();
            // `openssl req -x509` sets no key usage: its certificate can
            // serve a handshake (and the server's OpenSSL serves it).
            if !leaf.like_openssl_req {
                cert.append_extension(
                    KeyUsage::new()
                        .critical()
                        .key_cert_sign()
                        .crl_sign()
                        .build()
                        .unwrap(),
                )
                .unwrap();
            }
            (name.as_ref(), key)
        }
    };
    cert.set_issuer_name(issuer_name).unwrap();
    cert.sign(signing_key, MessageDigest::sha256()).unwrap();
    cert.build()
}

pub fn certificates() -> Certificates {
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
pub async fn tls_server(certs: &Certificates, failures: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    let (addr, requests, _) = tls_server_counting(certs, failures).await;
    (addr, requests)
}

/// [`tls_server`], counting the connections it accepted too.
pub async fn tls_server_counting(
    certs: &Certificates,
    failures: usize,
) -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let identity =
        tokio_native_tls::native_tls::Identity::from_pkcs8(&certs.server, &certs.server_key)
            .unwrap();
    let acceptor = tokio_native_tls::TlsAcceptor::from(
        tokio_native_tls::native_tls::TlsAcceptor::new(identity).unwrap(),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicUsize::new(0));
    let connections = Arc::new(AtomicUsize::new(0));
    let (seen, accepted) = (requests.clone(), connections.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
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
    (addr, requests, connections)
}
