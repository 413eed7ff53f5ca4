//! Listeners and SASL against an in-process broker over raw sockets: a
//! PLAINTEXT and a SASL_PLAINTEXT listener side by side, PLAIN users from
//! the JAAS key, SCRAM users from the metadata log (seeded with
//! `users::add` before start, added with AlterUserScramCredentials), and
//! Kafka's answers to bad input, after which the broker still serves.

use crate::common;

use bytes::Bytes;
use common::{listener_addr as addr, test_config, WireClient};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_user_scram_credentials_request::ScramCredentialUpsertion;
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, ApiVersionsRequest, DescribeUserScramCredentialsRequest,
    MetadataRequest, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::StrBytes;
use tessera_gateway::sasl::scram::{client_final_message, ScramMechanism};
use tessera_gateway::{BrokerConfig, Running};

const JAAS: &str =
    "org.apache.kafka.common.security.plain.PlainLoginModule required user_alice=\"alice-pw\";";

fn config(dir: &std::path::Path) -> BrokerConfig {
    test_config(
        dir,
        &[
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            ),
            (
                "sasl.enabled.mechanisms",
                "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            ),
            ("listener.name.sasl_plaintext.plain.sasl.jaas.config", JAAS),
        ],
    )
}

async fn handshake(client: &mut WireClient, mechanism: &str, version: i16) -> (i16, Vec<String>) {
    let r = client
        .call(
            version,
            &SaslHandshakeRequest::default()
                .with_mechanism(StrBytes::from_string(mechanism.into())),
        )
        .await;
    (
        r.error_code,
        r.mechanisms.iter().map(|m| m.to_string()).collect(),
    )
}

async fn authenticate(client: &mut WireClient, token: &[u8]) -> (i16, Option<String>, Vec<u8>) {
    let r = client
        .call(
            2,
            &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::copy_from_slice(token)),
        )
        .await;
    (
        r.error_code,
        r.error_message.map(|m| m.to_string()),
        r.auth_bytes.to_vec(),
    )
}

/// A whole SCRAM exchange over SaslHandshake v1 + SaslAuthenticate;
/// Ok(()) when authenticated (the server signature checked), else the
/// error code and message.
async fn scram_login(
    client: &mut WireClient,
    mechanism: ScramMechanism,
    user: &str,
    password: &str,
) -> Result<(), (i16, Option<String>)> {
    let (code, _) = handshake(client, mechanism.name(), 1).await;
    if code != 0 {
        return Err((code, None));
    }
    let bare = format!("n={user},r=clientnonce");
    let (code, message, first) = authenticate(client, format!("n,,{bare}").as_bytes()).await;
    if code != 0 {
        return Err((code, message));
    }
    let first = String::from_utf8(first).unwrap();
    let (last, expected) = client_final_message(mechanism, password, &bare, &first).unwrap();
    let (code, message, fin) = authenticate(client, last.as_bytes()).await;
    if code != 0 {
        return Err((code, message));
    }
    assert_eq!(fin, expected, "server signature");
    Ok(())
}

async fn metadata_port(client: &mut WireClient) -> i32 {
    let r = client.call(9, &MetadataRequest::default()).await;
    r.brokers[0].port
}

async fn metric(running: &Running, name: &str) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(running.admin_addr)
        .await
        .unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_plain_scram_and_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    // The first user is seeded before start, as `tessera users add` does.
    tessera_gateway::users::add(&config, "seed", "seed-pw", &[ScramMechanism::Sha512], 4096)
        .await
        .unwrap();
    let running = tessera_gateway::start(config).await.unwrap();
    let plain = addr(&running, "PLAINTEXT");
    let sasl = addr(&running, "SASL_PLAINTEXT");
    assert_eq!(running.kafka_addr, plain, "the inter-broker listener");

    // The PLAINTEXT listener serves at once and advertises itself.
    let mut open = WireClient::connect(plain).await;
    assert_eq!(metadata_port(&mut open).await, i32::from(plain.port()));
    // A SASL request there is in the wrong state, as in Kafka.
    let (code, _) = handshake(&mut open, "PLAIN", 1).await;
    assert_eq!(code, ResponseError::IllegalSaslState.code());

    // PLAIN (v1 handshake): ApiVersions first is allowed.
    let mut c = WireClient::connect(sasl).await;
    let versions = c.call(3, &ApiVersionsRequest::default()).await;
    assert!(versions.api_keys.iter().any(|k| k.api_key == 17));
    let (code, mechanisms) = handshake(&mut c, "PLAIN", 1).await;
    assert_eq!(code, 0);
    assert_eq!(mechanisms, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]);
    let (code, _, _) = authenticate(&mut c, b"\0alice\0alice-pw").await;
    assert_eq!(code, 0);
    // Authenticated: served, and told the SASL listener's address.
    assert_eq!(metadata_port(&mut c).await, i32::from(sasl.port()));
    // A second handshake after authentication: ILLEGAL_SASL_STATE.
    let (code, _) = handshake(&mut c, "PLAIN", 1).await;
    assert_eq!(code, ResponseError::IllegalSaslState.code());

    // The seeded SCRAM user logs in.
    let mut c = WireClient::connect(sasl).await;
    scram_login(&mut c, ScramMechanism::Sha512, "seed", "seed-pw")
        .await
        .unwrap();
    assert_eq!(metadata_port(&mut c).await, i32::from(sasl.port()));

    // AlterUserScramCredentials adds bob; DescribeUserScramCredentials shows him.
    let salt = b"bob-salt".to_vec();
    let salted = ScramMechanism::Sha256.salted_password(b"bob-pw", &salt, 8192);
    let altered = open
        .call(
            0,
            &AlterUserScramCredentialsRequest::default().with_upsertions(vec![
                ScramCredentialUpsertion::default()
                    .with_name(StrBytes::from_static_str("bob"))
                    .with_mechanism(1)
                    .with_iterations(8192)
                    .with_salt(Bytes::from(salt))
                    .with_salted_password(Bytes::from(salted)),
                ScramCredentialUpsertion::default()
                    .with_name(StrBytes::from_static_str("weak"))
                    .with_mechanism(1)
                    .with_iterations(10)
                    .with_salt(Bytes::from_static(b"s"))
                    .with_salted_password(Bytes::from_static(b"p")),
            ]),
        )
        .await;
    let codes: Vec<(String, i16)> = altered
        .results
        .iter()
        .map(|r| (r.user.to_string(), r.error_code))
        .collect();
    assert_eq!(
        codes,
        [
            ("bob".to_string(), 0),
            (
                "weak".to_string(),
                ResponseError::UnacceptableCredential.code()
            )
        ]
    );
    let described = open
        .call(
            0,
            &DescribeUserScramCredentialsRequest::default().with_users(Some(vec![
                UserName::default().with_name(StrBytes::from_static_str("bob")),
                UserName::default().with_name(StrBytes::from_static_str("nobody")),
            ])),
        )
        .await;
    assert_eq!(described.results[0].error_code, 0);
    assert_eq!(described.results[0].credential_infos[0].mechanism, 1);
    assert_eq!(described.results[0].credential_infos[0].iterations, 8192);
    assert_eq!(
        described.results[1].error_code,
        ResponseError::ResourceNotFound.code()
    );
    let mut c = WireClient::connect(sasl).await;
    scram_login(&mut c, ScramMechanism::Sha256, "bob", "bob-pw")
        .await
        .unwrap();

    // SCRAM over a v0 handshake: raw tokens.
    let mut c = WireClient::connect(sasl).await;
    let (code, _) = handshake(&mut c, "SCRAM-SHA-256", 0).await;
    assert_eq!(code, 0);
    let bare = "n=bob,r=rawnonce";
    c.send_raw(format!("n,,{bare}").as_bytes()).await;
    let first = String::from_utf8(c.receive_raw().await).unwrap();
    let (last, expected) =
        client_final_message(ScramMechanism::Sha256, "bob-pw", bare, &first).unwrap();
    c.send_raw(last.as_bytes()).await;
    assert_eq!(c.receive_raw().await, expected);
    assert_eq!(metadata_port(&mut c).await, i32::from(sasl.port()));

    let failed_before = metric(&running, "tessera_failed_authentication_total").await;
    // Wrong password: SASL_AUTHENTICATION_FAILED, then closed.
    let mut c = WireClient::connect(sasl).await;
    let (code, _) = handshake(&mut c, "PLAIN", 1).await;
    assert_eq!(code, 0);
    let (code, message, _) = authenticate(&mut c, b"\0alice\0wrong").await;
    assert_eq!(code, ResponseError::SaslAuthenticationFailed.code());
    assert_eq!(
        message.as_deref(),
        Some("Authentication failed: Invalid username or password")
    );
    assert!(c.is_closed().await);
    let mut c = WireClient::connect(sasl).await;
    let err = scram_login(&mut c, ScramMechanism::Sha256, "bob", "nope")
        .await
        .unwrap_err();
    assert_eq!(err.0, ResponseError::SaslAuthenticationFailed.code());
    assert!(c.is_closed().await);
    // An unknown SCRAM user.
    let mut c = WireClient::connect(sasl).await;
    let err = scram_login(&mut c, ScramMechanism::Sha512, "ghost", "x")
        .await
        .unwrap_err();
    assert_eq!(err.0, ResponseError::SaslAuthenticationFailed.code());
    assert!(c.is_closed().await);
    // A mechanism not enabled: UNSUPPORTED_SASL_MECHANISM with the list, closed.
    let mut c = WireClient::connect(sasl).await;
    let (code, mechanisms) = handshake(&mut c, "GSSAPI", 1).await;
    assert_eq!(code, ResponseError::UnsupportedSaslMechanism.code());
    assert_eq!(mechanisms.len(), 3);
    assert!(c.is_closed().await);
    // A request before authentication: closed without an answer.
    let mut c = WireClient::connect(sasl).await;
    c.send(9, &MetadataRequest::default()).await;
    assert!(c.is_closed().await);
    // SaslAuthenticate without a handshake: closed.
    let mut c = WireClient::connect(sasl).await;
    c.send(2, &SaslAuthenticateRequest::default()).await;
    assert!(c.is_closed().await);
    assert_eq!(
        metric(&running, "tessera_failed_authentication_total").await,
        failed_before + 6
    );
    assert!(metric(&running, "tessera_successful_authentication_total").await >= 4);

    // Nobody else noticed: both listeners still serve.
    assert_eq!(metadata_port(&mut open).await, i32::from(plain.port()));
    let mut c = WireClient::connect(sasl).await;
    scram_login(&mut c, ScramMechanism::Sha256, "bob", "bob-pw")
        .await
        .unwrap();
    running.shutdown().await;

    // Credentials are in the metadata log: they survive a restart.
    let running = tessera_gateway::start(config_again(dir.path()))
        .await
        .unwrap();
    let mut c = WireClient::connect(addr(&running, "SASL_PLAINTEXT")).await;
    scram_login(&mut c, ScramMechanism::Sha256, "bob", "bob-pw")
        .await
        .unwrap();
    let mut c = WireClient::connect(addr(&running, "SASL_PLAINTEXT")).await;
    scram_login(&mut c, ScramMechanism::Sha512, "seed", "seed-pw")
        .await
        .unwrap();
    running.shutdown().await;
}

/// KIP-368 over the wire: a listener with `connections.max.reauth.ms`
/// tells a v2 client its session lifetime; the client re-authenticates on
/// its open connection and is served past the first lifetime; a client
/// that authenticated with SaslAuthenticate v0 (it cannot re-authenticate)
/// is closed at its first request after expiry, and counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_expire_unless_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path());
    for l in &mut config.listeners {
        l.reauth_ms.insert("PLAIN".into(), 800);
    }
    let running = tessera_gateway::start(config).await.unwrap();
    let sasl = addr(&running, "SASL_PLAINTEXT");

    let mut renewing = WireClient::connect(sasl).await;
    handshake(&mut renewing, "PLAIN", 1).await;
    let r = renewing
        .call(
            2,
            &SaslAuthenticateRequest::default()
                .with_auth_bytes(Bytes::from_static(b"\0alice\0alice-pw")),
        )
        .await;
    assert_eq!((r.error_code, r.session_lifetime_ms), (0, 800));

    let mut legacy = WireClient::connect(sasl).await;
    handshake(&mut legacy, "PLAIN", 1).await;
    let r = legacy
        .call(
            0,
            &SaslAuthenticateRequest::default()
                .with_auth_bytes(Bytes::from_static(b"\0alice\0alice-pw")),
        )
        .await;
    assert_eq!(r.error_code, 0);
    metadata_port(&mut legacy).await;

    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    handshake(&mut renewing, "PLAIN", 1).await;
    let (code, _, _) = authenticate(&mut renewing, b"\0alice\0alice-pw").await;
    assert_eq!(code, 0);
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    // 1 s after the first login: the renewed session serves, the other is over.
    metadata_port(&mut renewing).await;
    legacy.send(9, &MetadataRequest::default()).await;
    assert!(legacy.is_closed().await);
    assert_eq!(
        metric(&running, "tessera_successful_reauthentication_total").await,
        1
    );
    assert_eq!(
        metric(&running, "tessera_expired_connections_killed_total").await,
        1
    );
    running.shutdown().await;
}

fn config_again(dir: &std::path::Path) -> BrokerConfig {
    config(dir)
}

#[test]
fn bad_listener_configs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let try_config = |pairs: &[(&str, &str)]| {
        let mut map = std::collections::BTreeMap::new();
        map.insert("log.dirs".to_string(), dir.path().display().to_string());
        for (k, v) in pairs {
            map.insert(k.to_string(), v.to_string());
        }
        BrokerConfig::from_map(&map)
    };
    // Kafka's default mechanism, GSSAPI, is not served.
    assert!(try_config(&[("listeners", "SASL_PLAINTEXT://127.0.0.1:0")]).is_err());
    // PLAIN needs its users.
    assert!(try_config(&[
        ("listeners", "SASL_PLAINTEXT://127.0.0.1:0"),
        ("sasl.enabled.mechanisms", "PLAIN"),
    ])
    .is_err());
    // A listener name with no protocol.
    assert!(try_config(&[("listeners", "CLIENT://127.0.0.1:0")]).is_err());
    // An unknown per-listener key.
    assert!(try_config(&[("listener.name.x.nope", "1")]).is_err());
    // A named listener with a protocol, and the default stays as it was.
    let c = try_config(&[
        ("listeners", "CLIENT://127.0.0.1:0"),
        ("listener.security.protocol.map", "CLIENT:SASL_PLAINTEXT"),
        (
            "listener.name.client.sasl.enabled.mechanisms",
            "SCRAM-SHA-256",
        ),
    ])
    .unwrap();
    assert_eq!(c.listeners[0].mechanisms, ["SCRAM-SHA-256"]);
    let c = try_config(&[]).unwrap();
    assert_eq!(c.listeners.len(), 1);
    assert_eq!(c.listeners[0].port, 9092);
    assert!(!c.listeners[0].protocol.is_sasl());
}
