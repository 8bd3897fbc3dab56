//! Dashboard sessions: a random id in the cookie, its SHA-256 in Redis
//! mapped to the digest of the token that signed in, and the CSRF token
//! derived from the id (see the module header of `auth`).

use sha2::{Digest, Sha256};

use super::Caller;
use crate::app::AppState;
use crate::store::StoreError;

/// Starts a dashboard session for `token` (which must resolve); returns the
/// session id for the cookie.
pub(crate) async fn create_session(s: &AppState, token: &str) -> Result<String, StoreError> {
    let id = hex(&rand::random::<[u8; 32]>());
    let token_hash = hex(&Sha256::digest(token.as_bytes()));
    s.store
        .session_put(&id_hash(&id), &token_hash, s.cfg.auth.session_ttl_ms)
        .await?;
    Ok(id)
}

/// Ends a session on every node.
pub(crate) async fn end_session(s: &AppState, id: &str) -> Result<(), StoreError> {
    if !is_session_id(id) {
        return Ok(());
    }
    s.store.session_del(&id_hash(id)).await
}

/// The caller of a session cookie: None when the session is unknown, ended
/// or expired, or its token is no longer configured.
pub(super) async fn session_caller(s: &AppState, id: &str) -> Result<Option<Caller>, StoreError> {
    if !is_session_id(id) {
        return Ok(None);
    }
    let Some(stored) = s.store.session_get(&id_hash(id)).await? else {
        return Ok(None);
    };
    let mut digest = [0u8; 32];
    if stored.len() != 64 {
        return Ok(None);
    }
    for (i, chunk) in stored.as_bytes().chunks(2).enumerate() {
        let Some(b) = std::str::from_utf8(chunk)
            .ok()
            .and_then(|h| u8::from_str_radix(h, 16).ok())
        else {
            return Ok(None);
        };
        digest[i] = b;
    }
    Ok(s.auth.by_digest(&digest).map(|t| Caller {
        name: t.name.clone(),
        role: t.role,
        csrf: csrf_for(id.as_bytes()),
    }))
}

/// Redis keeps the hash of the id, so a read of Redis yields no cookie.
fn id_hash(id: &str) -> String {
    hex(&Sha256::digest(id.as_bytes()))
}

fn is_session_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

pub(super) fn csrf_for(secret: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(b"muster-csrf\0");
    h.update(secret);
    hex(&h.finalize())
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
