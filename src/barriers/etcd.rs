//! The etcd-style recipes on the barrier service: Barrier (hold, lift,
//! wait on it) and DoubleBarrier (enter, leave, evict the dead).

use super::{
    Arrival, BTreeMap, BarrierError, Barriers, DoubleBarrier, EnterReply, Entered, Hold, HoldReply, Left, Store, Value,
    at, int, scripts,
};

impl Barriers {
    /// Raises the etcd-style barrier `name` for `ttl_ms`. Returns the hold and
    /// whether this call raised it.
    pub async fn hold(&self, name: &str, holder: &str, ttl_ms: u64) -> Result<(Hold, bool), BarrierError> {
        let call = scripts::Hold {
            name,
            holder,
            ttl_ms,
            me: &self.node_id,
        };
        match self.at(name).run(&self.scripts.hold, &call).await? {
            HoldReply::HeldByOther { holder } => Err(BarrierError::HeldByOther {
                barrier: name.into(),
                holder,
            }),
            HoldReply::Held {
                holder,
                held_at,
                expires_at,
                again,
            } => Ok((
                Hold {
                    barrier: name.into(),
                    held: true,
                    holder: Some(holder),
                    held_at: Some(held_at),
                    expires_at: Some(expires_at),
                },
                !again,
            )),
        }
    }

    /// Lowers the etcd-style barrier. Returns whether it was held.
    pub async fn lift(&self, name: &str, actor: &str) -> Result<bool, BarrierError> {
        let call = scripts::Lift {
            name,
            actor,
            me: &self.node_id,
        };
        Ok(self.at(name).run(&self.scripts.lift, &call).await?.0)
    }

    /// The hold of `name` as of now, and the milliseconds until it lifts
    /// itself (0 when not held).
    pub async fn hold_state(&self, name: &str) -> Result<(Hold, i64), BarrierError> {
        Ok(self.holds_named(&[name.to_string()]).await?.remove(0))
    }

    /// The holds of `names` as of now, each with the milliseconds until it
    /// lifts itself (0 when not held), in one round trip.
    async fn holds_named(&self, names: &[String]) -> Result<Vec<(Hold, i64)>, BarrierError> {
        self.store
            .by_home(names, |s, names| async move { Self::holds_in(&s, &names).await })
            .await
    }

    /// [`Barriers::holds_named`] of barriers all in the shard of `s`.
    async fn holds_in(s: &Store, names: &[String]) -> Result<Vec<(Hold, i64)>, BarrierError> {
        let mut p = redis::pipe();
        p.cmd("TIME");
        for n in names {
            let key = scripts::hold_key(s.keys(), n);
            p.cmd("HMGET")
                .arg(&key)
                .arg("holder")
                .arg("held_at")
                .cmd("PTTL")
                .arg(&key);
        }
        let rows: Vec<Value> = s.pipe("barrier_hold_get", &p).await?;
        let (secs, micros): (i64, i64) = redis::from_redis_value_ref(at(&rows, 0)).unwrap_or((0, 0));
        let now = secs * 1000 + micros / 1000;
        Ok(names
            .iter()
            .zip(rows.get(1..).unwrap_or(&[]).chunks(2))
            .map(|(name, c)| {
                let (holder, held_at): (Option<String>, Option<i64>) =
                    redis::from_redis_value_ref(at(c, 0)).unwrap_or((None, None));
                let pttl = int(at(c, 1));
                let lifts_in = if holder.is_some() { pttl.max(0) } else { 0 };
                let hold = Hold {
                    barrier: name.clone(),
                    held: holder.is_some(),
                    expires_at: holder.as_ref().map(|_| now + lifts_in),
                    holder,
                    held_at,
                };
                (hold, lifts_in)
            })
            .collect())
    }

    /// Every barrier held now (etcd-style), configured or not, by name: at
    /// most 1000 (those lifting themselves last), in two round trips (per
    /// shard, the shards at once).
    pub async fn holds(&self) -> Result<Vec<Hold>, BarrierError> {
        let reads = self.store.every_shard().map(|s| async move {
            let mut p = redis::pipe();
            p.cmd("TIME")
                .cmd("ZRANGE")
                .arg(scripts::holds_key(s.keys()))
                .arg(0)
                .arg(999)
                .arg("REV")
                .arg("WITHSCORES");
            let ((secs, micros), index): ((i64, i64), Vec<(String, f64)>) = s.pipe("barrier_holds_list", &p).await?;
            let now = secs * 1000 + micros / 1000;
            // Entries past their expiry are holds that lifted themselves.
            Ok::<Vec<(String, f64)>, BarrierError>(
                index.into_iter().filter(|(_, expires)| *expires as i64 > now).collect(),
            )
        });
        // At most 1000 in all, those lifting themselves last.
        let mut held = futures_util::future::try_join_all(reads).await?.concat();
        held.sort_by(|a, b| b.1.total_cmp(&a.1));
        held.truncate(1000);
        let mut names: Vec<String> = held.into_iter().map(|(n, _)| n).collect();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        names.sort();
        Ok(self
            .holds_named(&names)
            .await?
            .into_iter()
            .map(|(h, _)| h)
            .filter(|h| h.held)
            .collect())
    }

    /// `node` enters DoubleBarrier `name` of `count`.
    pub async fn enter(&self, name: &str, node: &str, count: u32) -> Result<Entered, BarrierError> {
        let call = scripts::Enter {
            name,
            node,
            count,
            node_ttl_ms: self.node_ttl_ms,
            idle_ttl_ms: self.cfg.idle_ttl_ms,
            me: &self.node_id,
        };
        match self.at(name).run(&self.scripts.enter, &call).await? {
            EnterReply::TooMany { state } => Err(BarrierError::TooManyEntrants {
                name: name.into(),
                count: state.count,
            }),
            EnterReply::CountMismatch { state } => Err(BarrierError::CountMismatch {
                name: name.into(),
                count: state.count,
            }),
            EnterReply::NodeNotAlive => Err(BarrierError::NodeNotAlive(node.into())),
            EnterReply::Entered { state, again } => Ok(Entered {
                entered_now: !again,
                count: state.count,
                entrants: state.entrants,
                ready_at: state.ready_at,
            }),
        }
    }

    /// `node` leaves DoubleBarrier `name`.
    pub async fn leave(&self, name: &str, node: &str) -> Result<Left, BarrierError> {
        let call = scripts::Leave {
            name,
            node,
            node_ttl_ms: self.node_ttl_ms,
            me: &self.node_id,
        };
        let reply = self.at(name).run(&self.scripts.leave, &call).await?;
        Ok(Left {
            left_now: reply.left_now,
            entrants: reply.entrants,
            cycle: (!reply.cycle.is_empty()).then_some(reply.cycle),
        })
    }

    /// One DoubleBarrier's state.
    pub async fn double_barrier(&self, name: &str) -> Result<DoubleBarrier, BarrierError> {
        Ok(self.double_barriers_named(&[name.to_string()]).await?.remove(0))
    }

    async fn double_barriers_named(&self, names: &[String]) -> Result<Vec<DoubleBarrier>, BarrierError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        self.store
            .by_home(
                names,
                |s, names| async move { Self::double_barriers_in(&s, &names).await },
            )
            .await
    }

    /// [`Barriers::double_barriers_named`] all in the shard of `s`.
    async fn double_barriers_in(s: &Store, names: &[String]) -> Result<Vec<DoubleBarrier>, BarrierError> {
        let mut p = redis::pipe();
        for n in names {
            p.cmd("HGETALL").arg(scripts::db_key(s.keys(), n));
            p.cmd("ZRANGE")
                .arg(scripts::db_in_key(s.keys(), n))
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES");
        }
        let rows: Vec<Value> = s.pipe("dbarrier_get", &p).await?;
        let mut out = Vec::with_capacity(names.len());
        for (name, c) in names.iter().zip(rows.chunks(2)) {
            let h: BTreeMap<String, String> = redis::from_redis_value_ref(at(c, 0)).unwrap_or_default();
            let members: Vec<(String, f64)> = redis::from_redis_value_ref(at(c, 1)).unwrap_or_default();
            let ready_at = h.get("ready_at").and_then(|v| v.parse().ok());
            out.push(DoubleBarrier {
                name: name.clone(),
                count: h.get("count").and_then(|v| v.parse().ok()).unwrap_or(0),
                entrants: members
                    .into_iter()
                    .map(|(node, at)| Arrival { node, at: at as i64 })
                    .collect(),
                ready: ready_at.is_some(),
                ready_at,
                cycle: h.get("cycle").cloned(),
            });
        }
        Ok(out)
    }

    /// Every DoubleBarrier with activity within `barriers.idle_ttl_ms`.
    pub async fn double_barriers(&self) -> Result<Vec<DoubleBarrier>, BarrierError> {
        let first = self
            .store
            .first_of_every_shard("dbarriers_list", scripts::db_index_key, 1000, false)
            .await?;
        let mut names: Vec<String> = first.into_iter().map(|(n, _)| n).collect();
        names.sort();
        let all = self.double_barriers_named(&names).await?;
        Ok(all.into_iter().filter(|d| !d.entrants.is_empty()).collect())
    }

    /// Evicts dead entrants of every DoubleBarrier in shard `s` (the
    /// background loop, per shard).
    pub async fn sweep_double_barriers_in(&self, s: &Store) -> Result<i64, BarrierError> {
        let call = scripts::DbSweep {
            node_ttl_ms: self.node_ttl_ms,
            idle_ttl_ms: self.cfg.idle_ttl_ms,
            me: &self.node_id,
            limit: 1000,
        };
        Ok(s.run(&self.scripts.db_sweep, &call).await?.evicted)
    }
}
