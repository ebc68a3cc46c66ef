//! The request the command line describes, checked before anything is
//! sent: its method, URL, headers, key and body, and the policy.

use std::io::Read;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest_safe_retry::{IdempotencyKey, RequestOptions, RetryPolicy};

use super::args::Args;
use super::{client, output};

fn seconds(name: &str, value: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| format!("--{name} must be a positive number of seconds, got {value}"))
}

fn policy(args: &Args) -> Result<RetryPolicy, String> {
    let mut builder = RetryPolicy::builder()
        .max_attempts(args.max_attempts)
        .backoff(
            Duration::from_millis(args.base_ms),
            Duration::from_millis(args.cap_ms),
        )
        .jitter(args.jitter.into());
    builder = if args.deadline == f64::INFINITY {
        builder.no_deadline()
    } else {
        builder.deadline(seconds("deadline", args.deadline)?)
    };
    if let Some(t) = args.attempt_timeout {
        builder = builder.attempt_timeout(seconds("attempt-timeout", t)?);
    }
    if let Some(seed) = args.seed {
        builder = builder.seed(seed);
    }
    builder.build().map_err(|e| e.to_string())
}

/// The text `-d` or `-w` names: the text itself, `@-` standard input,
/// `@FILE` a file.
fn read_at(data: &str) -> Result<Vec<u8>, String> {
    match data.strip_prefix('@') {
        Some("-") => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .map_err(|e| format!("reading standard input: {e}"))?;
            Ok(buf)
        }
        Some(path) => std::fs::read(path).map_err(|e| format!("reading {path}: {e}")),
        None => Ok(data.as_bytes().to_vec()),
    }
}

/// curl's rule: a URL without a scheme is http.
fn with_scheme(url: &str) -> String {
    if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    }
}

/// The request's headers: `-H`'s, then the ones the other options imply
/// where `-H` gave none (curl's rule: a header given with -H wins).
fn headers(args: &Args) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    for header in &args.headers {
        let Some((name, value)) = header.split_once(':') else {
            return Err(format!("a header is 'Name: value', got {header:?}"));
        };
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.trim().as_bytes()),
            HeaderValue::from_str(value.trim()),
        ) else {
            return Err(format!("not a valid header: {header:?}"));
        };
        headers.append(name, value);
    }
    let mut implied: Vec<(&str, &str)> = if args.json.is_some() {
        vec![
            ("content-type", "application/json"),
            ("accept", "application/json"),
        ]
    } else if args.data.is_some() || args.data_raw.is_some() {
        vec![("content-type", "application/x-www-form-urlencoded")]
    } else {
        Vec::new()
    };
    // curl sends `curl/VERSION` unless told otherwise; so does `call`.
    let default_agent = concat!("call/", env!("CARGO_PKG_VERSION"));
    implied.push((
        "user-agent",
        args.user_agent.as_deref().unwrap_or(default_agent),
    ));
    if args.compressed {
        implied.push(("accept-encoding", "identity"));
    }
    for (name, value) in implied {
        if !headers.contains_key(name) {
            let value = HeaderValue::from_str(value)
                .map_err(|_| format!("not a valid {name} header: {value:?}"))?;
            headers.insert(HeaderName::from_static(name), value);
        }
    }
    Ok(headers)
}

/// `--idempotency-key`, `--no-idempotency-key`, and a key given with -H.
fn key_options(args: &Args, headers: &HeaderMap) -> Result<RequestOptions, String> {
    let mut options = RequestOptions::new();
    let header_key = headers.contains_key("idempotency-key");
    if let Some(key) = &args.idempotency_key {
        if header_key {
            // Two keys on the wire would leave the server to guess.
            return Err("the key is given twice: use --idempotency-key or \
                        -H 'Idempotency-Key: …', not both"
                .into());
        }
        let key =
            IdempotencyKey::new(key.as_str()).map_err(|e| format!("--idempotency-key: {e}"))?;
        options = options.idempotency_key(key);
    }
    if args.no_idempotency_key {
        if header_key {
            return Err(
                "--no-idempotency-key contradicts -H 'Idempotency-Key: …': give one".into(),
            );
        }
        options = options.no_idempotency_key();
    }
    Ok(options)
}

/// Everything the command line says, checked before anything is sent.
pub(super) fn prepare(args: &Args) -> Result<(client::Call, Option<output::WriteOut>), String> {
    let policy = policy(args)?;
    // curl: -X wins; else -I means HEAD, a body POST.
    let method = match (&args.method, args.head) {
        (Some(m), _) => m.as_str(),
        (None, true) => "HEAD",
        (None, false) if args.data.is_some() || args.data_raw.is_some() => "POST",
        (None, false) if args.json.is_some() => "POST",
        (None, false) => "GET",
    };
    let method = reqwest::Method::from_bytes(method.as_bytes())
        .map_err(|_| format!("not a valid method: {method}"))?;
    let url = with_scheme(&args.url);
    if reqwest::Url::parse(&url).is_err() {
        return Err(format!("not a valid URL: {}", args.url));
    }
    let headers = headers(args)?;
    let options = key_options(args, &headers)?;
    let body = match (&args.data, &args.data_raw, &args.json) {
        (Some(data), _, _) | (_, _, Some(data)) => Some(read_at(data)?),
        (None, Some(raw), None) => Some(raw.as_bytes().to_vec()),
        (None, None, None) => None,
    };
    let write_out = match &args.write_out {
        Some(format) => {
            let text = String::from_utf8(read_at(format)?)
                .map_err(|_| "--write-out: the format is not UTF-8".to_owned())?;
            Some(output::WriteOut::parse(&text)?)
        }
        None => None,
    };
    let call = client::Call::new(args, policy, method, url, headers, options, body)?;
    Ok((call, write_out))
}
