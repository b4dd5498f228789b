//! The sealing format of the reference (§9), byte for byte: keys and their ids, the additional
//! data (AAD) that binds a payload to its envelope, and AES-256-GCM sealing of event payloads
//! and files.
//!
//! - A key is 32 bytes, given as standard base64; its id is the first 12 hex digits of
//!   `sha256("loom.key.v1" + key bytes)`.
//! - An event's payload becomes `{"sealed": base64(nonce ‖ ciphertext ‖ tag), "key_id"}`, its
//!   plaintext the clear payload's JSON, its AAD
//!   `"loom.seal.v1\n<tenant>\n<session>\n<seq>\n<event_id>\n<ts>"` with `ts` as Python's
//!   `datetime.isoformat()` writes an aware UTC time ([`isoformat`]).
//! - A file becomes `b"LOOMSEAL1" ‖ key_id (12 ASCII) ‖ nonce ‖ ciphertext ‖ tag`, its AAD the
//!   artifact URI.
//!
//! Nonces are 12 random bytes from the operating system for every seal: with one key, the
//! chance of a repeated nonce stays negligible below 2³² seals (NIST SP 800-38D), and keys are
//! meant to be rotated (`storage.encryption.keys`: the first seals, all open).

use base64::{Engine as _, engine::general_purpose::STANDARD};
use chrono::{DateTime, Datelike, Timelike, Utc};
use loom_core::{Event, Payload, event::SealedPayload};
use ring::{
    aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey},
    rand::{SecureRandom, SystemRandom},
};
use sha2::{Digest, Sha256};

/// The length of a key, in bytes (AES-256).
pub const KEY_LEN: usize = 32;

/// What a sealed file starts with.
pub const FILE_MAGIC: &[u8] = b"LOOMSEAL1";

/// The length of a key id, in hex digits (and in ASCII bytes in a sealed file).
pub const KEY_ID_LEN: usize = SealedPayload::KEY_ID_LEN;

/// The length of the GCM tag that follows the ciphertext.
const TAG_LEN: usize = 16;

/// Why something could not be sealed or opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// A key value that is not 32 bytes of standard base64.
    #[error("not a key: {0}")]
    BadKey(String),
    /// The key does not open the ciphertext: its bytes were altered, or it was sealed for
    /// another envelope (tenant, session, seq, event id, time) or URI.
    #[error(
        "the key does not open it: its bytes were altered, or it was sealed for another envelope"
    )]
    Open,
    /// The sealed bytes do not have the sealing format.
    #[error("ill-formed seal: {0}")]
    Malformed(String),
    /// What was opened is not what was sealed (a payload that does not read back).
    #[error("the opened payload does not read: {0}")]
    Payload(String),
    /// The operating system gave no random nonce.
    #[error("no random nonce could be drawn")]
    Random,
    /// More bytes than AES-GCM can seal under one nonce.
    #[error("{0} bytes are more than AES-GCM seals at once")]
    TooLong(usize),
}

/// An AES-256-GCM key with its id. Its `Debug` shows the id only.
pub struct Key {
    id: String,
    key: LessSafeKey,
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Key")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Key {
    /// The key a secret's value gives: 32 bytes in standard base64 (surrounding whitespace, as
    /// a file's final newline, is ignored).
    pub fn from_base64(value: &str) -> Result<Key, SealError> {
        let bytes = STANDARD.decode(value.trim()).map_err(|_| {
            SealError::BadKey(format!(
                "expected {KEY_LEN} bytes in standard base64 (e.g. the output of `openssl rand \
                 -base64 32`), found text that is not base64"
            ))
        })?;
        let bytes: [u8; KEY_LEN] = bytes.as_slice().try_into().map_err(|_| {
            SealError::BadKey(format!(
                "expected {KEY_LEN} bytes in standard base64, found {} bytes",
                bytes.len()
            ))
        })?;
        Ok(Key::from_bytes(&bytes))
    }

    /// The key made of these 32 bytes.
    pub fn from_bytes(bytes: &[u8; KEY_LEN]) -> Key {
        // AES_256_GCM takes exactly KEY_LEN bytes: the only error ring can return is a length.
        let unbound = UnboundKey::new(&AES_256_GCM, bytes);
        let key = match unbound {
            Ok(unbound) => LessSafeKey::new(unbound),
            Err(_) => unreachable!("AES-256-GCM keys are {KEY_LEN} bytes"),
        };
        Key {
            id: key_id(bytes),
            key,
        }
    }

    /// The key's id: 12 hex digits of `sha256("loom.key.v1" + key)`.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `nonce ‖ ciphertext ‖ tag` of `plaintext` under `aad`, with a fresh random nonce.
    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Result<Vec<u8>, SealError> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SealError::Random)?;
        self.seal_with_nonce(nonce, aad, plaintext)
    }

    /// [`Key::seal`] with a chosen nonce: for test vectors only (a nonce must never repeat
    /// under one key).
    pub fn seal_with_nonce(
        &self,
        nonce: [u8; NONCE_LEN],
        aad: &[u8],
        plaintext: &[u8],
    ) -> Result<Vec<u8>, SealError> {
        let mut out = Vec::with_capacity(NONCE_LEN + plaintext.len() + TAG_LEN);
        out.extend_from_slice(&nonce);
        let mut in_out = plaintext.to_vec();
        // Refused only for a plaintext over GCM's limit (64 GiB).
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut in_out,
            )
            .map_err(|_| SealError::TooLong(plaintext.len()))?;
        out.extend_from_slice(&in_out);
        Ok(out)
    }

    /// The plaintext of `nonce ‖ ciphertext ‖ tag` sealed under `aad` with this key.
    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> Result<Vec<u8>, SealError> {
        if sealed.len() < NONCE_LEN + TAG_LEN {
            return Err(SealError::Malformed(format!(
                "{} bytes, fewer than a nonce and a tag",
                sealed.len()
            )));
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| SealError::Malformed("the nonce is not 12 bytes".into()))?;
        let mut in_out = ciphertext.to_vec();
        let clear = self
            .key
            .open_in_place(nonce, Aad::from(aad), &mut in_out)
            .map_err(|_| SealError::Open)?;
        let len = clear.len();
        in_out.truncate(len);
        Ok(in_out)
    }
}

/// The id of a key: the first 12 hex digits of `sha256("loom.key.v1" + key bytes)`.
pub fn key_id(key: &[u8]) -> String {
    let mut digest = Sha256::new();
    digest.update(b"loom.key.v1");
    digest.update(key);
    let mut id = hex::encode(digest.finalize());
    id.truncate(KEY_ID_LEN);
    id
}

/// `ts` as Python's `datetime.isoformat()` writes an aware UTC datetime:
/// `2026-05-01T12:00:00.123456+00:00`, and without the fraction when the microseconds are 0
/// (`2026-05-01T12:00:00+00:00`). Below the microsecond nothing is written, as a journal keeps
/// microseconds.
pub fn isoformat(ts: &DateTime<Utc>) -> String {
    let micros = ts.timestamp_subsec_micros();
    let fraction = if micros == 0 {
        String::new()
    } else {
        format!(".{micros:06}")
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}{fraction}+00:00",
        ts.year(),
        ts.month(),
        ts.day(),
        ts.hour(),
        ts.minute(),
        ts.second()
    )
}

/// The AAD of an event's payload: `loom.seal.v1`, then its tenant, session, seq, event id and
/// time ([`isoformat`]), one per line.
pub fn event_aad(event: &Event, seq: u64) -> String {
    format!(
        "loom.seal.v1\n{}\n{}\n{seq}\n{}\n{}",
        event.tenant_id,
        event.session_id,
        event.event_id,
        isoformat(&event.ts)
    )
}

/// The sealed form of `event`'s clear payload, to be written at `seq`.
pub fn seal_payload(key: &Key, event: &Event, seq: u64) -> Result<SealedPayload, SealError> {
    let plaintext = serde_json::to_vec(&event.payload)
        .map_err(|error| SealError::Payload(error.to_string()))?;
    let sealed = key.seal(event_aad(event, seq).as_bytes(), &plaintext)?;
    Ok(SealedPayload {
        sealed: STANDARD.encode(sealed),
        key_id: key.id().to_owned(),
    })
}

/// The clear payload of `event`, whose payload `sealed` was sealed with `key` (the key whose id
/// it names), checked against the event's seq and envelope.
pub fn open_payload(
    key: &Key,
    event: &Event,
    sealed: &SealedPayload,
) -> Result<Payload, SealError> {
    let bytes = STANDARD
        .decode(&sealed.sealed)
        .map_err(|_| SealError::Malformed("the sealed payload is not base64".into()))?;
    let clear = key.open(event_aad(event, event.seq).as_bytes(), &bytes)?;
    let payload: Payload =
        serde_json::from_slice(&clear).map_err(|error| SealError::Payload(error.to_string()))?;
    if matches!(payload, Payload::Sealed(_)) {
        return Err(SealError::Payload(
            "a sealed payload inside a sealed payload".into(),
        ));
    }
    Ok(payload)
}

/// A file's sealed bytes: [`FILE_MAGIC`], the key id, then `nonce ‖ ciphertext ‖ tag` under the
/// artifact's URI.
pub fn seal_file(key: &Key, uri: &str, bytes: &[u8]) -> Result<Vec<u8>, SealError> {
    let sealed = key.seal(uri.as_bytes(), bytes)?;
    let mut out = Vec::with_capacity(FILE_MAGIC.len() + KEY_ID_LEN + sealed.len());
    out.extend_from_slice(FILE_MAGIC);
    out.extend_from_slice(key.id().as_bytes());
    out.extend_from_slice(&sealed);
    Ok(out)
}

/// The key id a sealed file names, `None` for a clear file (one that does not start with
/// [`FILE_MAGIC`]).
pub fn file_key_id(bytes: &[u8]) -> Option<Result<&str, SealError>> {
    let rest = bytes.strip_prefix(FILE_MAGIC)?;
    Some(
        rest.get(..KEY_ID_LEN)
            .and_then(|id| std::str::from_utf8(id).ok())
            .ok_or_else(|| SealError::Malformed("a sealed file without its key id".into())),
    )
}

/// The clear bytes of a sealed file (it starts with [`FILE_MAGIC`] and `key`'s id).
pub fn open_file(key: &Key, uri: &str, bytes: &[u8]) -> Result<Vec<u8>, SealError> {
    let sealed = bytes
        .get(FILE_MAGIC.len() + KEY_ID_LEN..)
        .ok_or_else(|| SealError::Malformed("a sealed file without its key id".into()))?;
    key.open(uri.as_bytes(), sealed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use chrono::TimeZone;

    use super::*;

    fn fixed_key() -> Key {
        let bytes: [u8; KEY_LEN] = std::array::from_fn(|i| i as u8);
        Key::from_bytes(&bytes)
    }

    /// Python's `datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=timezone.utc).isoformat()`, and
    /// the same without microseconds (no fraction at all).
    #[test]
    fn timestamps_are_written_as_python_isoformat_writes_them() {
        let with = Utc.with_ymd_and_hms(2026, 5, 1, 12, 0, 0).unwrap()
            + chrono::Duration::microseconds(123_456);
        assert_eq!(isoformat(&with), "2026-05-01T12:00:00.123456+00:00");
        let without = Utc.with_ymd_and_hms(2026, 5, 1, 12, 0, 0).unwrap();
        assert_eq!(isoformat(&without), "2026-05-01T12:00:00+00:00");
        let small = without + chrono::Duration::microseconds(7);
        assert_eq!(isoformat(&small), "2026-05-01T12:00:00.000007+00:00");
        // Nanoseconds below the microsecond are not written (the journal keeps microseconds).
        let nanos = without + chrono::Duration::nanoseconds(1_500);
        assert_eq!(isoformat(&nanos), "2026-05-01T12:00:00.000001+00:00");
    }

    /// The vector was computed independently with Python's `cryptography` (AESGCM) over the
    /// same key (bytes 0..31), nonce (bytes 0..11), AAD and plaintext.
    #[test]
    fn a_known_key_nonce_and_aad_give_known_bytes() {
        let key = fixed_key();
        assert_eq!(key.id(), KNOWN_KEY_ID);
        let aad = "loom.seal.v1\nacme\ns-1\n3\nevt-1\n2026-05-01T12:00:00.123456+00:00";
        let nonce: [u8; NONCE_LEN] = std::array::from_fn(|i| i as u8);
        let sealed = key
            .seal_with_nonce(nonce, aad.as_bytes(), br#"{"type":"message.user"}"#)
            .unwrap();
        assert_eq!(STANDARD.encode(&sealed), KNOWN_SEALED);
        assert_eq!(
            key.open(aad.as_bytes(), &sealed).unwrap(),
            br#"{"type":"message.user"}"#
        );
    }

    const KNOWN_KEY_ID: &str = "4ed42d1a2576";
    const KNOWN_SEALED: &str =
        "AAECAwQFBgcICQoLPCCiYrWA4CGvLPL4wogfCK2j9FGCWSLE/UqH73vRuIOVasSJEHik";

    /// Changing any field of the AAD, or any byte of the seal, makes opening fail.
    #[test]
    fn tampering_any_aad_field_or_byte_fails() {
        let key = fixed_key();
        let fields = [
            "acme",
            "s-1",
            "3",
            "evt-1",
            "2026-05-01T12:00:00.123456+00:00",
        ];
        let aad = |f: &[&str]| format!("loom.seal.v1\n{}", f.join("\n"));
        let sealed = key.seal(aad(&fields).as_bytes(), b"secret").unwrap();
        assert_eq!(
            key.open(aad(&fields).as_bytes(), &sealed).unwrap(),
            b"secret"
        );
        for i in 0..fields.len() {
            let mut changed = fields;
            let altered = format!("{}x", fields[i]);
            changed[i] = &altered;
            assert_eq!(
                key.open(aad(&changed).as_bytes(), &sealed),
                Err(SealError::Open),
                "field {i}"
            );
        }
        for at in [0, NONCE_LEN, sealed.len() - 1] {
            let mut bytes = sealed.clone();
            bytes[at] ^= 1;
            assert_eq!(
                key.open(aad(&fields).as_bytes(), &bytes),
                Err(SealError::Open),
                "byte {at}"
            );
        }
        let other = Key::from_bytes(&[7; KEY_LEN]);
        assert_eq!(
            other.open(aad(&fields).as_bytes(), &sealed),
            Err(SealError::Open)
        );
    }

    #[test]
    fn a_key_is_32_bytes_of_base64() {
        let good = STANDARD.encode([1u8; KEY_LEN]);
        assert_eq!(
            Key::from_base64(&format!("{good}\n")).unwrap().id().len(),
            12
        );
        let short = STANDARD.encode([1u8; 16]);
        assert_eq!(
            Key::from_base64(&short).unwrap_err().to_string(),
            "not a key: expected 32 bytes in standard base64, found 16 bytes"
        );
        assert!(
            Key::from_base64("not base64!")
                .unwrap_err()
                .to_string()
                .contains("not base64")
        );
    }

    #[test]
    fn files_carry_the_magic_and_key_id_and_open_only_under_their_uri() {
        let key = fixed_key();
        let sealed = seal_file(&key, "artifact://t/s/ab.txt", b"bytes").unwrap();
        assert!(sealed.starts_with(FILE_MAGIC));
        assert_eq!(file_key_id(&sealed).unwrap().unwrap(), key.id());
        assert_eq!(
            open_file(&key, "artifact://t/s/ab.txt", &sealed).unwrap(),
            b"bytes"
        );
        assert_eq!(
            open_file(&key, "artifact://t/s/cd.txt", &sealed),
            Err(SealError::Open)
        );
        assert!(file_key_id(b"clear bytes").is_none());
    }
}
