//! The web console: a page served at `/` of the admin listener
//! (`console.enable`, default true), every asset inside the binary, and
//! the JSON API its pages read (`/api/v1/...`, in `api.rs`). Callers
//! authenticate as on the rest of the admin port (`admin_auth.rs`: HTTP
//! Basic with the brokers' PLAIN or SCRAM users; the browser asks for
//! them), then see only what the ACLs let their principal describe or
//! read. `console.messages.enable=false` hides message contents;
//! `console.read.only=true` is reported to the page (this first version
//! has no writes).

pub mod api;
pub mod groups;
pub mod views;

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
}

/// Answers a console request of `principal` (authenticated already).
pub async fn handle(
    broker: &Arc<Broker>,
    principal: &str,
    host: String,
    method: &str,
    path: &str,
    query: &str,
) -> Reply {
    let config = broker.config();
    if !config.console_enable {
        return Reply::error("404 Not Found", "the console is off (console.enable=false)");
    }
    if method != "GET" {
        return Reply::error("405 Method Not Allowed", "the console API is read-only");
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
        }),
        _ if path.starts_with("/api/v1/") => {
            let authz = Authz::for_principal(broker, Arc::from(principal), host);
            api::handle(broker, &authz, path, &api::Query::parse(query)).await
        }
        _ => Reply::error("404 Not Found", "not found"),
    }
}
