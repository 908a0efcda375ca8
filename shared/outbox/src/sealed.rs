//! Endpoint secrets sealed at rest.
//!
//! Why: a `whsec_…` secret lets anyone forge deliveries the receiver trusts, and a database is
//! copied far more often than a service's settings (backups, replicas, support dumps). So the
//! `secret` column holds `sealed1:<key id>:<base64 of nonce ‖ ciphertext ‖ tag>`: XChaCha20-Poly1305
//! under a key from the settings, with a random 24-byte nonce per value (long enough that random
//! nonces never repeat in practice) and the endpoint's id as associated data, so that a sealed
//! secret copied onto another endpoint's row does not open. The key id names the key that sealed
//! the value: keys rotate by putting a new one first, and the old ones still open what they sealed.

use std::fmt;

use base64::{Engine, engine::general_purpose::STANDARD};
use chacha20poly1305::{
    Key, KeyInit, XChaCha20Poly1305, XNonce,
    aead::{Aead, Payload},
};
use rand::RngCore;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use storage::Database;
use webhooks::signature::Secret;

use crate::OutboxError;

/// What every sealed value starts with: the scheme, version 1.
const SEALED_PREFIX: &str = "sealed1:";
const NONCE_BYTES: usize = 24;
const KEY_BYTES: usize = 32;

/// One key: its id and its 32 bytes.
#[derive(Clone, PartialEq, Eq)]
struct SealingKey {
    id: String,
    key: [u8; KEY_BYTES],
}

/// The keys that seal endpoint secrets at rest, written in settings as a list of
/// `"<key id>:<base64 of 32 random bytes>"` (`openssl rand -base64 32` makes one): the first seals
/// new secrets, every one opens what it sealed. Its `Debug` shows the ids only.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct SecretKeys {
    keys: Vec<SealingKey>,
}

impl SecretKeys {
    /// Why a service refuses to start without keys, and how to make one.
    pub const REQUIRED: &str = "at least one key is required to seal endpoint secrets at rest, \
        e.g. [\"k1:<base64 of 32 random bytes>\"] (openssl rand -base64 32); orders and the webhook sender need the same keys";

    /// Reads keys as settings write them.
    pub fn parse<S: AsRef<str>>(written: &[S]) -> Result<Self, String> {
        let mut keys: Vec<SealingKey> = Vec::with_capacity(written.len());
        for (index, text) in written.iter().enumerate() {
            let (id, encoded) = text
                .as_ref()
                .split_once(':')
                .ok_or_else(|| format!("key {index}: write it as \"<key id>:<base64 key>\""))?;
            if id.is_empty()
                || id.len() > 32
                || !id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(format!(
                    "key {index}: the id must be 1 to 32 letters, digits, '-' or '_'"
                ));
            }
            let bytes = STANDARD
                .decode(encoded.trim())
                .map_err(|error| format!("key {id:?}: not base64: {error}"))?;
            let key = <[u8; KEY_BYTES]>::try_from(bytes.as_slice()).map_err(|_| {
                format!(
                    "key {id:?}: must be {KEY_BYTES} bytes (base64 of 32 random bytes), not {}",
                    bytes.len()
                )
            })?;
            if keys.iter().any(|other| other.id == id) {
                return Err(format!("key {id:?}: named twice"));
            }
            keys.push(SealingKey {
                id: id.to_owned(),
                key,
            });
        }
        Ok(Self { keys })
    }

    /// One fresh random key named `id`: for development stacks and tests, which have no key of
    /// their own.
    pub fn generate(id: &str) -> Self {
        let mut key = [0; KEY_BYTES];
        rand::rng().fill_bytes(&mut key);
        Self {
            keys: vec![SealingKey {
                id: id.to_owned(),
                key,
            }],
        }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The keys as settings write them.
    pub fn to_written(&self) -> Vec<String> {
        self.keys
            .iter()
            .map(|key| format!("{}:{}", key.id, STANDARD.encode(key.key)))
            .collect()
    }

    /// `secret` sealed for `endpoint_id` under the first key.
    pub fn seal(&self, endpoint_id: &str, secret: &Secret) -> Result<String, OutboxError> {
        let key = self.keys.first().ok_or_else(|| {
            OutboxError::Sealing(
                "no key to seal endpoint secrets with (secret_keys is empty)".into(),
            )
        })?;
        let mut nonce = [0; NONCE_BYTES];
        rand::rng().fill_bytes(&mut nonce);
        let plain = secret.to_string();
        let sealed = XChaCha20Poly1305::new(&Key::from(key.key))
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: plain.as_bytes(),
                    aad: endpoint_id.as_bytes(),
                },
            )
            .map_err(|_| OutboxError::Sealing("the secret could not be sealed".into()))?;
        Ok(format!(
            "{SEALED_PREFIX}{}:{}",
            key.id,
            STANDARD.encode([nonce.as_slice(), &sealed].concat())
        ))
    }

    /// The secret that `stored` seals for `endpoint_id`.
    pub fn open(&self, endpoint_id: &str, stored: &str) -> Result<Secret, OutboxError> {
        let failed = |why: String| {
            OutboxError::Sealing(format!("the secret of endpoint {endpoint_id}: {why}"))
        };
        let (key_id, encoded) = stored
            .strip_prefix(SEALED_PREFIX)
            .and_then(|rest| rest.split_once(':'))
            .ok_or_else(|| failed("not sealed (stored before secrets were sealed; the service seals such rows at start)".into()))?;
        let key = self
            .keys
            .iter()
            .find(|key| key.id == key_id)
            .ok_or_else(|| {
                failed(format!(
                    "sealed with key {key_id:?}, which secret_keys lacks"
                ))
            })?;
        let bytes = STANDARD
            .decode(encoded)
            .map_err(|_| failed("not base64".into()))?;
        if bytes.len() < NONCE_BYTES {
            return Err(failed("too short".into()));
        }
        let (nonce, sealed) = bytes.split_at(NONCE_BYTES);
        let nonce = XNonce::try_from(nonce).map_err(|_| failed("bad nonce".into()))?;
        let plain = XChaCha20Poly1305::new(&Key::from(key.key))
            .decrypt(&nonce, Payload { msg: sealed, aad: endpoint_id.as_bytes() })
            .map_err(|_| failed(format!("does not open with key {key_id:?} (another key of that id, or not this endpoint's)")))?;
        String::from_utf8(plain)
            .ok()
            .and_then(|text| text.parse().ok())
            .ok_or_else(|| failed("opened to something that is not a secret".into()))
    }
}

impl fmt::Debug for SecretKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.keys.iter().map(|key| format!("{}:<redacted>", key.id)))
            .finish()
    }
}

impl Serialize for SecretKeys {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_written().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for SecretKeys {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Self::parse(&Vec::<String>::deserialize(deserializer)?).map_err(serde::de::Error::custom)
    }
}

/// Seals the secrets still stored in plain text (by a version from before secrets were sealed)
/// under the first of `keys`; returns how many. Orders and the sender run it at start, so a
/// database they share is sealed whichever starts first; it is cheap when nothing is left.
pub async fn seal_plaintext_secrets(
    database: &Database,
    keys: &SecretKeys,
) -> Result<u64, OutboxError> {
    let rows: Vec<(String, String, String)> =
        database.fetch_all("SELECT secret_id, endpoint_id, secret FROM webhook_secrets WHERE secret NOT LIKE 'sealed1:%'", &[]).await?;
    let mut sealed = 0;
    for (secret_id, endpoint_id, plain) in rows {
        let secret: Secret = plain.parse().map_err(|error| {
            storage::Error::Corrupt(format!(
                "the plain-text secret {secret_id:?} of endpoint {endpoint_id:?}: {error}"
            ))
        })?;
        let value = keys.seal(&endpoint_id, &secret)?;
        // Only while still the plain text read: a rotation meanwhile changes nothing here.
        sealed += database
            .write(async move |tx| {
                tx.execute(
                    "UPDATE webhook_secrets SET secret = $1 WHERE secret_id = $2 AND secret = $3",
                    &[&value, &secret_id, &plain],
                )
                .await
            })
            .await?;
    }
    Ok(sealed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_secret_opens_for_its_endpoint_only_and_under_its_own_key() {
        let keys = SecretKeys::generate("k1");
        let secret = Secret::generate();
        let sealed = keys.seal("ep_1", &secret).unwrap();
        assert!(sealed.starts_with("sealed1:k1:") && !sealed.contains(&secret.to_string()));
        assert_eq!(
            keys.open("ep_1", &sealed).unwrap().to_string(),
            secret.to_string()
        );
        assert_ne!(
            keys.seal("ep_1", &secret).unwrap(),
            sealed,
            "a fresh nonce each time"
        );
        assert!(
            keys.open("ep_2", &sealed).is_err(),
            "the endpoint id is associated data"
        );
        assert!(
            SecretKeys::generate("k1")
                .open("ep_1", &sealed)
                .unwrap_err()
                .to_string()
                .contains("does not open")
        );
        assert!(
            SecretKeys::generate("k2")
                .open("ep_1", &sealed)
                .unwrap_err()
                .to_string()
                .contains("lacks")
        );
    }

    #[test]
    fn keys_rotate_by_putting_a_new_one_first() {
        let old = SecretKeys::generate("k1");
        let sealed = old.seal("ep_1", &Secret::generate()).unwrap();
        let rotated = SecretKeys::parse(&[
            SecretKeys::generate("k2").to_written()[0].clone(),
            old.to_written()[0].clone(),
        ])
        .unwrap();
        assert!(
            rotated.open("ep_1", &sealed).is_ok(),
            "the old key still opens what it sealed"
        );
        assert!(
            rotated
                .seal("ep_1", &Secret::generate())
                .unwrap()
                .starts_with("sealed1:k2:"),
            "the new one seals"
        );
    }

    #[test]
    fn written_keys_are_checked_and_never_shown() {
        for (bad, says) in [
            ("k1", "<key id>:<base64 key>"),
            ("k1:not base64!", "not base64"),
            ("k1:AAAA", "32 bytes"),
            (":AAAA", "the id"),
        ] {
            let error = SecretKeys::parse(&[bad]).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
        let keys = SecretKeys::generate("k1");
        let written = keys.to_written();
        assert_eq!(SecretKeys::parse(&written).unwrap(), keys);
        assert!(
            SecretKeys::parse(&[written[0].clone(), written[0].clone()])
                .unwrap_err()
                .contains("twice")
        );
        assert_eq!(format!("{keys:?}"), "[\"k1:<redacted>\"]");
    }
}
