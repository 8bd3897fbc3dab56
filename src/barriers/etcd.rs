//! The etcd-style recipes on the barrier service: Barrier (hold, lift,
//! wait on it) and DoubleBarrier (enter, leave, evict the dead).

use super::*;

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
        match self.store.run(&self.scripts.hold, &call).await? {
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
        Ok(self.store.run(&self.scripts.lift, &call).await?.0)
    }

    /// The hold of `name` as of now, and the milliseconds until it lifts
    /// itself (0 when not held).
    pub async fn hold_state(&self, name: &str) -> Result<(Hold, i64), BarrierError> {
        Ok(self.holds_named(&[name.to_string()]).await?.remove(0))
    }

    /// The holds of `names` as of now, each with the milliseconds until it
    /// lifts itself (0 when not held), in one round trip.
    async fn holds_named(&self, names: &[String]) -> Result<Vec<(Hold, i64)>, BarrierError> {
        let mut p = redis::pipe();
        p.cmd("TIME");
        for n in names {
            p.cmd("HMGET")
                .arg(self.k_hold(n))
                .arg("holder")
                .arg("held_at")
                .cmd("PTTL")
                .arg(self.k_hold(n));
        }
        let rows: Vec<Value> = self.store.pipe("barrier_hold_get", &p).await?;
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
    /// most 1000 (those lifting themselves last), in two round trips.
    pub async fn holds(&self) -> Result<Vec<Hold>, BarrierError> {
        let mut p = redis::pipe();
        p.cmd("TIME")
            .cmd("ZRANGE")
            .arg(self.k_holds())
            .arg(0)
            .arg(999)
            .arg("REV")
            .arg("WITHSCORES");
        let ((secs, micros), index): ((i64, i64), Vec<(String, f64)>) =
            self.store.pipe("barrier_holds_list", &p).await?;
        let now = secs * 1000 + micros / 1000;
        // Entries past their expiry are holds that lifted themselves.
        let mut names: Vec<String> = index
            .into_iter()
            .filter(|(_, expires)| *expires as i64 > now)
            .map(|(n, _)| n)
            .collect();
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
        match self.store.run(&self.scripts.enter, &call).await? {
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
        let reply = self.store.run(&self.scripts.leave, &call).await?;
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
        let mut p = redis::pipe();
        for n in names {
            p.cmd("HGETALL").arg(self.k_db(n));
            p.cmd("ZRANGE").arg(self.k_db_in(n)).arg(0).arg(-1).arg("WITHSCORES");
        }
        let rows: Vec<Value> = self.store.pipe("dbarrier_get", &p).await?;
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
        let mut names: Vec<String> = self
            .store
            .query(
                "dbarriers_list",
                redis::cmd("ZRANGE").arg(self.k_db_index()).arg(0).arg(999),
            )
            .await?;
        names.sort();
        let all = self.double_barriers_named(&names).await?;
        Ok(all.into_iter().filter(|d| !d.entrants.is_empty()).collect())
    }

    /// Evicts dead entrants of every DoubleBarrier (the background loop).
    pub async fn sweep_double_barriers(&self) -> Result<i64, BarrierError> {
        let call = scripts::DbSweep {
            node_ttl_ms: self.node_ttl_ms,
            idle_ttl_ms: self.cfg.idle_ttl_ms,
            me: &self.node_id,
            limit: 1000,
        };
        Ok(self.store.run(&self.scripts.db_sweep, &call).await?.evicted)
    }
}
