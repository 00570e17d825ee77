//! One admin API request per CLI call, on a throwaway current-thread runtime.

use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{render, CliError, ClientArgs};

/// How long one CLI request may take end to end.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) struct Reply {
    pub(super) status: StatusCode,
    pub(super) etag: Option<String>,
    pub(super) body: String,
}

/// One request on a throwaway current-thread runtime.
pub(super) fn send(
    args: &ClientArgs,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<String>,
) -> Result<Reply, CliError> {
    let base = args.admin.trim_end_matches('/');
    let url =
        if base.contains("://") { format!("{base}{path}") } else { format!("http://{base}{path}") };
    let mut request = Request::builder().method(method).uri(&url);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|e| {
        CliError { message: format!("bad --admin `{}`: {e}", args.admin), code: 64 }
    })?;
    let unreachable = |e: &dyn std::fmt::Display| CliError {
        message: format!("cannot reach the admin API at {}: {e}", args.admin),
        code: 69,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError { message: format!("cannot start a runtime: {e}"), code: 1 })?;
    runtime.block_on(async {
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let exchange = async {
            let response = client.request(request).await.map_err(|e| unreachable(&e))?;
            let (parts, body) = response.into_parts();
            let bytes = body.collect().await.map_err(|e| unreachable(&e))?.to_bytes();
            Ok(Reply {
                status: parts.status,
                etag: parts
                    .headers
                    .get(header::ETAG)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
                body: String::from_utf8_lossy(&bytes).into_owned(),
            })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .unwrap_or_else(|_| Err(unreachable(&"timed out")))
    })
}

/// Turns a non-2xx reply into the API's error message with a fitting exit code.
pub(super) fn expect_ok(reply: Reply) -> Result<Reply, CliError> {
    if reply.status.is_success() {
        return Ok(reply);
    }
    let code = match reply.status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => 77,
        StatusCode::PRECONDITION_FAILED => 75,
        s if s.is_client_error() => 65,
        _ => 1,
    };
    let mut message = render::api_error(reply.status, &reply.body);
    match reply.status {
        StatusCode::UNAUTHORIZED => message.push_str("\n(pass --token-file with the admin token)"),
        StatusCode::PRECONDITION_FAILED => message.push_str(&format!(
            "\n(someone changed the table first; the current version is {}: `weir table get`, redo your edit, put again)",
            reply.etag.as_deref().unwrap_or("?").trim_matches('"')
        )),
        _ => {}
    }
    Err(CliError { message, code })
}

pub(super) fn json<T: serde::de::DeserializeOwned>(body: &str) -> Result<T, CliError> {
    serde_json::from_str(body).map_err(|e| CliError {
        message: format!("unexpected answer from the admin API: {e}"),
        code: 1,
    })
}
