//! A position in a namespace's event streams: one stream per shard, and the
//! last id read in each (`docs/sharding.md`).
//!
//! Written as it travels: one stream id (`1732600000000-3`) for a namespace
//! of one shard, as always; otherwise one id per shard in shard order,
//! joined by commas (`1732600000000-3,1732600000120-0,…`). A single id is
//! also read as that id in every shard, so `since=0` replays everything and
//! `since=<ms>` resumes every shard at a Redis time, whatever the split.

use super::StreamId;

/// The last id read in each shard (shards past the end: nothing read).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cursor(Vec<StreamId>);

impl Cursor {
    /// Every one of `shards` shards at `id`.
    pub fn at(shards: usize, id: StreamId) -> Cursor {
        Cursor(vec![id; shards.max(1)])
    }

    /// From ids in shard order.
    pub fn from_ids(ids: Vec<StreamId>) -> Cursor {
        Cursor(ids)
    }

    /// Parses a cursor of a namespace of `shards` shards: one id (then every
    /// shard at it), or exactly one per shard.
    pub fn parse(s: &str, shards: usize) -> Option<Cursor> {
        let parts: Vec<&str> = s.split(',').collect();
        let ids = parts
            .iter()
            .map(|p| StreamId::parse(p.trim()))
            .collect::<Option<Vec<_>>>()?;
        match ids.len() {
            1 => Some(Cursor::at(shards, ids[0])),
            n if n == shards => Some(Cursor(ids)),
            _ => None,
        }
    }

    /// The last id read in `shard`.
    pub fn get(&self, shard: usize) -> StreamId {
        self.0.get(shard).copied().unwrap_or(StreamId(0, 0))
    }

    /// The ids, in shard order.
    pub fn ids(&self) -> &[StreamId] {
        &self.0
    }

    /// Whether the entry `id` of `shard` was read already.
    pub fn covers(&self, shard: usize, id: StreamId) -> bool {
        id <= self.get(shard)
    }

    /// Records that `shard` was read up to `id` (never moves back).
    pub fn advance(&mut self, shard: usize, id: StreamId) {
        if self.0.len() <= shard {
            self.0.resize(shard + 1, StreamId(0, 0));
        }
        self.0[shard] = self.0[shard].max(id);
    }

    /// Each shard at the later of the two positions.
    pub fn merge(&mut self, other: &Cursor) {
        for (shard, &id) in other.0.iter().enumerate() {
            self.advance(shard, id);
        }
    }
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, id) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{id}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_shard_is_one_stream_id() {
        let c = Cursor::parse("1732600000000-3", 1).unwrap();
        assert_eq!(c.to_string(), "1732600000000-3");
        assert_eq!(Cursor::parse("0", 1).unwrap().to_string(), "0-0");
        assert_eq!(Cursor::parse("1-0,2-0", 1), None);
    }

    #[test]
    fn several_shards_are_one_id_each_or_one_for_all() {
        let c = Cursor::parse("5-1,7-0,0-0", 3).unwrap();
        assert_eq!(c.ids(), [StreamId(5, 1), StreamId(7, 0), StreamId(0, 0)]);
        assert_eq!(c.to_string(), "5-1,7-0,0-0");
        assert_eq!(Cursor::parse("9", 3).unwrap().to_string(), "9-0,9-0,9-0");
        for bad in ["5-1,7-0", "5-1,7-0,1-1,2-2", "5-1,,0-0", "a,b,c", ""] {
            assert_eq!(Cursor::parse(bad, 3), None, "{bad}");
        }
    }

    #[test]
    fn a_cursor_only_moves_forward_per_shard() {
        let mut c = Cursor::at(2, StreamId(10, 0));
        assert!(c.covers(1, StreamId(10, 0)) && !c.covers(1, StreamId(10, 1)));
        c.advance(1, StreamId(12, 0));
        c.advance(1, StreamId(11, 0));
        c.advance(0, StreamId(3, 0));
        assert_eq!(c.to_string(), "10-0,12-0");
        c.merge(&Cursor::from_ids(vec![StreamId(20, 0), StreamId(1, 0), StreamId(4, 4)]));
        assert_eq!(c.to_string(), "20-0,12-0,4-4");
        let mut empty = Cursor::default();
        assert!(!empty.covers(3, StreamId(0, 1)));
        empty.advance(2, StreamId(1, 1));
        assert_eq!(empty.to_string(), "0-0,0-0,1-1");
    }
}
