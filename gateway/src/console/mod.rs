//! The web console: a page served at `/` of the admin listener
//! (`console.enable`, default true), every asset inside the binary, and
//! the JSON API its pages read (`/api/v1/...`, in `api.rs`). Callers
//! authenticate as on the rest of the admin port (`admin_auth.rs`: HTTP
//! Basic with the brokers' PLAIN or SCRAM users; the browser asks for
//! them), then see only what the ACLs let their principal describe or
//! read. `console.messages.enable=false` hides message contents;
//! `console.read.only=true` refuses every write (and the page hides them).
//! Writes are POSTs carrying the session's CSRF token in
//! `X-Tessera-CSRF`: a header another site's form cannot send, and a value
//! it cannot know (an HMAC of the principal under a secret of this
//! process), so a browser holding the operator's Basic credentials cannot
//! be made to write by a page of another origin.

pub mod api;
pub mod groups;
pub mod security;
pub mod views;
pub mod writes;

use std::sync::Arc;

use serde::Serialize;

use crate::authz::Authz;
use crate::broker::Broker;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");
const FAVICON: &str = include_str!("assets/favicon.svg");

/// One HTTP answer of the console.
#[derive(Debug)]
pub struct Reply {
    pub status: &'static str,
    pub content_type: &'static str,
    pub body: String,
}

impl Reply {
    pub fn json<T: Serialize>(value: &T) -> Reply {
        Reply {
            status: "200 OK",
            content_type: "application/json",
            body: serde_json::to_string(value).unwrap_or_default(),
        }
    }

    pub fn error(status: &'static str, message: &str) -> Reply {
        Reply {
            status,
            content_type: "application/json",
            body: serde_json::json!({ "error": message }).to_string(),
        }
    }

    /// A Kafka error as the console answers it: the message Kafka clients
    /// get, and its error code.
    pub fn kafka(message: &str, code: i16) -> Reply {
        Reply {
            status: "400 Bad Request",
            content_type: "application/json",
            body: serde_json::json!({ "error": message, "code": code }).to_string(),
        }
    }

    fn asset(content_type: &'static str, body: &str) -> Reply {
        Reply {
            status: "200 OK",
            content_type,
            body: body.to_string(),
        }
    }
}

/// Whether `path` is the console's (its page, assets or API).
pub fn owns(path: &str) -> bool {
    path == "/"
        || path == "/favicon.ico"
        || path.starts_with("/console/")
        || path.starts_with("/api/v1/")
}

/// Who the page is talking to and what it may show.
#[derive(Serialize)]
struct Session<'a> {
    principal: &'a str,
    node_id: i32,
    read_only: bool,
    messages_enabled: bool,
    /// Sent back in `X-Tessera-CSRF` with every write.
    csrf_token: String,
}

/// The header a write carries its CSRF token in.
pub const CSRF_HEADER: &str = "x-tessera-csrf";

/// The CSRF token of `principal`'s sessions on this process.
pub fn csrf_token(principal: &str) -> String {
    use hmac::{Hmac, Mac};
    static SECRET: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    let secret = SECRET.get_or_init(rand::random);
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(principal.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One request to the console, its head and body read.
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub query: &'a str,
    pub head: &'a str,
    pub body: &'a [u8],
}

/// Answers a console request of `principal` (authenticated already).
pub async fn handle(
    broker: &Arc<Broker>,
    principal: &str,
    host: String,
    request: Request<'_>,
) -> Reply {
    let config = broker.config();
    if !config.console_enable {
        return Reply::error("404 Not Found", "the console is off (console.enable=false)");
    }
    let path = request.path;
    if request.method == "POST" && path.starts_with("/api/v1/") {
        return write(broker, principal, host, &request).await;
    }
    if request.method != "GET" {
        return Reply::error("405 Method Not Allowed", "GET, or POST for a write");
    }
    match path {
        "/" | "/console/" | "/console/index.html" => {
            Reply::asset("text/html; charset=utf-8", INDEX_HTML)
        }
        "/console/app.js" => Reply::asset("text/javascript; charset=utf-8", APP_JS),
        "/console/app.css" => Reply::asset("text/css; charset=utf-8", APP_CSS),
        "/favicon.ico" | "/console/favicon.svg" => Reply::asset("image/svg+xml", FAVICON),
        "/api/v1/session" => Reply::json(&Session {
            principal,
            node_id: config.node_id,
            read_only: config.console_read_only,
            messages_enabled: config.console_messages_enable,
            csrf_token: csrf_token(principal),
        }),
        _ if path.starts_with("/api/v1/") => {
            let authz = Authz::for_principal(broker, Arc::from(principal), host);
            api::handle(broker, &authz, path, &api::Query::parse(request.query)).await
        }
        _ => Reply::error("404 Not Found", "not found"),
    }
}

async fn write(
    broker: &Arc<Broker>,
    principal: &str,
    host: String,
    request: &Request<'_>,
) -> Reply {
    if broker.config().console_read_only {
        return Reply::error(
            "403 Forbidden",
            "the console is read-only (console.read.only=true)",
        );
    }
    let expected = csrf_token(principal);
    let sent = crate::admin_auth::header(request.head, CSRF_HEADER).unwrap_or("");
    if !crate::sasl::constant_time_eq(sent.as_bytes(), expected.as_bytes()) {
        return Reply::error(
            "403 Forbidden",
            "missing or wrong CSRF token (X-Tessera-CSRF: the session's csrf_token)",
        );
    }
    let segments: Vec<String> = request
        .path
        .trim_start_matches("/api/v1/")
        .split('/')
        .map(api::percent_decode)
        .collect();
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    let authz = Authz::for_principal(broker, Arc::from(principal), host);
    writes::handle(broker, &authz, &segments, request.body)
        .await
        .unwrap_or_else(|reply| reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csrf_tokens_differ_by_principal_and_stay_the_same_for_one() {
        assert_eq!(csrf_token("User:alice"), csrf_token("User:alice"));
        assert_ne!(csrf_token("User:alice"), csrf_token("User:bob"));
        assert_eq!(csrf_token("User:alice").len(), 64);
    }

    #[test]
    fn headers_are_found_whatever_their_case() {
        let head = "POST /api/v1/topics HTTP/1.1\r\nHost: x\r\nX-Tessera-CSRF: abc \r\n\r\n";
        assert_eq!(crate::admin_auth::header(head, CSRF_HEADER), Some("abc"));
        assert_eq!(crate::admin_auth::header(head, "authorization"), None);
    }
}
