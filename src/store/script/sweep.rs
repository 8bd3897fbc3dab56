//! Deleting the function libraries no live node uses, so `FUNCTION LIST`
//! (and the RDB and AOF with it) stays bounded across deploys and config
//! changes.
//!
//! A library is named after its script and a hash of its text (see
//! [`super`]): every version, and every config written into the text
//! (`events.max_len`, the Cluster flag), loads about 60 libraries of its
//! own, which nothing replaces. So:
//!
//! - **Record.** Every node records the libraries it uses (those assembled
//!   with its context, [`ScriptCtx::libraries`]) in the namespace's
//!   `{p}:functions`, a sorted set of library name → until when (Redis ms)
//!   a live node uses it: at start and every `nodes.ttl_ms`, for a lease of
//!   three ttls (`lua/functions_record.lua`; a record only moves an end
//!   later).
//! - **Sweep.** A lease and a ttl after it starts (the records of the
//!   node it replaced have ended by then), then every four leases, each
//!   node lists the libraries whose record ended
//!   (`lua/functions_ended.lua`), deletes them (`FUNCTION DELETE`, which a
//!   Redis Cluster runs on every master; one already gone counts as
//!   deleted) and forgets their records if still over
//!   (`lua/functions_forget.lua`).
//!
//! Why it never costs a live node more than one reload, and usually
//! nothing:
//!
//! - A library is deleted only when a node of the namespace recorded it and
//!   no node named it for a whole lease since. A live node renews its
//!   records every ttl, so its libraries are deleted only if it could not
//!   reach Redis for three ttls; then the next call of each finds it
//!   missing and loads it (nothing ran the first time, nothing runs twice).
//! - A library no node of the namespace ever recorded is never deleted:
//!   one a node that just started loaded before its first record, one of
//!   another namespace on the same server, one of a version without this
//!   sweep (`FUNCTION FLUSH` clears those; it is safe at any time).
//! - `FUNCTION DELETE` cannot run in a script, so a node may record a
//!   library again between the listing and the delete (a node restarted
//!   with an old config): it is deleted all the same, that node reloads it
//!   on its next call, and its record stays.
//! - Namespaces on one server share a library when their version and
//!   config match; one namespace deletes it when its own nodes stopped
//!   using it, and a node of the other then reloads it once.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::{Lua, ScriptCall, ScriptCtx};
use crate::store::{Keys, Store, StoreError, StoreResult};

/// Sorted set: the namespace's function libraries, by name, scored by
/// until when (Redis ms) a live node uses them. Bounded by the libraries
/// recorded and not yet deleted; TTL [`KEEP`] from the last record.
pub(crate) fn functions_key(k: &Keys) -> String {
    format!("{}:functions", k.prefix())
}

/// The TTL of `{p}:functions`, renewed by every record: a namespace whose
/// nodes are all gone keeps its list a month.
const KEEP: Duration = Duration::from_secs(30 * 24 * 3600);

/// Most names one call records, lists or forgets (a node has about 60).
const CHUNK: usize = 500;

/// `functions_record.lua`.
struct Record<'a> {
    lease: Duration,
    names: &'a [String],
}

impl ScriptCall for Record<'_> {
    type Reply = (i64, i64);
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![functions_key(k)]
    }
    fn args(&self) -> Vec<String> {
        let mut a = vec![
            self.lease.as_millis().to_string(),
            KEEP.as_millis().to_string(),
            self.names.len().to_string(),
        ];
        a.extend(self.names.iter().cloned());
        a
    }
}

/// `functions_ended.lua`.
struct Ended {
    max: usize,
}

impl ScriptCall for Ended {
    type Reply = Vec<String>;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![functions_key(k)]
    }
    fn args(&self) -> Vec<String> {
        vec![self.max.to_string()]
    }
}

/// `functions_forget.lua`.
struct Forget<'a> {
    names: &'a [String],
}

impl ScriptCall for Forget<'_> {
    type Reply = i64;
    fn keys(&self, k: &Keys) -> Vec<String> {
        vec![functions_key(k)]
    }
    fn args(&self) -> Vec<String> {
        let mut a = vec![self.names.len().to_string()];
        a.extend(self.names.iter().cloned());
        a
    }
}

/// Whether `name` has the shape of a muster library: `<script>_<16 hex>`.
fn is_library_name(name: &str) -> bool {
    let Some((stem, hash)) = name.rsplit_once('_') else {
        return false;
    };
    !stem.is_empty()
        && stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && hash.len() == 16
        && hash.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

/// One node's records of the libraries it uses, and the sweep.
pub(crate) struct Functions {
    store: Store,
    /// The libraries this node uses.
    names: Vec<String>,
    /// How often the node records them.
    every: Duration,
    record: Lua,
    ended: Lua,
    forget: Lua,
}

impl Functions {
    /// The records of a node whose services were built with `ctx` (so its
    /// libraries are all assembled), renewed every `ttl`
    /// (`nodes.ttl_ms`).
    pub(crate) fn new(store: &Store, ctx: &ScriptCtx, ttl: Duration) -> Functions {
        let record = Lua::load("functions_record", include_str!("../lua/functions_record.lua"), ctx);
        let ended = Lua::load("functions_ended", include_str!("../lua/functions_ended.lua"), ctx);
        let forget = Lua::load("functions_forget", include_str!("../lua/functions_forget.lua"), ctx);
        Functions {
            store: store.root(),
            names: ctx.libraries(),
            every: ttl.max(Duration::from_millis(100)),
            record,
            ended,
            forget,
        }
    }

    /// How long a record lasts: three times the interval between records.
    pub(crate) fn lease(&self) -> Duration {
        self.every * 3
    }

    /// Records this node's libraries as used for one more lease.
    pub(crate) async fn record(&self) -> StoreResult<()> {
        for names in self.names.chunks(CHUNK) {
            let call = Record {
                lease: self.lease(),
                names,
            };
            self.store.run(&self.record, &call).await?;
        }
        Ok(())
    }

    /// Deletes the libraries whose records ended (no live node of the
    /// namespace named them within a lease) and forgets those records.
    /// Returns the names deleted (or found gone already).
    pub(crate) async fn sweep(&self) -> StoreResult<Vec<String>> {
        let mut deleted = Vec::new();
        loop {
            let ended = self.store.run(&self.ended, &Ended { max: CHUNK }).await?;
            let n = ended.len();
            let mut done = Vec::with_capacity(n);
            for name in ended {
                if is_library_name(&name) {
                    let delete = redis::cmd("FUNCTION").arg("DELETE").arg(&name).clone();
                    match self.store.exec::<()>("function_delete", &delete).await {
                        Ok(()) => {}
                        // Deleted by another node's sweep, or by a flush.
                        Err(StoreError::Server(m)) if m.contains("Library not found") => {}
                        Err(e) => {
                            self.forget_records(&done).await?;
                            return Err(e);
                        }
                    }
                    deleted.push(name.clone());
                }
                done.push(name);
            }
            self.forget_records(&done).await?;
            if n < CHUNK {
                return Ok(deleted);
            }
        }
    }

    async fn forget_records(&self, names: &[String]) -> StoreResult<()> {
        if !names.is_empty() {
            self.store.run(&self.forget, &Forget { names }).await?;
        }
        Ok(())
    }
}

/// Records this node's libraries every ttl (the node recorded them once at
/// start), and sweeps a lease and a ttl after the start, then every four
/// leases, until `cancel`.
pub(crate) fn spawn(functions: Functions, cancel: CancellationToken) -> JoinHandle<()> {
    tokio::spawn(async move {
        let f = functions;
        let mut next_sweep = Instant::now() + f.lease() + f.every;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(f.every) => {}
                _ = cancel.cancelled() => return,
            }
            if let Err(e) = f.record().await {
                tracing::debug!(error = %e, "could not record this node's function libraries; retrying");
            }
            if Instant::now() >= next_sweep {
                match f.sweep().await {
                    Ok(gone) if !gone.is_empty() => {
                        tracing::info!(deleted = gone.len(), "deleted the function libraries no live node uses")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "could not delete unused function libraries; retrying later"),
                }
                next_sweep = Instant::now() + 4 * f.lease();
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::reply::testing::{check, check_with_extra};

    #[test]
    fn the_calls_match_their_headers() {
        let names = vec!["tasks_claim_0123456789abcdef".to_string(), "x_0000000000000000".into()];
        let record = Record {
            lease: Duration::from_secs(15),
            names: &names,
        };
        check_with_extra(&record, include_str!("../lua/functions_record.lua"), 2);
        check(&Ended { max: 10 }, include_str!("../lua/functions_ended.lua"));
        check_with_extra(
            &Forget { names: &names },
            include_str!("../lua/functions_forget.lua"),
            2,
        );
    }

    #[test]
    fn only_names_shaped_like_libraries_are_deleted() {
        assert!(is_library_name("tasks_claim_0123456789abcdef"));
        assert!(is_library_name("epoch_ffffffffffffffff"));
        for bad in [
            "mylib",
            "tasks_claim_0123456789ABCDEF",
            "tasks_claim_0123456789abcde",
            "_0123456789abcdef",
            "a b_0123456789abcdef",
        ] {
            assert!(!is_library_name(bad), "{bad}");
        }
    }
}
