//! The proxy signs in to Postgres for its client, with a password the client never sees.
//!
//! A fault proxy can only hold what passes through it. A client that knew its login's
//! password could open a second session straight to the server, around the proxy, and
//! write there where no fault reaches (a helper's table that its late write checks, say).
//! (A cancel request needs no sign-in, only the session's secret key, and is passed on as it
//! came: the error it causes still crosses the proxy.) So the
//! client is handed a password of the proxy's own: the proxy checks it, then signs in to
//! the server as the same login with the real one, which only lockslab knows. Postgres
//! itself then refuses a session the client opens around the proxy.
//!
//! ```text
//!  client                      proxy                               Postgres
//!  SSLRequest          ─▶      N  (no TLS on loopback)
//!  startup user=L      ─▶      AuthenticationCleartextPassword
//!  password (given)    ─▶      checked; startup user=L       ─▶
//!                              SCRAM-SHA-256 with the real password ◀─▶
//!  AuthenticationOk ◀─────────────────────────────────────────────  AuthenticationOk
//!  … from here on the proxy relays (and watches) as before
//! ```
//!
//! The client's password crosses loopback in the clear, as a URL handed on stdin does.

use std::time::Duration;

use bytes::BytesMut;
use postgres_protocol::authentication::sasl::{ChannelBinding, SCRAM_SHA_256, ScramSha256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::pg::{CANCEL_REQUEST, GSSENC_REQUEST, SSL_REQUEST, be32};

/// Who the proxy signs in as, what its client must say, and what the server wants.
#[derive(Clone)]
pub struct SignIn {
    pub login: String,
    /// The password the client was given.
    pub given: String,
    /// The login's password on the server, kept from the client.
    pub real: String,
}

/// How long a client and the server have, together, to get through the sign-in.
const PATIENCE: Duration = Duration::from_secs(5);

/// A startup packet's most bytes (as the proxy's reader allows), and a password's.
const LONGEST_STARTUP: usize = 10_000;
const LONGEST_PASSWORD: usize = 1_024;

/// Signs `client` in on `server`. Returns the startup packet the client sent (the reader
/// of the client's messages starts after it), or None when the connection is to close: a
/// wrong login or password (said to the client as Postgres says it), a cancel request
/// (passed on to the server as it came), a server that refused, or no Postgres at all.
pub async fn sign_in(
    how: &SignIn,
    client: &mut TcpStream,
    server: &mut TcpStream,
) -> Option<Vec<u8>> {
    tokio::time::timeout(PATIENCE, sign_in_now(how, client, server))
        .await
        .ok()
        .flatten()
}

async fn sign_in_now(
    how: &SignIn,
    client: &mut TcpStream,
    server: &mut TcpStream,
) -> Option<Vec<u8>> {
    let startup = loop {
        let packet = read_startup(client).await?;
        match be32(&packet[4..8]) {
            SSL_REQUEST | GSSENC_REQUEST => client.write_all(b"N").await.ok()?,
            CANCEL_REQUEST => {
                // A cancel names a session by its secret key: it needs no sign-in.
                let _ = server.write_all(&packet).await;
                return None;
            }
            version if version >> 16 == 3 => break packet,
            _ => return None,
        }
    };
    if user_of(&startup[8..]).as_deref() != Some(how.login.as_str()) {
        let said = format!("this connection signs in as \"{}\" only", how.login);
        refuse(client, "28000", &said).await;
        return None;
    }
    // AuthenticationCleartextPassword, then the client's PasswordMessage.
    client
        .write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 3])
        .await
        .ok()?;
    let (kind, body) = read_message(client, LONGEST_PASSWORD).await?;
    let given = body.split(|b| *b == 0).next().unwrap_or_default();
    if kind != b'p' || !same(given, how.given.as_bytes()) {
        let said = format!("password authentication failed for user \"{}\"", how.login);
        refuse(client, "28P01", &said).await;
        return None;
    }
    server.write_all(&startup).await.ok()?;
    let mut scram = None;
    loop {
        let (kind, body) = read_message(server, LONGEST_STARTUP).await?;
        if kind != b'R' {
            // An ErrorResponse (the server refused), or no Postgres: the client hears it.
            let _ = client.write_all(&message(kind, &body)).await;
            return None;
        }
        let mut reply = BytesMut::new();
        match be32(body.get(..4)?) {
            0 => {
                client.write_all(&message(kind, &body)).await.ok()?;
                return Some(startup);
            }
            3 => frontend::password_message(how.real.as_bytes(), &mut reply).ok()?,
            5 => {
                let salt: [u8; 4] = body.get(4..8)?.try_into().ok()?;
                let hashed = postgres_protocol::authentication::md5_hash(
                    how.login.as_bytes(),
                    how.real.as_bytes(),
                    salt,
                );
                frontend::password_message(hashed.as_bytes(), &mut reply).ok()?;
            }
            10 => {
                let offered = body[4..]
                    .split(|b| *b == 0)
                    .any(|m| m == SCRAM_SHA_256.as_bytes());
                if !offered {
                    return None;
                }
                let started = ScramSha256::new(how.real.as_bytes(), ChannelBinding::unsupported());
                frontend::sasl_initial_response(SCRAM_SHA_256, started.message(), &mut reply)
                    .ok()?;
                scram = Some(started);
            }
            11 => {
                let scram = scram.as_mut()?;
                scram.update(&body[4..]).ok()?;
                frontend::sasl_response(scram.message(), &mut reply).ok()?;
            }
            12 => scram.as_mut()?.finish(&body[4..]).ok()?,
            _ => {
                let said = "the server asked for a way of signing in that lockslab's proxy \
                            does not speak (it speaks SCRAM-SHA-256, MD5 and a password)";
                refuse(client, "28000", said).await;
                return None;
            }
        }
        if !reply.is_empty() {
            server.write_all(&reply).await.ok()?;
        }
    }
}

/// An untyped packet: a startup, or a request that comes before one.
async fn read_startup(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut head = [0u8; 4];
    stream.read_exact(&mut head).await.ok()?;
    let length = be32(&head) as usize;
    if !(8..=LONGEST_STARTUP).contains(&length) {
        return None;
    }
    let mut packet = head.to_vec();
    packet.resize(length, 0);
    stream.read_exact(&mut packet[4..]).await.ok()?;
    Some(packet)
}

/// A typed message: its type and its body.
async fn read_message(stream: &mut TcpStream, longest: usize) -> Option<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).await.ok()?;
    let length = be32(&head[1..]) as usize;
    if !(4..=longest + 4).contains(&length) {
        return None;
    }
    let mut body = vec![0u8; length - 4];
    stream.read_exact(&mut body).await.ok()?;
    Some((head[0], body))
}

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = vec![kind];
    bytes.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// Says `said` to the client as Postgres would (a FATAL ErrorResponse with `code`).
async fn refuse(client: &mut TcpStream, code: &str, said: &str) {
    let mut body = Vec::new();
    for (field, value) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', code), (b'M', said)] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    let _ = client.write_all(&message(b'E', &body)).await;
}

/// The `user` among a startup packet's parameters (`name\0value\0…\0`); None if there is
/// none, or more than one (Postgres would take the last, the check here the first).
fn user_of(parameters: &[u8]) -> Option<String> {
    let mut fields = parameters.split(|b| *b == 0);
    let mut users = Vec::new();
    while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
        if name == b"user" {
            users.push(value);
        }
    }
    match users[..] {
        [user] => String::from_utf8(user.to_vec()).ok(),
        _ => None,
    }
}

/// Equal, compared in a time that does not depend on where they first differ.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_is_read_from_the_startup_parameters() {
        assert_eq!(
            user_of(b"database\0d\0user\0c1_login\0\0").as_deref(),
            Some("c1_login")
        );
        assert_eq!(user_of(b"database\0user\0\0"), None);
        assert_eq!(user_of(b"user\0c1_login\0user\0admin\0\0"), None);
        assert_eq!(user_of(b"\0"), None);
    }

    #[test]
    fn passwords_are_the_same_only_when_every_byte_is() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"abcd"));
    }
}
