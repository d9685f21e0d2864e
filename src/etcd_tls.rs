//! Client certificates for a room seat's etcd.
//!
//! etcd 3.4 asks no password for a compaction, for lease calls, nor for `auth disable` once
//! its `NOSPACE` alarm is up. A password therefore cannot keep a stranger away from a seat's
//! etcd; a TLS handshake that demands a certificate can: etcd then refuses every connection
//! whose certificate its seat's authority did not sign, before it reads a single request.
//!
//! Each seat gets an authority of its own, used once at `lockslab up --room` to sign three
//! certificates and then forgotten (its key is never written anywhere, so nothing more can
//! be signed): the seat's etcd's, the attendee's, and the instructor's. Seat 1's certificate
//! means nothing to seat 2's etcd.
//!
//! A client's certificate and key, with the authority's certificate, travel as one line
//! (`LOCKSLAB_ETCD_TLS`, see [`Bundle::encode`]) so that a seat's lines stay pasteable.

use anyhow::{Context, Result, bail};
use base64::Engine;
use std::sync::Mutex;

/// The environment variable holding the [`Bundle`] lockslab uses for an `https://` etcd.
pub const ENV: &str = "LOCKSLAB_ETCD_TLS";

/// The name every seat's etcd certificate carries besides the room's address, and the one
/// lockslab checks: the same certificate then passes through a lab's proxy, which the
/// client reaches at another address. A seat's authority signs one server's certificate
/// only, so the name needs to tell no servers apart.
pub const SERVER_NAME: &str = "lockslab-etcd";

/// The common name of the instructor's certificate: no etcd user has it. etcd 3.4 takes a
/// certificate's common name for the user when a request carries no password token, so the
/// instructor's certificate alone logs in as nobody; `root` still needs its password.
pub const INSTRUCTOR: &str = "lockslab-instructor";

/// A client's trust in one etcd: the authority that signed the server (and the client), the
/// client's certificate and its private key, each in PEM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

impl Bundle {
    /// One line: the three PEM blocks (authority, certificate, key), in that order, in
    /// base64. `base64 -d` gives them back, and `csplit` splits them into the three files
    /// `etcdctl` wants (see the README's room section).
    pub fn encode(&self) -> String {
        let pem = format!("{}{}{}", self.ca, self.cert, self.key);
        base64::engine::general_purpose::STANDARD.encode(pem)
    }

    pub fn decode(line: &str) -> Result<Bundle> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(line.trim())
            .context("not base64")?;
        let text = String::from_utf8(bytes).context("not PEM text")?;
        let blocks: Vec<String> = text
            .split("-----BEGIN ")
            .filter(|block| !block.trim().is_empty())
            .map(|block| format!("-----BEGIN {block}"))
            .collect();
        match blocks.as_slice() {
            [ca, cert, key]
                if ca.starts_with("-----BEGIN CERTIFICATE-----")
                    && cert.starts_with("-----BEGIN CERTIFICATE-----")
                    && key.contains("PRIVATE KEY-----") =>
            {
                Ok(Bundle {
                    ca: ca.clone(),
                    cert: cert.clone(),
                    key: key.clone(),
                })
            }
            _ => bail!("expected three PEM blocks: a CA certificate, a certificate, a private key"),
        }
    }

    /// The client side of a handshake with an etcd this bundle's authority signed.
    pub fn client_options(&self) -> etcd_client::TlsOptions {
        etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&self.ca))
            .identity(etcd_client::Identity::from_pem(&self.cert, &self.key))
            .domain_name(SERVER_NAME)
    }
}

/// What one seat's authority signed (see the module's comment).
pub struct SeatCertificates {
    /// The seat's etcd's: the authority's certificate (`--trusted-ca-file`), and its own
    /// certificate and key, valid for [`SERVER_NAME`] and the room's address.
    pub server: Bundle,
    /// The attendee's: common name the seat's, the etcd user it logs in as without a token.
    pub seat: Bundle,
    /// The instructor's: common name [`INSTRUCTOR`].
    pub instructor: Bundle,
}

impl SeatCertificates {
    pub fn generate(seat: &str, room: std::net::IpAddr) -> Result<SeatCertificates> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
            KeyPair, KeyUsagePurpose,
        };
        let mut authority = CertificateParams::default();
        authority.distinguished_name.push(
            DnType::CommonName,
            format!("lockslab {seat} etcd authority"),
        );
        authority.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        authority.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let authority_key = KeyPair::generate()?;
        let ca = authority.self_signed(&authority_key)?.pem();
        let issuer = Issuer::new(authority, authority_key);
        let sign = |names: Vec<String>, common_name: &str, usage| -> Result<Bundle> {
            let mut params = CertificateParams::new(names)?;
            params
                .distinguished_name
                .push(DnType::CommonName, common_name);
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate()?;
            Ok(Bundle {
                ca: ca.clone(),
                cert: params.signed_by(&key, &issuer)?.pem(),
                key: key.serialize_pem(),
            })
        };
        Ok(SeatCertificates {
            server: sign(
                vec![SERVER_NAME.to_string(), room.to_string()],
                SERVER_NAME,
                ExtendedKeyUsagePurpose::ServerAuth,
            )?,
            seat: sign(Vec::new(), seat, ExtendedKeyUsagePurpose::ClientAuth)?,
            instructor: sign(Vec::new(), INSTRUCTOR, ExtendedKeyUsagePurpose::ClientAuth)?,
        })
    }
}

/// Bundles this process holds for given endpoints (`host:port`), ahead of [`ENV`]: the
/// instructor's lockslab reaches every seat's etcd, each with its own authority.
static KNOWN: Mutex<Vec<(String, String)>> = Mutex::new(Vec::new());

/// From now on, this process reaches the etcd at `host_port` with `bundle` (encoded).
pub fn trust(host_port: &str, bundle: &str) {
    let mut known = KNOWN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    known.retain(|(at, _)| at != host_port);
    known.push((host_port.to_string(), bundle.to_string()));
}

/// The bundle for the etcd at `host_port`: one given to [`trust`], else [`ENV`]'s.
pub fn for_endpoint(host_port: &str) -> Result<Bundle> {
    let known = KNOWN
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .iter()
        .find(|(at, _)| at == host_port)
        .map(|(_, bundle)| bundle.clone());
    let line = match known {
        Some(line) => line,
        None => match std::env::var(ENV) {
            Ok(line) if !line.trim().is_empty() => line,
            _ => bail!(
                "an https:// etcd wants a client certificate: set {ENV} (a room seat's lines, \
                 `lockslab seat N`, hold it)"
            ),
        },
    };
    Bundle::decode(&line).with_context(|| format!("reading {ENV}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_survives_its_one_line() {
        let made = SeatCertificates::generate("seat01", [10, 0, 0, 5].into()).unwrap();
        let line = made.seat.encode();
        assert!(!line.contains('\n'));
        assert_eq!(Bundle::decode(&line).unwrap(), made.seat);
        assert!(Bundle::decode("bm90IHBlbQ==").is_err());
    }
}
