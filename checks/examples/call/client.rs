//! The client `call` sends through: reqwest with curl's redirect and TLS
//! options, under the retry middleware (and -v's header printer below it,
//! so each attempt is shown as it goes on the wire).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use reqwest::header::{HeaderMap, AUTHORIZATION};
use reqwest::{redirect, Method, Url};
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_safe_retry::{ReportSlot, RequestOptions, RetryMiddleware, RetryPolicy};

use super::args::Args;
use super::errors::chain;
use super::verbose;

/// The redirects the last attempt followed: how many, and where they led.
#[derive(Default)]
pub(super) struct Redirects(Mutex<(usize, Option<Url>)>);

impl Redirects {
    fn record(&self, count: usize, to: &Url) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = (count, Some(to.clone()));
    }

    /// `%{num_redirects}`: the redirects that led to `url`, the final one.
    /// An earlier attempt's redirects are not this answer's: the count
    /// holds only when the last redirect recorded led to `url`.
    pub(super) fn to(&self, url: &Url) -> usize {
        match &*self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            (count, Some(last)) if last == url => *count,
            _ => 0,
        }
    }
}

/// One request, ready to go.
pub(super) struct Call {
    client: ClientWithMiddleware,
    method: Method,
    url: String,
    headers: HeaderMap,
    options: RequestOptions,
    body: Option<Vec<u8>>,
    user: Option<(String, String)>,
    pub(super) redirects: Arc<Redirects>,
}

/// What came back: a response, or the error that ended the call.
pub(super) type Sent = Result<reqwest::Response, reqwest_middleware::Error>;

impl Call {
    pub(super) fn new(
        args: &Args,
        policy: RetryPolicy,
        method: Method,
        url: String,
        headers: HeaderMap,
        options: RequestOptions,
        body: Option<Vec<u8>>,
    ) -> Result<Call, String> {
        let redirects = Arc::new(Redirects::default());
        let mut builder = reqwest::Client::builder().redirect(redirect_policy(args, &redirects));
        builder = tls(builder, args.insecure, args.cacert.as_deref())?;
        let inner = builder
            .build()
            .map_err(|e| format!("building the client: {}", chain(&e)))?;
        let mut client = ClientBuilder::new(inner).with(RetryMiddleware::new(policy));
        if args.verbose {
            client = client.with(verbose::Headers);
        }
        // curl: -H 'Authorization: …' wins over -u.
        let user = args
            .user
            .as_deref()
            .filter(|_| !headers.contains_key(AUTHORIZATION))
            .map(|user| match user.split_once(':') {
                Some((name, password)) => (name.to_owned(), password.to_owned()),
                None => (user.to_owned(), String::new()),
            });
        Ok(Call {
            client: client.build(),
            method,
            url,
            headers,
            options,
            body,
            user,
            redirects,
        })
    }

    /// Sends the request; the report lands in `slot` whatever happens.
    pub(super) async fn send(&self, slot: ReportSlot) -> Sent {
        let mut request = self
            .client
            .request(self.method.clone(), &self.url)
            .headers(self.headers.clone())
            .with_extension(self.options.clone())
            .with_extension(slot);
        if let Some((name, password)) = &self.user {
            request = request.basic_auth(name, Some(password));
        }
        if let Some(body) = &self.body {
            request = request.body(body.clone());
        }
        request.send().await
    }

    /// The URL as given, for `%{url_effective}` when no response came.
    pub(super) fn url(&self) -> &str {
        &self.url
    }
}

/// curl's: no redirect is followed without -L; with it, at most
/// --max-redirs, and more is an error (exit 47).
fn redirect_policy(args: &Args, redirects: &Arc<Redirects>) -> redirect::Policy {
    if !args.location {
        return redirect::Policy::none();
    }
    let (max, verbose, record) = (args.max_redirs, args.verbose, redirects.clone());
    redirect::Policy::custom(move |attempt| {
        // `previous` holds the first URL and every one redirected to.
        let count = attempt.previous().len();
        if count > max {
            return attempt.error(format!("Maximum ({max}) redirects followed"));
        }
        if verbose {
            eprintln!("* Issue another request to this URL: '{}'", attempt.url());
        }
        record.record(count, attempt.url());
        attempt.follow()
    })
}

/// -k and --cacert, with the TLS this build has. With rustls (and
/// OpenSSL at hand, as for curl), `--cacert` is judged as curl does: see
/// `trust`.
#[cfg(any(feature = "default-tls", feature = "native-tls"))]
fn tls(
    builder: reqwest::ClientBuilder,
    insecure: bool,
    cacert: Option<&Path>,
) -> Result<reqwest::ClientBuilder, String> {
    let builder = builder.tls_danger_accept_invalid_certs(insecure);
    let Some(path) = cacert else {
        return Ok(builder);
    };
    let pem = std::fs::read(path).map_err(|e| format!("--cacert {}: {e}", path.display()))?;
    // -k trusts any certificate, the file's too (as curl's -k does).
    #[cfg(all(target_os = "linux", feature = "default-tls"))]
    if !insecure {
        let config =
            super::trust::config(&pem).map_err(|e| format!("--cacert {}: {e}", path.display()))?;
        return Ok(builder.tls_backend_preconfigured(config));
    }
    let certs = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| format!("--cacert {}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("--cacert {}: no certificate in it", path.display()));
    }
    Ok(builder.tls_certs_only(certs))
}

/// Without TLS there is no certificate to check: -k changes nothing, and
/// --cacert is refused rather than ignored.
#[cfg(not(any(feature = "default-tls", feature = "native-tls")))]
fn tls(
    builder: reqwest::ClientBuilder,
    _insecure: bool,
    cacert: Option<&Path>,
) -> Result<reqwest::ClientBuilder, String> {
    match cacert {
        Some(_) => Err("--cacert: this build has no TLS (features default-tls, native-tls)".into()),
        None => Ok(builder),
    }
}
