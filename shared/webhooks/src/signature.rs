//! Standard Webhooks v1 signatures: the sender signs each delivery, the receiver checks it.
//!
//! Why sign at all, and why this format? A receiver's endpoint is a public URL: anyone can post
//! to it, so the receiver must be able to tell our deliveries from forgeries and from replays of
//! old ones. The Standard Webhooks format does both with one HMAC-SHA256 over
//! `"{webhook-id}.{webhook-timestamp}.{body}"`: the body cannot be changed, the id cannot be
//! swapped (receivers dedupe on it), and the timestamp cannot be moved, so a receiver that
//! rejects timestamps outside a window ([`TOLERANCE_SECS`]) rejects old captures as well.
//! Receivers already have libraries for the format in most languages.
//!
//! The `webhook-signature` header holds space-separated `v1,<base64>` entries, one per secret
//! the sender signs with. That is how a secret is rotated without a gap: during the overlap the
//! [`Signer`] signs with the old and the new secret, and a receiver that knows either accepts the
//! delivery; any one matching entry is enough for the [`Verifier`].

use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use rand::Rng as _;
use sha2::Sha256;

/// Header carrying the delivery's id, stable across retries.
pub use wire::WEBHOOK_ID;
/// Header carrying the space-separated `v1,<base64>` signatures.
pub use wire::WEBHOOK_SIGNATURE;
/// Header carrying the time of signing, in whole seconds since the Unix epoch.
pub use wire::WEBHOOK_TIMESTAMP;

/// How far a timestamp may be from the receiver's clock, either way, in seconds (inclusive).
///
/// Five minutes absorbs clock skew and a slow delivery while keeping the replay window short.
pub const TOLERANCE_SECS: u64 = 300;

const SECRET_PREFIX: &str = "whsec_";
const GENERATED_SECRET_BYTES: usize = 32;
const VERSION_V1: &str = "v1";

type HmacSha256 = Hmac<Sha256>;

/// A shared signing key, written `whsec_<base64>`.
///
/// `Debug` never shows the key; `Display` does, since that is how a secret is handed to a
/// receiver.
#[derive(Clone)]
pub struct Secret {
    key: Vec<u8>,
}

/// Why a text is not a secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("webhook secret is not base64 (after the optional whsec_ prefix): {0}")]
    NotBase64(#[from] base64::DecodeError),
    #[error("webhook secret is empty")]
    Empty,
}

impl Secret {
    /// A new random secret of 32 bytes, from rand's thread-local CSPRNG (seeded by the OS).
    pub fn generate() -> Self {
        let mut key = vec![0u8; GENERATED_SECRET_BYTES];
        rand::rng().fill(key.as_mut_slice());
        Self { key }
    }

    /// The HMAC over the signed content, before finalisation; callers finalise or verify it.
    fn mac_over(&self, msg_id: &str, timestamp_secs: u64, body: &[u8]) -> HmacSha256 {
        let mut mac =
            HmacSha256::new_from_slice(&self.key).expect("HMAC accepts keys of any length");
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp_secs.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac
    }
}

impl FromStr for Secret {
    type Err = SecretError;

    /// Accepts `whsec_<base64>` and, for secrets copied without it, bare base64.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let encoded = text.strip_prefix(SECRET_PREFIX).unwrap_or(text);
        let key = BASE64.decode(encoded)?;
        if key.is_empty() {
            return Err(SecretError::Empty);
        }
        Ok(Self { key })
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SECRET_PREFIX}{}", BASE64.encode(&self.key))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(redacted)")
    }
}

/// One `v1,<base64>` signature of a delivery: HMAC-SHA256 of `"{msg_id}.{timestamp}.{body}"`.
pub fn sign(secret: &Secret, msg_id: &str, timestamp_secs: u64, body: &[u8]) -> String {
    let tag = secret
        .mac_over(msg_id, timestamp_secs, body)
        .finalize()
        .into_bytes();
    format!("{VERSION_V1},{}", BASE64.encode(tag))
}

/// The sender's side: every active secret signs every delivery.
#[derive(Clone, Debug)]
pub struct Signer {
    secrets: Vec<Secret>,
}

impl Signer {
    pub fn new(secret: Secret) -> Self {
        Self {
            secrets: vec![secret],
        }
    }

    /// Signs with `secret` too, for the overlap of a rotation.
    pub fn with_secret(mut self, secret: Secret) -> Self {
        self.secrets.push(secret);
        self
    }

    /// The `webhook-signature` value: one `v1,…` entry per secret, separated by spaces.
    pub fn signature_header(&self, msg_id: &str, timestamp_secs: u64, body: &[u8]) -> String {
        self.secrets
            .iter()
            .map(|secret| sign(secret, msg_id, timestamp_secs, body))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The three headers of a delivery, as (name, value) pairs.
    pub fn headers(
        &self,
        msg_id: &str,
        timestamp_secs: u64,
        body: &[u8],
    ) -> [(&'static str, String); 3] {
        [
            (WEBHOOK_ID, msg_id.to_owned()),
            (WEBHOOK_TIMESTAMP, timestamp_secs.to_string()),
            (
                WEBHOOK_SIGNATURE,
                self.signature_header(msg_id, timestamp_secs, body),
            ),
        ]
    }
}

/// The three Standard Webhooks headers of a received delivery, as the receiver found them.
///
/// `None` is a header that was absent; a receiver whose framework gives header values as bytes
/// passes a value that is not text as `None` too, since no valid header holds such bytes.
#[derive(Clone, Copy, Debug)]
pub struct ReceivedHeaders<'a> {
    pub id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// Why a delivery was rejected.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VerifyError {
    #[error("the {0} header is missing")]
    MissingHeader(&'static str),
    #[error("webhook-timestamp {0:?} is not a whole number of seconds since the Unix epoch")]
    BadTimestamp(String),
    #[error("webhook-timestamp {timestamp} is {} s before now ({now}): too old", now.abs_diff(*timestamp))]
    TooOld { timestamp: u64, now: u64 },
    #[error("webhook-timestamp {timestamp} is {} s after now ({now}): too new", timestamp.abs_diff(*now))]
    TooNew { timestamp: u64, now: u64 },
    #[error("no signature matches, and webhook-signature entry {position} is malformed")]
    MalformedSignature { position: usize },
    #[error("none of the {v1_entries} v1 entries of webhook-signature matches a known secret")]
    NoMatchingSignature { v1_entries: usize },
}

/// The receiver's side: checks the time window and the signature against one or more secrets.
///
/// ```
/// use webhooks::signature::{ReceivedHeaders, Secret, Signer, Verifier};
///
/// let secret: Secret = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD".parse()?;
/// let body = br#"{"type":"order.paid"}"#;
/// let signature = Signer::new(secret.clone()).signature_header("msg_1", 1_700_000_000, body);
///
/// let received = ReceivedHeaders {
///     id: Some("msg_1"),
///     timestamp: Some("1700000000"),
///     signature: Some(&signature),
/// };
/// Verifier::new(secret).verify(&received, body, 1_700_000_042)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Verifier {
    secrets: Vec<Secret>,
}

impl Verifier {
    pub fn new(secret: Secret) -> Self {
        Self {
            secrets: vec![secret],
        }
    }

    /// Accepts signatures made with `secret` too, for the overlap of a rotation.
    pub fn with_secret(mut self, secret: Secret) -> Self {
        self.secrets.push(secret);
        self
    }

    /// Verifies a delivery against the clock reading `now_secs` (seconds since the Unix epoch).
    ///
    /// The time window is checked before any HMAC is computed, so stale replays cost little.
    pub fn verify(
        &self,
        headers: &ReceivedHeaders<'_>,
        body: &[u8],
        now_secs: u64,
    ) -> Result<(), VerifyError> {
        let msg_id = headers.id.ok_or(VerifyError::MissingHeader(WEBHOOK_ID))?;
        let timestamp = headers
            .timestamp
            .ok_or(VerifyError::MissingHeader(WEBHOOK_TIMESTAMP))?;
        let signature = headers
            .signature
            .ok_or(VerifyError::MissingHeader(WEBHOOK_SIGNATURE))?;

        let timestamp = parse_timestamp(timestamp)?;
        check_window(timestamp, now_secs)?;
        let entries = parse_signature_header(signature);

        let any_match = self.secrets.iter().any(|secret| {
            let mac = secret.mac_over(msg_id, timestamp, body);
            // verify_slice compares in constant time; the clone is the HMAC state, not the key.
            entries
                .v1_tags
                .iter()
                .any(|tag| mac.clone().verify_slice(tag).is_ok())
        });
        match (any_match, entries.first_malformed) {
            (true, _) => Ok(()),
            (false, Some(position)) => Err(VerifyError::MalformedSignature { position }),
            (false, None) => Err(VerifyError::NoMatchingSignature {
                v1_entries: entries.v1_tags.len(),
            }),
        }
    }

    /// [`Verifier::verify`] against the system clock.
    pub fn verify_now(
        &self,
        headers: &ReceivedHeaders<'_>,
        body: &[u8],
    ) -> Result<(), VerifyError> {
        // A clock before 1970 reads as 0: every real timestamp is then too new, which rejects.
        let now_secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since_epoch| since_epoch.as_secs());
        self.verify(headers, body, now_secs)
    }
}

/// Digits only: `u64::from_str` would also take a leading `+`, which no sender writes.
fn parse_timestamp(text: &str) -> Result<u64, VerifyError> {
    if text.is_empty() || !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(VerifyError::BadTimestamp(text.to_owned()));
    }
    text.parse()
        .map_err(|_| VerifyError::BadTimestamp(text.to_owned()))
}

fn check_window(timestamp: u64, now: u64) -> Result<(), VerifyError> {
    if timestamp < now && now - timestamp > TOLERANCE_SECS {
        return Err(VerifyError::TooOld { timestamp, now });
    }
    if timestamp > now && timestamp - now > TOLERANCE_SECS {
        return Err(VerifyError::TooNew { timestamp, now });
    }
    Ok(())
}

/// The v1 entries of a `webhook-signature` value, decoded, and the position of the first entry
/// that could not be read.
///
/// Entries of other versions are skipped, so that senders can add schemes (such as `v1a`) without
/// breaking v1 receivers. A malformed entry does not reject the delivery by itself: another entry
/// may still match, and it only names the cause when none does.
struct SignatureEntries {
    v1_tags: Vec<Vec<u8>>,
    first_malformed: Option<usize>,
}

fn parse_signature_header(header: &str) -> SignatureEntries {
    let mut entries = SignatureEntries {
        v1_tags: Vec::new(),
        first_malformed: None,
    };
    for (position, entry) in header.split_ascii_whitespace().enumerate() {
        let tag = match entry.split_once(',') {
            Some((VERSION_V1, encoded)) => BASE64.decode(encoded).ok(),
            Some(_other_version) => continue,
            None => None,
        };
        match tag {
            Some(tag) => entries.v1_tags.push(tag),
            None => {
                entries.first_malformed.get_or_insert(position);
            }
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::{collection::vec, prelude::*};

    // The test vector published with the Standard Webhooks specification.
    const VECTOR_SECRET: &str = "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD";
    const VECTOR_ID: &str = "msg_27UH4WbU6Z5A5EzD8u03UvzRbpk";
    const VECTOR_TIMESTAMP: u64 = 1_649_367_553;
    const VECTOR_BODY: &[u8] = br#"{"email":"test@example.com","username":"test_user"}"#;
    const VECTOR_SIGNATURE: &str = "v1,tZ1I4/hDygAJgO5TYxiSd6Sd0kDW6hPenDe+bTa3Kkw=";

    fn vector_secret() -> Secret {
        VECTOR_SECRET.parse().unwrap()
    }

    fn headers<'a>(id: &'a str, timestamp: &'a str, signature: &'a str) -> ReceivedHeaders<'a> {
        ReceivedHeaders {
            id: Some(id),
            timestamp: Some(timestamp),
            signature: Some(signature),
        }
    }

    fn verify_vector_at(now: u64) -> Result<(), VerifyError> {
        let timestamp = VECTOR_TIMESTAMP.to_string();
        Verifier::new(vector_secret()).verify(
            &headers(VECTOR_ID, &timestamp, VECTOR_SIGNATURE),
            VECTOR_BODY,
            now,
        )
    }

    #[test]
    fn signing_reproduces_the_standard_webhooks_test_vector() {
        assert_eq!(
            sign(&vector_secret(), VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY),
            VECTOR_SIGNATURE
        );
    }

    #[test]
    fn the_test_vector_verifies() {
        assert_eq!(verify_vector_at(VECTOR_TIMESTAMP), Ok(()));
    }

    #[test]
    fn a_secret_without_the_prefix_is_the_same_key() {
        let bare: Secret = VECTOR_SECRET
            .trim_start_matches(SECRET_PREFIX)
            .parse()
            .unwrap();
        assert_eq!(
            sign(&bare, VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY),
            VECTOR_SIGNATURE
        );
    }

    #[test]
    fn secrets_that_are_not_base64_or_empty_are_refused() {
        assert!(matches!(
            "whsec_not*base64".parse::<Secret>(),
            Err(SecretError::NotBase64(_))
        ));
        assert!(matches!(
            "whsec_".parse::<Secret>(),
            Err(SecretError::Empty)
        ));
    }

    #[test]
    fn a_generated_secret_round_trips_through_its_text_and_debug_hides_it() {
        let secret = Secret::generate();
        let text = secret.to_string();
        assert!(text.starts_with(SECRET_PREFIX));
        let parsed: Secret = text.parse().unwrap();
        assert_eq!(parsed.key, secret.key);
        assert_eq!(parsed.key.len(), GENERATED_SECRET_BYTES);
        let debug = format!("{secret:?}");
        assert!(
            !debug.contains(text.trim_start_matches(SECRET_PREFIX)),
            "{debug}"
        );
        assert_ne!(Secret::generate().key, secret.key);
    }

    #[test]
    fn a_changed_body_id_or_timestamp_fails() {
        let verifier = Verifier::new(vector_secret());
        let timestamp = VECTOR_TIMESTAMP.to_string();
        let no_match = Err(VerifyError::NoMatchingSignature { v1_entries: 1 });

        let changed_body = br#"{"email":"test@example.com","username":"test_user2"}"#;
        let other_id = headers(
            "msg_27UH4WbU6Z5A5EzD8u03UvzRbpl",
            &timestamp,
            VECTOR_SIGNATURE,
        );
        let later = (VECTOR_TIMESTAMP + 1).to_string();
        let other_timestamp = headers(VECTOR_ID, &later, VECTOR_SIGNATURE);

        let original = headers(VECTOR_ID, &timestamp, VECTOR_SIGNATURE);
        assert_eq!(
            verifier.verify(&original, changed_body, VECTOR_TIMESTAMP),
            no_match
        );
        assert_eq!(
            verifier.verify(&other_id, VECTOR_BODY, VECTOR_TIMESTAMP),
            no_match
        );
        assert_eq!(
            verifier.verify(&other_timestamp, VECTOR_BODY, VECTOR_TIMESTAMP),
            no_match
        );
    }

    #[test]
    fn a_wrong_secret_fails() {
        let verifier = Verifier::new(Secret::generate());
        let timestamp = VECTOR_TIMESTAMP.to_string();
        assert_eq!(
            verifier.verify(
                &headers(VECTOR_ID, &timestamp, VECTOR_SIGNATURE),
                VECTOR_BODY,
                VECTOR_TIMESTAMP
            ),
            Err(VerifyError::NoMatchingSignature { v1_entries: 1 })
        );
    }

    #[test]
    fn timestamps_up_to_300_s_either_way_are_accepted() {
        assert_eq!(verify_vector_at(VECTOR_TIMESTAMP + 300), Ok(()));
        assert_eq!(verify_vector_at(VECTOR_TIMESTAMP - 300), Ok(()));
    }

    #[test]
    fn timestamps_301_s_either_way_are_rejected() {
        assert_eq!(
            verify_vector_at(VECTOR_TIMESTAMP + 301),
            Err(VerifyError::TooOld {
                timestamp: VECTOR_TIMESTAMP,
                now: VECTOR_TIMESTAMP + 301
            })
        );
        assert_eq!(
            verify_vector_at(VECTOR_TIMESTAMP - 301),
            Err(VerifyError::TooNew {
                timestamp: VECTOR_TIMESTAMP,
                now: VECTOR_TIMESTAMP - 301
            })
        );
    }

    #[test]
    fn a_rejected_timestamp_says_how_far_off_it_is() {
        let too_old = VerifyError::TooOld {
            timestamp: 1_000,
            now: 1_301,
        };
        assert_eq!(
            too_old.to_string(),
            "webhook-timestamp 1000 is 301 s before now (1301): too old"
        );
        let too_new = VerifyError::TooNew {
            timestamp: 1_301,
            now: 1_000,
        };
        assert_eq!(
            too_new.to_string(),
            "webhook-timestamp 1301 is 301 s after now (1000): too new"
        );
    }

    #[test]
    fn the_window_is_checked_before_the_signature() {
        let verifier = Verifier::new(vector_secret());
        let timestamp = VECTOR_TIMESTAMP.to_string();
        let forged = headers(VECTOR_ID, &timestamp, "v1,AAAA");
        assert!(matches!(
            verifier.verify(&forged, VECTOR_BODY, VECTOR_TIMESTAMP + 1000),
            Err(VerifyError::TooOld { .. })
        ));
    }

    #[test]
    fn one_matching_signature_among_several_is_enough() {
        let verifier = Verifier::new(vector_secret());
        let timestamp = VECTOR_TIMESTAMP.to_string();
        let other = sign(
            &Secret::generate(),
            VECTOR_ID,
            VECTOR_TIMESTAMP,
            VECTOR_BODY,
        );
        let header = format!("{other} {VECTOR_SIGNATURE}");
        assert_eq!(
            verifier.verify(
                &headers(VECTOR_ID, &timestamp, &header),
                VECTOR_BODY,
                VECTOR_TIMESTAMP
            ),
            Ok(())
        );
    }

    #[test]
    fn entries_of_other_versions_are_ignored() {
        let verifier = Verifier::new(vector_secret());
        let timestamp = VECTOR_TIMESTAMP.to_string();
        let with_v1a = format!("v1a,bm90IGEgdjEgc2lnbmF0dXJl {VECTOR_SIGNATURE}");
        assert_eq!(
            verifier.verify(
                &headers(VECTOR_ID, &timestamp, &with_v1a),
                VECTOR_BODY,
                VECTOR_TIMESTAMP
            ),
            Ok(())
        );
        let only_v2 = VECTOR_SIGNATURE.replacen("v1,", "v2,", 1);
        assert_eq!(
            verifier.verify(
                &headers(VECTOR_ID, &timestamp, &only_v2),
                VECTOR_BODY,
                VECTOR_TIMESTAMP
            ),
            Err(VerifyError::NoMatchingSignature { v1_entries: 0 })
        );
    }

    #[test]
    fn rotation_signs_with_both_secrets_and_each_alone_verifies() {
        let (old, new) = (vector_secret(), Secret::generate());
        let signer = Signer::new(old.clone()).with_secret(new.clone());
        let [id, timestamp, signature] = signer.headers(VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY);
        assert_eq!(
            (id.0, timestamp.0, signature.0),
            (WEBHOOK_ID, WEBHOOK_TIMESTAMP, WEBHOOK_SIGNATURE)
        );
        assert_eq!(signature.1.split(' ').count(), 2);
        assert!(signature.1.starts_with(VECTOR_SIGNATURE));

        let received = headers(&id.1, &timestamp.1, &signature.1);
        for secret in [old, new] {
            assert_eq!(
                Verifier::new(secret).verify(&received, VECTOR_BODY, VECTOR_TIMESTAMP),
                Ok(())
            );
        }
    }

    #[test]
    fn a_verifier_with_two_secrets_accepts_either() {
        let (old, new) = (Secret::generate(), Secret::generate());
        let verifier = Verifier::new(old.clone()).with_secret(new.clone());
        let timestamp = VECTOR_TIMESTAMP.to_string();
        for secret in [old, new] {
            let signature = sign(&secret, VECTOR_ID, VECTOR_TIMESTAMP, VECTOR_BODY);
            assert_eq!(
                verifier.verify(
                    &headers(VECTOR_ID, &timestamp, &signature),
                    VECTOR_BODY,
                    VECTOR_TIMESTAMP
                ),
                Ok(())
            );
        }
    }

    #[test]
    fn missing_headers_are_named() {
        let verifier = Verifier::new(vector_secret());
        let timestamp = VECTOR_TIMESTAMP.to_string();
        let complete = headers(VECTOR_ID, &timestamp, VECTOR_SIGNATURE);
        let cases = [
            (
                ReceivedHeaders {
                    id: None,
                    ..complete
                },
                WEBHOOK_ID,
            ),
            (
                ReceivedHeaders {
                    timestamp: None,
                    ..complete
                },
                WEBHOOK_TIMESTAMP,
            ),
            (
                ReceivedHeaders {
                    signature: None,
                    ..complete
                },
                WEBHOOK_SIGNATURE,
            ),
        ];
        for (received, missing) in cases {
            assert_eq!(
                verifier.verify(&received, VECTOR_BODY, VECTOR_TIMESTAMP),
                Err(VerifyError::MissingHeader(missing))
            );
        }
    }

    #[test]
    fn timestamps_that_are_not_plain_seconds_are_bad() {
        let verifier = Verifier::new(vector_secret());
        for bad in [
            "",
            "+1649367553",
            "-1",
            "1649367553.0",
            "1649367553 ",
            "abc",
            "99999999999999999999999",
        ] {
            assert_eq!(
                verifier.verify(
                    &headers(VECTOR_ID, bad, VECTOR_SIGNATURE),
                    VECTOR_BODY,
                    VECTOR_TIMESTAMP
                ),
                Err(VerifyError::BadTimestamp(bad.to_owned())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn malformed_entries_do_not_hide_a_match_and_are_named_when_nothing_matches() {
        let verifier = Verifier::new(vector_secret());
        let timestamp = VECTOR_TIMESTAMP.to_string();
        let verify = |header: &str| {
            verifier.verify(
                &headers(VECTOR_ID, &timestamp, header),
                VECTOR_BODY,
                VECTOR_TIMESTAMP,
            )
        };
        assert_eq!(verify(&format!("v1,*** {VECTOR_SIGNATURE}")), Ok(()));
        assert_eq!(
            verify("v1tZ1I4"),
            Err(VerifyError::MalformedSignature { position: 0 })
        );
        assert_eq!(
            verify("v1,AAAA v2,x v1,***"),
            Err(VerifyError::MalformedSignature { position: 2 })
        );
        assert_eq!(
            verify(""),
            Err(VerifyError::NoMatchingSignature { v1_entries: 0 })
        );
    }

    #[test]
    fn verify_now_uses_the_system_clock() {
        let secret = Secret::generate();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let signature = sign(&secret, VECTOR_ID, now, VECTOR_BODY);
        let timestamp = now.to_string();
        let verifier = Verifier::new(secret);
        assert_eq!(
            verifier.verify_now(&headers(VECTOR_ID, &timestamp, &signature), VECTOR_BODY),
            Ok(())
        );

        let vector_timestamp = VECTOR_TIMESTAMP.to_string();
        let years_old = headers(VECTOR_ID, &vector_timestamp, VECTOR_SIGNATURE);
        assert!(matches!(
            Verifier::new(vector_secret()).verify_now(&years_old, VECTOR_BODY),
            Err(VerifyError::TooOld {
                timestamp: VECTOR_TIMESTAMP,
                ..
            })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// What a sender signs verifies within the window, wherever its entry stands among
        /// other versions' entries and however many spaces separate them.
        #[test]
        fn what_is_signed_verifies(
            id in "[!-~]{1,64}",
            timestamp in 0u64..=4_000_000_000,
            skew in -(TOLERANCE_SECS as i64)..=(TOLERANCE_SECS as i64),
            body in vec(any::<u8>(), 0..256),
            other in "v1a,[A-Za-z0-9+/]{0,43}=?",
            spaces in " {1,3}",
        ) {
            let signature = sign(&vector_secret(), &id, timestamp, &body);
            let header = format!("{spaces}{other}{spaces}{signature}{spaces}");
            let now = timestamp.saturating_add_signed(skew);
            let timestamp = timestamp.to_string();
            prop_assert_eq!(Verifier::new(vector_secret()).verify(&headers(&id, &timestamp, &header), &body, now), Ok(()));
        }

        /// One changed bit of the tag, and nothing verifies.
        #[test]
        fn a_changed_tag_never_verifies(body in vec(any::<u8>(), 0..64), bit in 0usize..256) {
            let signature = sign(&vector_secret(), VECTOR_ID, VECTOR_TIMESTAMP, &body);
            let mut tag = BASE64.decode(signature.trim_start_matches("v1,")).unwrap();
            tag[bit / 8] ^= 1 << (bit % 8);
            let changed = format!("v1,{}", BASE64.encode(tag));
            let timestamp = VECTOR_TIMESTAMP.to_string();
            let result = Verifier::new(vector_secret()).verify(&headers(VECTOR_ID, &timestamp, &changed), &body, VECTOR_TIMESTAMP);
            prop_assert_eq!(result, Err(VerifyError::NoMatchingSignature { v1_entries: 1 }));
        }

        /// Any header text is read without a panic and verifies nothing.
        #[test]
        fn arbitrary_headers_verify_nothing(id in "\\PC{0,40}", timestamp in "\\PC{0,24}", signature in "\\PC{0,200}") {
            let result = Verifier::new(vector_secret()).verify(&headers(&id, &timestamp, &signature), VECTOR_BODY, VECTOR_TIMESTAMP);
            prop_assert!(result.is_err());
        }

        /// A timestamp is digits only, and a number of seconds that fits in 64 bits.
        #[test]
        fn timestamps_are_digits_only(text in "\\PC{0,24}|[0-9]{1,24}") {
            let digits = !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
            prop_assert_eq!(parse_timestamp(&text).ok(), text.parse::<u64>().ok().filter(|_| digits));
        }
    }
}
